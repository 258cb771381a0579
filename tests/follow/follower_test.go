package follow

// Upstreams the follower once mishandled: IDs that repeat or restart, a
// standalone GET answered empty, a retry: that overflowed, and a session
// that ends under a running call. Each runs through a real Caddy in front
// of an upstream on plain net/http.

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/internal/mcptest"
	"github.com/mcpresume/caddy-mcp-resume/tests/harness"
)

// scripted is an upstream whose tools and standalone GETs a test scripts;
// everything else is mcptest.Upstream's.
type scripted struct {
	*mcptest.Upstream
	get  func(w http.ResponseWriter, r *http.Request, n int) // the n-th GET (from 1)
	gets atomic.Int64
	mu   sync.Mutex
	at   []time.Time // when each GET came
}

func (s *scripted) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method == http.MethodGet && s.get != nil {
		n := int(s.gets.Add(1))
		s.mu.Lock()
		s.at = append(s.at, time.Now())
		s.mu.Unlock()
		s.get(w, r, n)
		return
	}
	s.Upstream.ServeHTTP(w, r)
}

func (s *scripted) getTimes() []time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]time.Time(nil), s.at...)
}

func sseHeaders(w http.ResponseWriter) {
	w.Header().Set("Content-Type", "text/event-stream")
	w.WriteHeader(http.StatusOK)
}

func notice(text string) string {
	return fmt.Sprintf(`{"jsonrpc":"2.0","method":"notifications/message","params":{"level":"info","data":%q}}`, text)
}

func resultFor(id []byte) string {
	return fmt.Sprintf(`{"jsonrpc":"2.0","id":%s,"result":{"content":[]}}`, id)
}

// An upstream that uses one event ID twice within one POST response (it
// breaks the spec's uniqueness rule) gets both events delivered, as plain
// reverse_proxy would: only a replay after the proxy's own reconnect can
// repeat an event. The proxy once dropped the second, the result, and the
// client got -32010 for a result the upstream did send.
func TestAnIDRepeatedWithinAResponseLosesNothing(t *testing.T) {
	up := &scripted{Upstream: &mcptest.Upstream{Tools: map[string]mcptest.Tool{
		"dup": func(w http.ResponseWriter, r *http.Request, req *mcptest.Request) {
			sseHeaders(w)
			fmt.Fprintf(w, "id: 1\ndata: %s\n\nid: 1\ndata: %s\n\n", notice("progress"), resultFor(req.ID))
		}}}}
	c := harness.StartCaddy(t, mcptest.ResumeRoute(harness.StartHandler(t, up), ""))
	cl := harness.NewSession(t, c.Base(), "2025-06-18")
	evs := cl.CallToEnd(1, "dup", map[string]any{})
	if len(evs) != 2 || !strings.Contains(evs[0].Data, "progress") || !strings.Contains(evs[1].Data, `"id":1,"result"`) {
		t.Fatalf("client got %+v, want the notice and the result", evs)
	}
	if n := up.gets.Load(); n != 0 {
		t.Fatalf("the proxy sent %d GETs for a call that was answered", n)
	}
}

// An upstream without an event store whose IDs restart on each connection
// (id: 1, 2 on every standalone GET): each reconnected GET brings new
// events under IDs the proxy took before, and the client gets every one.
// The proxy once dropped every event of each reconnected GET. A replay
// that repeats an event (same ID, same content) is still taken once.
func TestStandaloneIDsThatRestartOnEachConnection(t *testing.T) {
	up := &scripted{Upstream: &mcptest.Upstream{}}
	up.get = func(w http.ResponseWriter, r *http.Request, n int) {
		sseHeaders(w)
		if n == 2 {
			// A replay that repeats the last event taken before its own.
			fmt.Fprintf(w, "id: 2\ndata: %s\n\n", notice("conn 1 event 2"))
		}
		fmt.Fprintf(w, "retry: 50\nid: 1\ndata: %s\n\nid: 2\ndata: %s\n\n",
			notice(fmt.Sprintf("conn %d event 1", n)), notice(fmt.Sprintf("conn %d event 2", n)))
		if n >= 3 {
			w.(http.Flusher).Flush()
			<-r.Context().Done() // the third stays open
		}
	}
	c := harness.StartCaddy(t, mcptest.ResumeRoute(harness.StartHandler(t, up), ""))
	cl := harness.NewSession(t, c.Base(), "2025-06-18")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	resp, err := cl.Do(ctx, "GET", "", nil)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("standalone GET: %v %v", resp, err)
	}
	defer resp.Body.Close()
	evs := harness.ReadEvents(t, resp, 6)
	for i, ev := range evs {
		if want := fmt.Sprintf("conn %d event %d", i/2+1, i%2+1); !strings.Contains(ev.Data, want) {
			t.Fatalf("event %d is %q, want %q (all: %+v)", i, ev.Data, want, evs)
		}
	}
	if n := up.gets.Load(); n != 3 {
		t.Fatalf("%d upstream GETs, want 3", n)
	}
}

// An upstream that answers the standalone GET with an empty 200 event
// stream at once (a server without GET streams that sends an empty body
// instead of 405): each such answer is an attempt that brought nothing, so
// the proxy backs off and stops after maxReconnects of them, saying so, and
// the client's response ends cleanly. It once asked again 4 times a second
// for as long as the session lived.
func TestEmptyStandaloneGETIsNotAskedForever(t *testing.T) {
	up := &scripted{Upstream: &mcptest.Upstream{}, get: func(w http.ResponseWriter, r *http.Request, n int) { sseHeaders(w) }}
	c := harness.StartCaddy(t, mcptest.ResumeRoute(harness.StartHandler(t, up), ""))
	exhausted := func() float64 {
		return metric(t, c, `caddy_mcp_resume_upstream_reconnects_total{outcome="exhausted"}`)
	}
	before := exhausted()
	cl := harness.NewSession(t, c.Base(), "2025-06-18")
	began := time.Now()
	resp := cl.Request("GET", "", nil)
	if resp.StatusCode != 200 {
		t.Fatalf("standalone GET: %d", resp.StatusCode)
	}
	evs := harness.ReadEvents(t, resp, 0) // to its end
	resp.Body.Close()
	ended := time.Since(began)
	time.Sleep(1500 * time.Millisecond) // nothing more asks
	n := up.gets.Load()
	t.Logf("client's response ended after %v with %d events; %d upstream GETs", ended, len(evs), n)
	if n != 6 { // the client's, then 5 reconnects
		t.Fatalf("%d upstream GETs for one empty standalone stream, want 6", n)
	}
	if at := up.getTimes(); at[5].Sub(at[0]) < 3*time.Second {
		t.Fatalf("6 GETs within %v: no backoff", at[5].Sub(at[0]))
	}
	if len(evs) != 0 {
		t.Fatalf("client got %+v", evs)
	}
	if exhausted() != before+1 {
		t.Fatal("upstream_reconnects_total{exhausted} did not move")
	}
}

// retry: 18446744073710 (ms) once multiplied into a Duration that wrapped
// around to 0.45 ms: the reconnects fired at once and the call failed, when
// the upstream asked for the longest wait. It is capped at 10 s.
func TestAHugeRetryIsTheLongestWait(t *testing.T) {
	closed := make(chan time.Time, 1)
	up := &scripted{Upstream: &mcptest.Upstream{Tools: map[string]mcptest.Tool{
		"poll": func(w http.ResponseWriter, r *http.Request, req *mcptest.Request) {
			sseHeaders(w)
			fmt.Fprintf(w, "id: p1\ndata: %s\n\nretry: 18446744073710\n\n", notice("working"))
			closed <- time.Now()
		}}}}
	up.get = func(w http.ResponseWriter, r *http.Request, n int) {
		if n == 1 {
			sseHeaders(w)
			fmt.Fprintf(w, "id: p2\ndata: %s\n\n", resultFor([]byte("1")))
			return
		}
		http.Error(w, "gone", http.StatusServiceUnavailable)
	}
	c := harness.StartCaddy(t, mcptest.ResumeRoute(harness.StartHandler(t, up), ""))
	cl := harness.NewSession(t, c.Base(), "2025-06-18")
	evs := cl.CallToEnd(1, "poll", map[string]any{})
	if len(evs) != 2 || !strings.Contains(evs[1].Data, `"id":1,"result"`) {
		t.Fatalf("client got %+v", evs)
	}
	at := up.getTimes()
	if len(at) != 1 {
		t.Fatalf("%d reconnects", len(at))
	}
	if d := at[0].Sub(<-closed); d < 9*time.Second || d > 12*time.Second {
		t.Fatalf("reconnected %v after the upstream's close, want the 10 s cap", d)
	}
}

// A session that ends under a running call fails the call loudly: the
// connected client gets the gap (reason deleted) and -32010 for its
// request, never a clean end with nothing. Once by the client's own DELETE
// (from another connection), once by the upstream's 404 to the proxy's
// reconnect.
func TestSessionEndFailsTheRunningCall(t *testing.T) {
	for _, how := range []string{"DELETE", "upstream 404"} {
		t.Run(how, func(t *testing.T) {
			up := &scripted{Upstream: &mcptest.Upstream{Tools: map[string]mcptest.Tool{
				"long": func(w http.ResponseWriter, r *http.Request, req *mcptest.Request) {
					sseHeaders(w)
					fmt.Fprintf(w, "id: l1\ndata: %s\n\n", notice("started"))
					if how == "DELETE" {
						w.(http.Flusher).Flush()
						<-r.Context().Done()
						return
					}
					fmt.Fprint(w, "retry: 20\n\n") // close early: the proxy reconnects
				}}}}
			up.get = func(w http.ResponseWriter, r *http.Request, n int) {
				http.Error(w, "no such session", http.StatusNotFound)
			}
			c := harness.StartCaddy(t, mcptest.ResumeRoute(harness.StartHandler(t, up), ""))
			cl := harness.NewSession(t, c.Base(), "2025-06-18")
			resp := cl.Call(7, "long", map[string]any{})
			defer resp.Body.Close()
			first := harness.ReadEvents(t, resp, 1)
			if how == "DELETE" {
				other := harness.NewRawClient(t, c.Base(), "2025-06-18")
				other.SessionID = cl.SessionID
				if err := other.Delete(context.Background()); err != nil {
					t.Fatal(err)
				}
			}
			rest := harness.ReadEvents(t, resp, 0)
			evs := append(first, rest...)
			if len(evs) != 3 || evs[1].Type != "gap" || !strings.Contains(evs[1].Data, `"reason":"deleted"`) ||
				!strings.Contains(evs[2].Data, `"id":7,"error":{"code":-32010`) {
				t.Fatalf("client got %+v, want the notice, a gap (deleted) and -32010", evs)
			}
			if sessions := c.AdminSessions(t); len(sessions) != 0 {
				t.Fatalf("sessions held: %+v", sessions)
			}
		})
	}
}
