package follow

// Standalone GETs of upstreams that give nothing a reconnect can continue
// (a priming event only, events without IDs), a 404 on a standalone
// reconnect, and a DELETE racing resumes.

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/internal/mcptest"
	"github.com/mcpresume/caddy-mcp-resume/tests/harness"
)

// An upstream that answers every standalone GET with only a priming event
// (SEP-1699: an id and empty data, a fresh id each time, as the TS SDK's
// event store makes them) and then ends brought nothing for any client:
// it is an empty standalone GET as far as the fix for those goes. The
// proxy backs off and stops after maxReconnects such answers, as it does
// for a GET with no event at all. (It once counted the priming event as
// progress and asked again every 250 ms for the session's life.)
func TestPrimingOnlyStandaloneGETIsNotAskedForever(t *testing.T) {
	up := &scripted{Upstream: &mcptest.Upstream{}, get: func(w http.ResponseWriter, r *http.Request, n int) {
		sseHeaders(w)
		fmt.Fprintf(w, "id: prime-%d\ndata: \n\n", n)
	}}
	c := harness.StartCaddy(t, mcptest.ResumeRoute(harness.StartHandler(t, up), ""))
	cl := harness.NewSession(t, c.Base(), "2025-11-25")
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Second)
	defer cancel()
	resp, err := cl.Do(ctx, "GET", "", nil)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("standalone GET: %v %v", resp, err)
	}
	go func() { <-ctx.Done(); resp.Body.Close() }()
	buf := make([]byte, 4096)
	for {
		if _, err := resp.Body.Read(buf); err != nil {
			break
		}
	}
	cancel()
	time.Sleep(3 * time.Second) // the client has gone: nothing should ask
	n := up.gets.Load()
	t.Logf("%d upstream GETs in 9 s for a standalone stream that only ever primes", n)
	if n > 6 {
		t.Fatalf("%d upstream GETs for a standalone stream whose GETs bring nothing but a priming event, want at most 6 (the client's, then 5 reconnects)", n)
	}
}

// An upstream that gives no event IDs and answers every standalone GET
// with the same one event (a greeting), then ends: while a client reads
// the standalone stream the proxy reconnects without Last-Event-ID, and
// each answer is "new" (no ID, nothing to compare). Such answers count as
// attempts that brought nothing a reconnect continues, so the proxy stops
// after a few and the client's own reconnects set the pace, as through
// plain reverse_proxy. (The client once got the same event 4 times a
// second, forever.)
func TestIDlessStandaloneGreetingIsNotRepeatedForever(t *testing.T) {
	up := &scripted{Upstream: &mcptest.Upstream{}, get: func(w http.ResponseWriter, r *http.Request, n int) {
		sseHeaders(w)
		fmt.Fprintf(w, "data: %s\n\n", notice("hello"))
	}}
	c := harness.StartCaddy(t, mcptest.ResumeRoute(harness.StartHandler(t, up), ""))
	cl := harness.NewSession(t, c.Base(), "2025-06-18")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := cl.Do(ctx, "GET", "", nil)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("standalone GET: %v %v", resp, err)
	}
	go func() { <-ctx.Done(); resp.Body.Close() }()
	var body strings.Builder
	buf := make([]byte, 4096)
	for {
		k, err := resp.Body.Read(buf)
		body.Write(buf[:k])
		if err != nil {
			break
		}
	}
	hellos := strings.Count(body.String(), `"data":"hello"`)
	n := up.gets.Load()
	t.Logf("client got the greeting %d times in 5 s; %d upstream GETs", hellos, n)
	if n > 6 || hellos > 6 {
		t.Fatalf("%d upstream GETs, the client got the same greeting %d times in 5 s: the follower never stops for an ID-less upstream that sends one event per GET", n, hellos)
	}
}

// The upstream answers the proxy's reconnect of the standalone stream with
// 404 (it forgot the session). The session ends here too; a client reading
// the standalone stream sees its response end (no hang), and its next
// request gets 404.
func TestUpstream404OnStandaloneReconnectEndsTheSession(t *testing.T) {
	up := &scripted{Upstream: &mcptest.Upstream{}, get: func(w http.ResponseWriter, r *http.Request, n int) {
		if n == 1 {
			sseHeaders(w)
			fmt.Fprintf(w, "retry: 20\nid: s1\ndata: %s\n\n", notice("one"))
			return
		}
		http.Error(w, "no such session", http.StatusNotFound)
	}}
	c := harness.StartCaddy(t, mcptest.ResumeRoute(harness.StartHandler(t, up), ""))
	cl := harness.NewSession(t, c.Base(), "2025-06-18")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := cl.Do(ctx, "GET", "", nil)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("standalone GET: %v %v", resp, err)
	}
	evs := harness.ReadEvents(t, resp, 0)
	resp.Body.Close()
	if ctx.Err() != nil {
		t.Fatal("the client's standalone response hung after the upstream's 404")
	}
	if len(evs) < 1 || !strings.Contains(evs[0].Data, "one") {
		t.Fatalf("client got %+v", evs)
	}
	harness.WaitFor(t, 5*time.Second, "the session to end", func() bool { return len(c.AdminSessions(t)) == 0 })
}

// A DELETE racing resumes of a running call's stream: every resume gets an
// answer in bounded time (the rest, a gap, or 404), never a hang, and never
// a 400.
func TestDeleteRacingResumes(t *testing.T) {
	for round := 0; round < 5; round++ {
		t.Run(fmt.Sprint(round), func(t *testing.T) { deleteRacingResumes(t, round) })
	}
}

func deleteRacingResumes(t *testing.T, round int) {
	const resumers = 1
	{
		up := &scripted{Upstream: &mcptest.Upstream{Tools: map[string]mcptest.Tool{
			"long": func(w http.ResponseWriter, r *http.Request, req *mcptest.Request) {
				sseHeaders(w)
				for i := 1; i <= 3; i++ {
					fmt.Fprintf(w, "id: l%d\ndata: %s\n\n", i, notice(fmt.Sprint("tick ", i)))
				}
				w.(http.Flusher).Flush()
				<-r.Context().Done()
			}}}}
		c := harness.StartCaddy(t, mcptest.ResumeRoute(harness.StartHandler(t, up), ""))
		cl := harness.NewSession(t, c.Base(), "2025-06-18")
		resp := cl.Call(7, "long", map[string]any{})
		first := harness.ReadEvents(t, resp, 1)
		resp.Body.Close()
		lastID := first[0].ID
		type out struct {
			status int
			evs    []mcptest.Event
			err    error
		}
		done := make(chan out, 4)
		for i := 0; i < resumers; i++ {
			go func() {
				ctx, cancel := context.WithTimeout(context.Background(), 8*time.Second)
				defer cancel()
				rc := harness.NewRawClient(t, c.Base(), "2025-06-18")
				rc.SessionID = cl.SessionID
				r, err := rc.Do(ctx, "GET", "", http.Header{"Last-Event-ID": {lastID}})
				if err != nil {
					done <- out{err: err}
					return
				}
				defer r.Body.Close()
				var evs []mcptest.Event
				if r.StatusCode == 200 {
					evs = readAllEvents(ctx, r)
				}
				done <- out{status: r.StatusCode, evs: evs, err: ctx.Err()}
			}()
		}
		time.Sleep(time.Duration(round*20) * time.Millisecond) // the DELETE lands at a different point of the resumes each round
		other := harness.NewRawClient(t, c.Base(), "2025-06-18")
		other.SessionID = cl.SessionID
		if err := other.Delete(context.Background()); err != nil {
			t.Fatal(err)
		}
		for i := 0; i < resumers; i++ {
			o := <-done
			if o.err != nil {
				t.Fatalf("round %d: a resume racing DELETE: %v (status %d, events %+v)", round, o.err, o.status, o.evs)
			}
			if o.status == 400 {
				t.Fatalf("round %d: a resume racing DELETE got 400", round)
			}
			if o.status == 200 {
				// Whatever it got, a running call must end loudly.
				var gap, failed bool
				for _, ev := range o.evs {
					gap = gap || ev.Type == "gap"
					failed = failed || strings.Contains(ev.Data, `"id":7,"error"`) || strings.Contains(ev.Data, `"id":7,"result"`)
				}
				if !gap || !failed {
					t.Fatalf("round %d: a resume racing DELETE ended quietly: %+v", round, o.evs)
				}
			}
		}
	}
}

// readAllEvents reads SSE events until the response ends or ctx does.
func readAllEvents(ctx context.Context, r *http.Response) []mcptest.Event {
	var evs []mcptest.Event
	rd := mcptest.NewSSEReader(r.Body, 4096)
	for ctx.Err() == nil {
		ev, err := rd.Next()
		if err != nil {
			break
		}
		evs = append(evs, ev)
	}
	return evs
}
