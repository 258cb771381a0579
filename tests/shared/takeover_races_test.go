package shared

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/internal/mcptest"
	"github.com/mcpresume/caddy-mcp-resume/tests/harness"
)

// Takeovers (issue 22) that race something: a producer frozen, not dead;
// two or three replicas the client reaches; a DELETE; a takeover's own
// producer dying or cut off; takeover after takeover. One producer at a
// time, each event once, nothing left behind.

// The replica producing a call freezes (SIGSTOP: a VM stall, a long GC
// pause) with its upstream POST response open, the client's connection cut
// first. Its lease lapses; the client resumes on B, which takes the call
// over. The official Go SDK server allows one connection per stream and
// answers B's GET with 409 while the frozen replica's response is open:
// a conflict the proxy caused itself, not a refusal of the resume. The
// frozen replica thaws a few seconds later, finds its lease gone and
// closes its response. The upstream still has every event: the call
// should go on (every progress once, and the result), as the standalone
// stream rides out the same 409 (TestFrozenProducerReplicaIsNotA409ForTheClient).
func TestTakeoverFromAFrozenProducerRidesOutTheUpstreams409(t *testing.T) {
	t.Parallel()
	d := deployTakeover(t, 2, "")
	a, b := d.replicas[0], d.replicas[1]
	const n = 30
	ca, first := callOn(t, a, "2025-11-25", n, 300, 4) // priming, three progress notifications

	if err := syscall.Kill(a.Pid(), syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	var thawOnce sync.Once
	thaw := func() { thawOnce.Do(func() { syscall.Kill(a.Pid(), syscall.SIGCONT) }) }
	t.Cleanup(thaw)
	time.Sleep(3 * time.Second) // lease_ttl 2s: A's lease lapsed
	time.AfterFunc(3*time.Second, thaw)

	resp := resume(t, b, "2025-11-25", ca.SessionID, lastID(first))
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("resume on B: %d", resp.StatusCode)
	}
	rest := readThenClose(t, resp, 0)
	progress, result, errs := callParts(t, first, rest)
	if err := mcptest.OnceInOrder(progress, len(progress)); err != nil {
		t.Fatal(err)
	}
	if len(errs) > 0 || result != fmt.Sprintf("counted to %d", n) {
		t.Fatalf("the call taken over from a frozen replica: result %q, errors %q after %d progress notifications; "+
			"B's takeovers: resumed %v, refused %v (the upstream's 409 was the frozen replica's own open response)",
			result, errs, len(progress),
			series(t, b, `caddy_mcp_resume_takeovers_total{outcome="resumed"}`),
			series(t, b, `caddy_mcp_resume_takeovers_total{outcome="refused"}`))
	}
}

// The producing replica freezes (SIGSTOP) for two lease_ttl with its
// client connected to it, then thaws: its lease lapsed, no other replica
// was read (the client waited on its frozen connection), so the thawed
// replica must take its own call back (its fence stops the old upstream
// read, its relay's reader finds no producer): every progress once, and
// the result, with the other replica's sweeper waiting takeover_wait.
func TestFrozenProducerThawsAndTakesItsCallBack(t *testing.T) {
	t.Parallel()
	d := deployTakeover(t, 2, "")
	a := d.replicas[0]
	c := d.client("2025-11-25")
	const n = 30
	thawed := c.After(4, func() int {
		if err := syscall.Kill(a.Pid(), syscall.SIGSTOP); err != nil {
			t.Error(err)
		}
		time.Sleep(4 * time.Second)
		syscall.Kill(a.Pid(), syscall.SIGCONT)
		return 1
	})
	countThrough(t, c, n, 200, thawed)
	takenOver(t, a, true)
}

// The producer dies, its client was cut before; the client then resumes on
// B and on C at the same moment (two connections: a retry racing the
// first attempt, two tabs). Exactly one replica takes the call over (the
// lease decides), and no event reaches a client twice: the connection that
// reads to the end gets every progress notification once and the result.
func TestTakeoverRacedOnTwoReplicasHasOneProducer(t *testing.T) {
	t.Parallel()
	d := deployTakeover(t, 3, "takeover_wait 30s")
	a, b, c := d.replicas[0], d.replicas[1], d.replicas[2]
	const n = 20
	ca, first := callThenKill(t, a, "2025-11-25", n, 200, 4)
	time.Sleep(3 * time.Second)

	type got struct {
		evs []mcptest.Event
		err error
	}
	results := make([]got, 2)
	var wg sync.WaitGroup
	for i, r := range []*replica{b, c} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cl := mcptest.NewClient("http://"+r.addr(), "2025-11-25", &http.Client{Timeout: 30 * time.Second})
			cl.SessionID = ca.SessionID
			resp, err := cl.Resume(context.Background(), lastID(first))
			if err != nil {
				results[i].err = err
				return
			}
			defer resp.Body.Close()
			results[i].evs, results[i].err = mcptest.ReadEvents(resp.Body, 0, 25*time.Second)
		}()
	}
	wg.Wait()
	if tb, tc := takeoverLines(b), takeoverLines(c); tb+tc != 1 {
		t.Errorf("takeovers logged: B %d, C %d, want exactly one in all", tb, tc)
	}
	complete := 0
	for i, g := range results {
		all, result, errs := callParts(t, first, g.evs)
		if err := mcptest.OnceInOrder(all, len(all)); err != nil {
			t.Errorf("connection %d: %v", i, err)
		}
		if len(errs) > 0 {
			t.Errorf("connection %d: errors %q", i, errs)
		}
		if result != "" {
			complete++
			if err := mcptest.OnceInOrder(all, n); err != nil {
				t.Errorf("connection %d with the result: %v", i, err)
			}
		}
		t.Logf("connection %d: %d events, result %q, read error %v", i, len(g.evs), result, g.err)
	}
	if complete == 0 {
		t.Error("no connection got the result")
	}
}

// The producer dies; the client resumes on B, which takes the call over;
// the client is cut again after a few events and resumes on C while B
// produces. C relays what B stores (B's producer lives: C does not take
// over): every progress notification once, and the result.
func TestTakeoverReadOnAThirdReplica(t *testing.T) {
	t.Parallel()
	d := deployTakeover(t, 3, "")
	a, b, c := d.replicas[0], d.replicas[1], d.replicas[2]
	const n = 25
	ca, first := callThenKill(t, a, "2025-11-25", n, 200, 4)
	time.Sleep(3 * time.Second)

	mid := readThenClose(t, resume(t, b, "2025-11-25", ca.SessionID, lastID(first)), 4)
	rest := readThenClose(t, resume(t, c, "2025-11-25", ca.SessionID, lastID(mid)), 0)
	wantCounted(t, "read on C during B's takeover", n, first, mid, rest)
	if takeoverLines(b) != 1 || takeoverLines(c) != 0 {
		t.Fatalf("takeovers logged: B %d, C %d, want B 1, C 0", takeoverLines(b), takeoverLines(c))
	}
}

// The producer dies; B takes the call over for the client that resumed
// there; the session is DELETEd on C meanwhile. The client reading on B
// learns it explicitly (an error for its request, no result), and B's
// takeover stops: it asks the upstream nothing more, and holds nothing.
func TestDeleteOnAThirdReplicaEndsATakeover(t *testing.T) {
	t.Parallel()
	d := deployTakeover(t, 3, "")
	a, b, c := d.replicas[0], d.replicas[1], d.replicas[2]
	ca, first := callThenKill(t, a, "2025-11-25", 60, 200, 4)
	time.Sleep(3 * time.Second)

	resp := resume(t, b, "2025-11-25", ca.SessionID, lastID(first))
	defer resp.Body.Close()
	mid := harness.ReadEvents(t, resp, 3)
	if err := rawOn(t, c, "2025-11-25", ca.SessionID).Delete(t.Context()); err != nil {
		t.Fatal(err)
	}
	rest := harness.ReadEvents(t, resp, 0)
	_, result, errs := callEvents(t, append(mid, rest...), "2")
	if result != "" || len(errs) != 1 {
		t.Fatalf("the client reading B's takeover after a DELETE on C: result %q, errors %q, want one error", result, errs)
	}
	time.Sleep(time.Second)
	before := strings.Count(b.Logs(), `"upstream reconnect"`)
	time.Sleep(4 * time.Second)
	if after := strings.Count(b.Logs(), `"upstream reconnect"`); after != before {
		t.Errorf("B asked the upstream %d more times after the session was deleted", after-before)
	}
	ss, err := mcptest.Sessions(b.admin())
	if err != nil {
		t.Fatal(err)
	}
	for _, st := range requestStreams(ss) {
		if st.Producing {
			t.Errorf("B still produces a stream of the deleted session: %+v", st)
		}
	}
}

// A takeover's producer dies too: A is killed, B takes the call over for
// the client that resumed there, then B is killed, and the client resumes
// on C, which takes it over from B (from the upstream cursor B stored):
// every progress notification once, and the result.
func TestTakeoverOfATakeover(t *testing.T) {
	t.Parallel()
	d := deployTakeover(t, 3, "")
	a, b, c := d.replicas[0], d.replicas[1], d.replicas[2]
	const n = 30
	ca, first := callThenKill(t, a, "2025-11-25", n, 200, 4)
	time.Sleep(3 * time.Second)

	mid := readThenClose(t, resume(t, b, "2025-11-25", ca.SessionID, lastID(first)), 5)
	b.Kill()
	time.Sleep(3 * time.Second)

	rest := readThenClose(t, resume(t, c, "2025-11-25", ca.SessionID, lastID(mid)), 0)
	wantCounted(t, "the second takeover", n, first, mid, rest)
	var withData []mcptest.Event // the resumes' priming events repeat the cursor's seq
	for _, evs := range [][]mcptest.Event{first, mid, rest} {
		for _, ev := range evs {
			if ev.Data != "" {
				withData = append(withData, ev)
			}
		}
	}
	if _, err := harness.CheckIDs(withData); err != nil {
		t.Fatalf("the proxy's event IDs across two takeovers: %v", err)
	}
	takenOver(t, c, false)
}

// A takes the call of a dead replica over (here: B is killed, the client
// resumes on A), then A itself is cut off from NATS for three lease_ttl
// while its client stays connected: the takeover's producer stops itself,
// and once NATS is back A takes its own takeover back: every progress
// notification once, and the result.
func TestTakeoverCutOffFromNATSTakesItselfBack(t *testing.T) {
	t.Parallel()
	d, relay, real := deployCutOff(t)
	a, b := d.replicas[0], d.replicas[1]
	const n = 40
	cb, first := callThenKill(t, b, "2025-11-25", n, 200, 4)
	time.Sleep(3 * time.Second)

	ca := rawOn(t, a, "2025-11-25", cb.SessionID)
	ca.HTTP.Timeout = 90 * time.Second
	resp := ca.Resume(lastID(first))
	defer resp.Body.Close()
	mid := harness.ReadEvents(t, resp, 3)
	cutOffFromNATS(t, relay, real, a)
	rest, err := mcptest.ReadEvents(resp.Body, 0, 40*time.Second)
	if err != nil {
		t.Fatalf("reading the rest: %v (%d events)", err, len(rest))
	}
	wantCounted(t, "a takeover cut off, taken back", n, first, mid, rest)
	if got := takeoverLines(a); got != 2 {
		t.Errorf("A logged %d takeovers, want 2 (B's call, then its own)", got)
	}
}

// goroutines is the number of goroutines of r's process (Caddy's admin
// API serves pprof).
func goroutines(t *testing.T, r *replica) int {
	t.Helper()
	resp, err := http.Get(r.admin() + "/debug/pprof/goroutine?debug=1")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var n int
	if _, err := fmt.Fscanf(resp.Body, "goroutine profile: total %d", &n); err != nil {
		t.Fatalf("goroutine profile: %v", err)
	}
	return n
}

// Takeover after takeover (A killed mid call, restarted, killed again...),
// each call taken over by B for a client that resumed there and read it to
// its end: B's goroutines come back to where they were; a takeover leaves
// nothing running behind it.
func TestTakeoversLeaveNoGoroutineBehind(t *testing.T) {
	t.Parallel()
	d := deployTakeover(t, 2, "takeover_wait 30s")
	a, b := d.replicas[0], d.replicas[1]
	const rounds = 4
	var counts []int
	for i := range rounds {
		if i > 0 {
			if err := a.Start(); err != nil {
				t.Fatal(err)
			}
			a.waitStoreUp(t, 1)
		}
		ca, first := callThenKill(t, a, "2025-11-25", 10, 100, 3)
		time.Sleep(2500 * time.Millisecond)
		cb := rawOn(t, b, "2025-11-25", ca.SessionID)
		rest := readThenClose(t, cb.Resume(lastID(first)), 0)
		if _, result, errs := callEvents(t, rest, "2"); result != "counted to 10" || len(errs) > 0 {
			t.Fatalf("round %d: result %q, errors %q", i, result, errs)
		}
		cb.Reconnect()
		time.Sleep(3 * time.Second) // reader entries, consumers and leases settle
		counts = append(counts, goroutines(t, b))
	}
	t.Logf("B's goroutines after each takeover: %v", counts)
	if grew := counts[rounds-1] - counts[0]; grew >= 3*(rounds-1) {
		t.Fatalf("B's goroutines grew by %d over %d more takeovers: %v", grew, rounds-1, counts)
	}
}
