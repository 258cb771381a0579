package shared

import (
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/internal/demoserver"
	"github.com/mcpresume/caddy-mcp-resume/internal/mcptest"
	"github.com/mcpresume/caddy-mcp-resume/internal/testnet"
	"github.com/mcpresume/caddy-mcp-resume/tests/harness"
)

// Takeovers (issue 22) and what the upstream does or has: it forgot the
// session, it serves another endpoint, its replay repeats events, the
// stream is a batch, the call is silent so far, the client repeats its
// POST, the producer is drained or cut off from NATS.

// swappable is an upstream that can be replaced while it runs: an upstream
// restart that forgets its sessions.
type swappable struct {
	mu sync.Mutex
	h  http.Handler
}

func (s *swappable) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	h := s.h
	s.mu.Unlock()
	h.ServeHTTP(w, r)
}

func (s *swappable) swap(h http.Handler) {
	s.mu.Lock()
	s.h = h
	s.mu.Unlock()
}

// The producer dies and the upstream restarts (it forgets the session and
// its events) before the client comes back on B: B's takeover GET gets the
// upstream's 404. The client must get the explicit failure at once (an
// error for its request), never silence, and no progress twice.
func TestTakeoverAfterTheUpstreamForgotTheSession(t *testing.T) {
	t.Parallel()
	ns := testnet.NATS(t)
	up := &swappable{h: demoserver.New(demoserver.Options{EventStore: true})}
	d := &deployment{t: t, upstream: harness.StartHandler(t, up)}
	store := storeNATS(natsURLs(ns), "")
	a, b := d.start("r1", store, true), d.start("r2", store, true)
	ca, first := callThenKill(t, a, "2025-11-25", 40, 200, 4)
	up.swap(demoserver.New(demoserver.Options{EventStore: true}))
	time.Sleep(3 * time.Second)

	start := time.Now()
	resp := resume(t, b, "2025-11-25", ca.SessionID, lastID(first))
	rest := readThenClose(t, resp, 0)
	progress, result, errs := callParts(t, first, rest)
	if result != "" || len(errs) != 1 {
		t.Fatalf("a takeover the upstream answered 404: status %d, result %q, errors %q after %v, want one error",
			resp.StatusCode, result, errs, time.Since(start))
	}
	if err := mcptest.OnceInOrder(progress, len(progress)); err != nil {
		t.Fatal(err)
	}
}

// The producer dies; the client resumes on B at another path under the
// route (/mcp/, which the route /mcp* sends to the proxy: the proxy answers
// a resume from its log whatever the path). B's takeover GET must go to
// the endpoint the session began on, as the credential check's ping does
// (README: "never the request's own path ... another endpoint's answer
// says nothing of the session"): another endpoint's 404 is no verdict on
// the session, yet it ends the call and deletes the session everywhere.
func TestTakeoverAsksTheEndpointTheSessionBeganOn(t *testing.T) {
	t.Parallel()
	d := deployTakeover(t, 2, "")
	a, b := d.replicas[0], d.replicas[1]
	const n = 20
	ca, first := callThenKill(t, a, "2025-11-25", n, 200, 4)
	time.Sleep(3 * time.Second)

	cb := rawOn(t, b, "2025-11-25", ca.SessionID)
	cb.URL += "/" // another path under the route
	resp := cb.Resume(lastID(first))
	rest := readThenClose(t, resp, 0)
	progress, result, errs := callParts(t, first, rest)
	if len(errs) > 0 || result != fmt.Sprintf("counted to %d", n) {
		ss, _ := mcptest.Sessions(b.admin())
		t.Fatalf("a resume at %s of a session begun at /mcp: status %d, result %q, errors %q; sessions on B now: %d",
			strings.TrimPrefix(cb.URL, "http://"+b.addr()), resp.StatusCode, result, errs, len(ss))
	}
	if err := mcptest.OnceInOrder(progress, n); err != nil {
		t.Fatal(err)
	}
}

// resendsBefore wraps an upstream so that its replay resends the last
// events before the Last-Event-ID it was given, and that event itself
// (README: "some resend that event itself or a few before it"): the Go SDK
// server behind it is asked from k events earlier.
func resendsBefore(k int) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if id := r.Header.Get("Last-Event-ID"); r.Method == http.MethodGet && id != "" {
				if i := strings.LastIndexByte(id, '_'); i >= 0 { // the standalone stream's are "_<n>"
					var n int
					if _, err := fmt.Sscan(id[i+1:], &n); err == nil {
						r.Header.Set("Last-Event-ID", fmt.Sprintf("%s_%d", id[:i], max(n-k, 0)))
					}
				}
			}
			next.ServeHTTP(w, r)
		})
	}
}

// The producer dies; its upstream's replay resends the event at the
// cursor and one before it (same IDs, same content). The repeat filter
// drops such repeats on the proxy's own reconnects; the takeover's replay
// must not reach the client twice either (issue 22: "each event once:
// repeats from the upstream's replay dropped"; DESIGN.md, Takeover).
func TestTakeoverDropsWhatTheUpstreamsReplayRepeats(t *testing.T) {
	t.Parallel()
	ns := testnet.NATS(t)
	d := upstreamBehind(t, resendsBefore(2))
	store := storeNATS(natsURLs(ns), "")
	a, b := d.start("r1", store, true), d.start("r2", store, true)
	const n = 20
	ca, first := callThenKill(t, a, "2025-11-25", n, 200, 5) // priming, four progress notifications
	time.Sleep(3 * time.Second)

	rest := readThenClose(t, resume(t, b, "2025-11-25", ca.SessionID, lastID(first)), 0)
	p1, _, _ := callEvents(t, first, "2")
	p2, result, errs := callEvents(t, rest, "2")
	if len(errs) > 0 || result != fmt.Sprintf("counted to %d", n) {
		t.Fatalf("result %q, errors %q", result, errs)
	}
	if err := mcptest.OnceInOrder(append(p1, p2...), n); err != nil {
		t.Fatalf("progress before the kill %v, after the takeover %v: %v", p1, p2, err)
	}
}

// The control for the test above: the same upstream, whose stream the
// proxy resumes itself (the call's stream closed by the server, SSE
// polling): the repeat filter drops what the replay resends.
func TestReconnectDropsWhatTheUpstreamsReplayRepeats(t *testing.T) {
	t.Parallel()
	d := upstreamBehind(t, resendsBefore(2))
	ns := testnet.NATS(t)
	a := d.start("r1", storeNATS(natsURLs(ns), ""), true)
	const n = 12
	ca := harness.NewSession(t, "http://"+a.addr(), "2025-11-25")
	evs := ca.CallToEnd(2, "count", map[string]any{"n": n, "interval_ms": 100, "close_after": 5})
	wantCounted(t, "the call the proxy resumed itself", n, evs)
}

// NATS is out of reach for three lease_ttl (a NATS restart, a network
// blip) while a call runs whose client is away (cut before, it comes back
// later for the result). With an upstream without event IDs the producer
// reads on and stores the rest once NATS is back
// (TestPartitionLongerThanLeaseTTL). With an upstream that keeps its
// events, the producer stops itself at 2/3 of lease_ttl so that another
// replica could take over; none can (no client reads), and when NATS is
// back no one takes the call back either, so after takeover_wait it is
// failed, though the live replica had it and the upstream still has every
// event. The upstream that keeps its events must not fare worse: the
// client coming back after takeover_wait gets the rest and the result.
func TestNATSOutageDoesNotFailACallWhoseClientIsAway(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name       string
		eventStore bool
	}{{"upstream without event IDs", false}, {"upstream with an event store", true}} {
		t.Run(tc.name, func(t *testing.T) {
			ns := testnet.NATS(t)
			relay, real := natsRelay(t, ns)
			d := deploy(t, 1, storeNATS([]string{"nats://" + relay.Addr()}, "takeover_wait 3s"), demoserver.Options{EventStore: tc.eventStore})
			a := d.replicas[0]
			const n = 30
			ca, first := callOn(t, a, "2025-11-25", n, 200, 4) // the client is away
			cutOffFromNATS(t, relay, real, a)
			a.waitStoreUp(t, 1)
			time.Sleep(5 * time.Second) // past takeover_wait; the upstream has finished the call

			rest := readThenClose(t, ca.Resume(lastID(first)), 0)
			wantCounted(t, "the client back after a NATS outage", n, first, rest)
		})
	}
}

// A JSON-RPC batch (2025-03-26) of two calls on one stream: the shorter is
// answered, then the producer dies. B's takeover waits for the other one
// only, and the client gets each call's progress once and each result
// once: the one answered before the kill is not answered again (nor failed).
func TestTakeoverOfABatchWithOneRequestAnswered(t *testing.T) {
	t.Parallel()
	d := deployTakeover(t, 2, "")
	a, b := d.replicas[0], d.replicas[1]
	ca := harness.NewSession(t, "http://"+a.addr(), "2025-03-26")
	body := "[" + mcptest.CallBody(2, "count", map[string]any{"n": 3, "interval_ms": 100}, "short") + "," +
		mcptest.CallBody(3, "count", map[string]any{"n": 20, "interval_ms": 200}, "long") + "]"
	resp := ca.Request("POST", body, nil)
	if resp.StatusCode != http.StatusOK || mcptest.MediaType(resp.Header) != "text/event-stream" {
		x := harness.MustFinish(t, resp, nil)
		t.Skipf("the upstream does not stream a batch: %s", x)
	}
	// Read until the short call's result, and two more events.
	var first []mcptest.Event
	for answered, after := false, 0; after < 2; {
		evs := harness.ReadEvents(t, resp, 1)
		first = append(first, evs...)
		if m, err := mcptest.DecodeMessage(evs[0].Data); err == nil && string(m.ID) == "2" {
			answered = true
		} else if answered {
			after++
		}
	}
	resp.Body.Close()
	a.Kill()
	time.Sleep(3 * time.Second)

	rest := readThenClose(t, resume(t, b, "2025-03-26", ca.SessionID, lastID(first)), 0)
	progress := map[string][]float64{}
	answers := map[string]int{}
	for _, ev := range append(first, rest...) {
		if ev.Data == "" || ev.Type == "gap" {
			continue
		}
		m, err := mcptest.DecodeMessage(ev.Data)
		if err != nil {
			t.Fatalf("event %s: %v", ev.ID, err)
		}
		switch {
		case m.Method == "notifications/progress":
			tok := fmt.Sprint(m.Params.ProgressToken)
			progress[tok] = append(progress[tok], m.Params.Progress)
		case len(m.ID) > 0:
			answers[string(m.ID)]++
			if m.Error != nil {
				t.Errorf("request %s: error %s", m.ID, m.Error.Message)
			}
		}
	}
	if answers["2"] != 1 || answers["3"] != 1 {
		t.Errorf("answers by request id: %v, want each once", answers)
	}
	for tok, n := range map[string]int{"short": 3, "long": 20} {
		if err := mcptest.OnceInOrder(progress[tok], n); err != nil {
			t.Errorf("progress of %s: %v", tok, err)
		}
	}
	takenOver(t, b, false)
}

// The producer dies; the client, whose POST's response broke, sends the
// same POST again on B (same id and body: an HTTP client's or an
// application's retry), which the proxy answers from the retained stream
// instead of running the tool twice (README, Repeated requests). That
// reader finds the producer gone like a resume's does: the call must be
// taken over for it, not left to wait in silence until takeover_wait ends
// it with the failure.
func TestTakeoverForARepeatedPOST(t *testing.T) {
	t.Parallel()
	d := deployTakeover(t, 2, "takeover_wait 5s")
	a, b := d.replicas[0], d.replicas[1]
	const n = 20
	ca, _ := callThenKill(t, a, "2025-11-25", n, 200, 4)
	time.Sleep(3 * time.Second)

	cb := rawOn(t, b, "2025-11-25", ca.SessionID)
	start := time.Now()
	evs := readThenClose(t, cb.Call(2, "count", map[string]any{"n": n, "interval_ms": 200}), 0) // the same request again
	p, result, errs := callEvents(t, evs, "2")
	if len(errs) > 0 || result != fmt.Sprintf("counted to %d", n) {
		t.Fatalf("the repeated POST on B after %v: result %q, errors %q after %d progress notifications; B logged %d takeovers, %d repeats served",
			time.Since(start).Round(100*time.Millisecond), result, errs, len(p), takeoverLines(b),
			strings.Count(b.Logs(), "repeated request answered from the retained stream"))
	}
	if err := mcptest.OnceInOrder(p, n); err != nil {
		t.Fatal(err)
	}
	if v := series(t, b, "caddy_mcp_resume_repeated_requests_total"); v != 1 {
		t.Errorf("repeated_requests_total on B = %v, want 1: the repeat was not answered from the stream", v)
	}
	takenOver(t, b, false)
	noEarlyEviction(t, b)
}

// A long tool call that sends nothing for a while (no progress yet: a
// computation, a slow backend): the upstream's only event so far is its
// priming event (2025-11-25: an ID, no data), which is the cursor a resume
// needs (Last-Event-ID: that ID replays all that follows). The producer
// dies in that silence; B must take the call over from that cursor, not
// fail it at lease_ttl as if the upstream had no event IDs.
func TestTakeoverBeforeTheFirstEventFromThePrimingCursor(t *testing.T) {
	t.Parallel()
	d := deployTakeover(t, 2, "")
	a, b := d.replicas[0], d.replicas[1]
	const n = 3
	ca, first := callOn(t, a, "2025-11-25", n, 5000, 1) // the proxy's priming event
	// The call is silent for 3 s (the upstream's priming event reached A
	// at once): past the second after which A records the cursor no event
	// carried, with room for a loaded machine.
	time.Sleep(3 * time.Second)
	a.Kill()
	time.Sleep(3 * time.Second)

	cb := rawOn(t, b, "2025-11-25", ca.SessionID)
	cb.HTTP.Timeout = 60 * time.Second
	resp := cb.Resume(first[0].ID)
	rest, err := mcptest.ReadEvents(resp.Body, 0, 40*time.Second)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	p, result, errs := callEvents(t, rest, "2")
	if len(errs) > 0 || result != fmt.Sprintf("counted to %d", n) {
		t.Fatalf("a call whose producer died before its first event: result %q, errors %q; B logged %d takeovers",
			result, errs, takeoverLines(b))
	}
	if err := mcptest.OnceInOrder(p, n); err != nil {
		t.Fatal(err)
	}
}

// A rolling restart: the replica producing a call is stopped (SIGTERM)
// with a drain_timeout shorter than the call; its client is cut by the
// drain and resumes on the other replica, which takes the call over once
// the draining replica hands it over (its lease released, the stream left
// live): every progress notification once, and the result.
func TestTakeoverInARollingRestart(t *testing.T) {
	t.Parallel()
	ns := testnet.NATS(t)
	store := fmt.Sprintf("store nats {\n url %s\n lease_ttl 2s\n drain_timeout 1s\n}", ns.ClientURL())
	d := deploy(t, 2, store, demoserver.Options{EventStore: true})
	a, b := d.replicas[0], d.replicas[1]
	c := d.client("2025-11-25")
	const n = 30
	stopped := c.After(5, func() int {
		d.lb.SetTarget(b.addr())
		if !a.Terminate(30 * time.Second) {
			t.Error("A did not stop")
		}
		return 1
	})
	countThrough(t, c, n, 200, stopped)
	takenOver(t, b, false)
}
