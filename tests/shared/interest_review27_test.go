package shared

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/mcpresume/caddy-mcp-resume/internal/demoserver"
	"github.com/mcpresume/caddy-mcp-resume/internal/mcptest"
	"github.com/mcpresume/caddy-mcp-resume/internal/testnet"
	"github.com/mcpresume/caddy-mcp-resume/tests/harness"
)

// Review 27: replicas hold only the sessions they serve (interest), told
// of others' writes by core NATS notifications. These tests move a client
// between replicas that never saw its session, kill or freeze the sweeper,
// and restart NATS, on real Caddy processes.

// r27Status sends a resume with cursor on r for session sid and returns the
// status (the body is drained and closed; a 200's is read for at most a
// second).
func r27Status(t *testing.T, r *replica, sid, cursor string) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Second)
	defer cancel()
	cl := mcptest.NewClient("http://"+r.addr(), "2025-11-25", &http.Client{})
	cl.SessionID = sid
	resp, err := cl.Resume(ctx, cursor)
	if err != nil {
		t.Fatalf("resume on %s: %v", r.name, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	return resp.StatusCode, ""
}

// Non-sticky: initialize on r1, the call on r2, its first resume on r3 (which
// never saw the session), the rest on r1; then bad cursors on a replica that
// holds the session and on one that does not; then DELETE on r3, seen by
// the others.
func TestReview27NonStickyRawCallAcrossThreeReplicas(t *testing.T) {
	t.Parallel()
	d := deployTakeover(t, 3, "")
	r1, r2, r3 := d.replicas[0], d.replicas[1], d.replicas[2]
	const n = 20
	c := harness.NewSession(t, "http://"+r1.addr(), "2025-11-25")
	sid := c.SessionID
	on := func(r *replica) *harness.RawClient { return rawOn(t, r, "2025-11-25", sid) }

	resp := on(r2).Call(2, "count", map[string]any{"n": n, "interval_ms": 150})
	first := readThenClose(t, resp, 3)
	mid := readThenClose(t, on(r3).Resume(lastID(first)), 4)
	rest := readThenClose(t, on(r1).Resume(lastID(mid)), 0)
	wantCounted(t, "call on r2 read on r3 then r1", n, first, mid, rest)

	end := lastID(rest)
	parts := strings.Split(end, "-")
	epoch := parts[0]
	for _, r := range []*replica{r1, r2, r3} {
		for _, bad := range []struct{ cursor, what string }{
			{epoch + "-9-1", "a stream never opened"},
			{epoch + "-" + parts[1] + "-999", "ahead of the stream"},
			{"aaaaaaaa-1-1", "another session's epoch"},
			{"not-an-id", "not an ID"},
		} {
			if code, body := r27Status(t, r, sid, bad.cursor); code != http.StatusBadRequest {
				t.Errorf("%s: resume with %s (%s): %d %q, want 400", r.name, bad.cursor, bad.what, code, body)
			}
		}
		if code, _ := r27Status(t, r, sid, end); code != http.StatusNoContent {
			t.Errorf("%s: resume at the end: %d, want 204 (ended)", r.name, code)
		}
	}

	if err := on(r3).Delete(t.Context()); err != nil {
		t.Fatal(err)
	}
	for _, r := range []*replica{r1, r2, r3} {
		harness.WaitFor(t, 5*time.Second, "session gone from "+r.name, func() bool {
			_, ok, err := mcptest.Session(r.admin(), sid)
			return err == nil && !ok
		})
		if code, body := r27Status(t, r, sid, lastID(first)); code != http.StatusNotFound {
			t.Errorf("%s: resume after DELETE: %d %q, want 404 (the upstream's)", r.name, code, body)
		}
	}
}

// A stream begun on r2 is resumed on r3 at once, from its priming event:
// r3 already serves the session (it answered notifications/initialized,
// then a ping), so its mirror may not hold the new stream's record yet.
// Never a 400 for a cursor r2 just issued.
func TestReview27FreshStreamResumedAtOnceElsewhere(t *testing.T) {
	t.Parallel()
	d := deployTakeover(t, 3, "")
	r1, r2, r3 := d.replicas[0], d.replicas[1], d.replicas[2]
	c := harness.NewSession(t, "http://"+r1.addr(), "2025-11-25")
	sid := c.SessionID
	on := func(r *replica) *harness.RawClient { return rawOn(t, r, "2025-11-25", sid) }
	// r3 serves the session too.
	pr := on(r3).Request("POST", `{"jsonrpc":"2.0","id":1,"method":"ping"}`, nil)
	io.Copy(io.Discard, pr.Body)
	pr.Body.Close()
	for id := 2; id < 12; id++ {
		resp := on(r2).Call(id, "count", map[string]any{"n": 3, "interval_ms": 100})
		first := readThenClose(t, resp, 1) // the priming event
		r3resp := on(r3).Resume(lastID(first))
		if r3resp.StatusCode != http.StatusOK {
			b, _ := io.ReadAll(r3resp.Body)
			r3resp.Body.Close()
			t.Fatalf("request %d: resume on r3 from r2's priming event %s: %d %s", id, lastID(first), r3resp.StatusCode, b)
		}
		rest := readThenClose(t, r3resp, 0)
		p, result, errs := callEvents(t, rest, fmt.Sprint(id))
		if len(errs) > 0 || result != "counted to 3" || mcptest.OnceInOrder(p, 3) != nil {
			t.Fatalf("request %d read on r3: progress %v, result %q, errors %q", id, p, result, errs)
		}
	}
}

// Non-sticky with the SDK client: the load balancer sends each connection
// to the next of three replicas in turn (no keep-alive: every request a
// new connection), and cuts every open connection four times during the
// call: each resume lands on another replica.
func TestReview27SDKRoundRobinWithCuts(t *testing.T) {
	t.Parallel()
	d := deployTakeover(t, 3, "")
	d.lb.SetTarget(d.replicas[0].addr(), d.replicas[1].addr(), d.replicas[2].addr())
	c := d.client("2025-11-25")
	const n = 24
	done := make(chan int, 1)
	go func() {
		cut := 0
		for i := 0; i < 4; i++ {
			time.Sleep(700 * time.Millisecond)
			cut += d.lb.Cut(false)
		}
		done <- cut
	}()
	countThrough(t, c, n, 150, done)
	sid := c.Session.ID()
	if err := c.Session.Close(); err != nil {
		t.Logf("close: %v", err)
	}
	for _, r := range d.replicas {
		harness.WaitFor(t, 5*time.Second, "session gone from "+r.name, func() bool {
			_, ok, err := mcptest.Session(r.admin(), sid)
			return err == nil && !ok
		})
	}
}

// The sweeper (r1, the first replica) and the producer (r2) die at once
// (SIGKILL) while the client reads the call on r3: r3 must take the call
// over (the upstream has its events) or fail it explicitly; never silence.
func TestReview27SweeperAndProducerKilledReaderOnThird(t *testing.T) {
	t.Parallel()
	d := deployTakeover(t, 3, "")
	r1, r2, r3 := d.replicas[0], d.replicas[1], d.replicas[2]
	r27LoseSweeperAndProducer(t, d, r1, r2, r3, func(r *replica) { r.Kill() })
}

// As above, the sweeper and the producer frozen (SIGSTOP) instead, for
// the rest of the test.
func TestReview27SweeperAndProducerFrozenReaderOnThird(t *testing.T) {
	t.Parallel()
	d := deployTakeover(t, 3, "")
	r1, r2, r3 := d.replicas[0], d.replicas[1], d.replicas[2]
	r27LoseSweeperAndProducer(t, d, r1, r2, r3, func(r *replica) {
		syscall.Kill(r.Pid(), syscall.SIGSTOP)
		t.Cleanup(func() { syscall.Kill(r.Pid(), syscall.SIGCONT) })
	})
}

func r27LoseSweeperAndProducer(t *testing.T, d *deployment, sweeper, producer, reader *replica, lose func(*replica)) {
	t.Helper()
	const n = 40
	c := harness.NewSession(t, "http://"+producer.addr(), "2025-11-25")
	first := readThenClose(t, rawOn(t, producer, "2025-11-25", c.SessionID).Call(2, "count", map[string]any{"n": n, "interval_ms": 150}), 3)
	resp := rawOn(t, reader, "2025-11-25", c.SessionID).Resume(lastID(first))
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("resume on %s: %d", reader.name, resp.StatusCode)
	}
	defer resp.Body.Close()
	mid := harness.ReadEvents(t, resp, 3)
	lose(sweeper)
	lose(producer)
	start := time.Now()
	rest, err := mcptest.ReadEvents(resp.Body, 0, 40*time.Second)
	took := time.Since(start)
	progress, result, errs := callParts(t, first, mid, rest)
	t.Logf("after losing %s and %s: %d more events in %v, read error %v; result %q errors %q",
		sweeper.name, producer.name, len(rest), took, err, result, errs)
	if err := mcptest.OnceInOrder(progress, len(progress)); err != nil {
		t.Fatal(err)
	}
	if result == "" && len(errs) == 0 {
		t.Fatalf("the reader on %s got neither the result nor an error (read error %v after %v, %d progress)",
			reader.name, err, took, len(progress))
	}
	if result != "" {
		if err := mcptest.OnceInOrder(progress, n); err != nil {
			t.Fatal(err)
		}
	}
}

// Two clients resume the same stream on two replicas that never produced
// it: the older connection must end once the newer one attaches.
func TestReview27TwoReadersOnTwoReplicasOlderEnds(t *testing.T) {
	t.Parallel()
	d := deployTakeover(t, 3, "")
	r1, r2, r3 := d.replicas[0], d.replicas[1], d.replicas[2]
	c := harness.NewSession(t, "http://"+r1.addr(), "2025-11-25")
	first := readThenClose(t, c.Call(2, "count", map[string]any{"n": 60, "interval_ms": 150}), 3)
	older := rawOn(t, r2, "2025-11-25", c.SessionID).Resume(lastID(first))
	defer older.Body.Close()
	if older.StatusCode != http.StatusOK {
		t.Fatalf("older resume: %d", older.StatusCode)
	}
	mid := harness.ReadEvents(t, older, 2)
	newer := rawOn(t, r3, "2025-11-25", c.SessionID).Resume(lastID(mid))
	defer newer.Body.Close()
	if newer.StatusCode != http.StatusOK {
		t.Fatalf("newer resume: %d", newer.StatusCode)
	}
	harness.ReadEvents(t, newer, 1)
	var wg sync.WaitGroup
	wg.Add(1)
	var olderErr error
	var olderEvs []mcptest.Event
	start := time.Now()
	go func() {
		defer wg.Done()
		olderEvs, olderErr = mcptest.ReadEvents(older.Body, 0, 8*time.Second)
	}()
	wg.Wait()
	if olderErr != nil && time.Since(start) >= 8*time.Second {
		t.Fatalf("the older connection on r2 still open 8s after a newer reader attached on r3 (%d more events read)", len(olderEvs))
	}
	t.Logf("older ended after %v with %d more events (err %v)", time.Since(start), len(olderEvs), olderErr)
}

// nats-server restarts (same store directory) while a call runs on r1 and
// another on r2; the client of r1's call reads it on r3. The reader on r3
// must see the end; then a DELETE on r2 ends r3's reader of a third call.
func TestReview27NATSRestartReaderOnNonProducer(t *testing.T) {
	t.Parallel()
	r27NATSRestart(t, true)
}

func r27NATSRestart(t *testing.T, restart bool) {
	dir := t.TempDir()
	nats := r27NATS(t, dir)
	d := deploy(t, 3, storeNATS([]string{nats.url}, ""), demoserver.Options{EventStore: true})
	r1, r2, r3 := d.replicas[0], d.replicas[1], d.replicas[2]

	c1 := harness.NewSession(t, "http://"+r1.addr(), "2025-11-25")
	c2 := harness.NewSession(t, "http://"+r2.addr(), "2025-11-25")
	const n = 15
	first := readThenClose(t, c1.Call(2, "count", map[string]any{"n": n, "interval_ms": 100}), 3)
	resp2 := c2.Call(2, "count", map[string]any{"n": n, "interval_ms": 100})
	defer resp2.Body.Close()
	onR3 := rawOn(t, r3, "2025-11-25", c1.SessionID).Resume(lastID(first))
	defer onR3.Body.Close()
	if onR3.StatusCode != http.StatusOK {
		t.Fatalf("resume on r3: %d", onR3.StatusCode)
	}
	mid := harness.ReadEvents(t, onR3, 2)

	if restart {
		nats.restart(t, dir, 1500*time.Millisecond)
	}
	t0 := time.Now()
	for _, r := range d.replicas {
		r.waitStoreUp(t, 1)
	}
	t.Logf("store up again on all after %v", time.Since(t0))
	rest, rerr := mcptest.ReadEvents(onR3.Body, 0, 40*time.Second)
	t.Logf("read to the end %v after the restart", time.Since(t0))
	progress, result, errs := callParts(t, first, mid, rest)
	t.Logf("reader on r3 across the restart: %d events, result %q, errors %q, read error %v", len(rest), result, errs, rerr)
	if err := mcptest.OnceInOrder(progress, len(progress)); err != nil {
		t.Fatal(err)
	}
	if result == "" && len(errs) == 0 {
		t.Fatalf("reader on r3 saw no end of r1's call across the NATS restart (read error %v)", rerr)
	}

	// A DELETE on r2 of c1's session ends a reader of it on r3. (The Go
	// SDK upstream answers a DELETE only once the running tool call ends:
	// a short call keeps the test short.)
	resp := c1.Call(3, "count", map[string]any{"n": 20, "interval_ms": 150})
	f3 := readThenClose(t, resp, 2)
	t.Logf("call 3 on r1 begun %v after the restart", time.Since(t0))
	rd := rawOn(t, r3, "2025-11-25", c1.SessionID).Resume(lastID(f3))
	defer rd.Body.Close()
	harness.ReadEvents(t, rd, 1)
	t.Logf("call 3 read on r3 %v after the restart", time.Since(t0))
	if err := rawOn(t, r2, "2025-11-25", c1.SessionID).Delete(t.Context()); err != nil {
		t.Fatal(err)
	}
	t.Logf("DELETE on r2 answered %v after the restart", time.Since(t0))
	evs, derr := mcptest.ReadEvents(rd.Body, 0, 10*time.Second)
	t.Logf("DELETE part done %v after the restart", time.Since(t0))
	_, res3, errs3 := callEvents(t, evs, "3")
	if res3 != "" || len(errs3) == 0 {
		t.Fatalf("reader on r3 after a DELETE on r2 (after the NATS restart): result %q, errors %q, read error %v", res3, errs3, derr)
	}
}

// nats-server comes back without its data (a new store directory) while
// a call runs on r1 and the client reads it on r3: the reader on r3 must
// get an end (the result or an explicit error), never silence.
func TestReview27NATSBackWithoutDataReaderOnNonProducer(t *testing.T) {
	t.Parallel()
	nats := r27NATS(t, t.TempDir())
	d := deploy(t, 3, storeNATS([]string{nats.url}, ""), demoserver.Options{EventStore: true})
	r1, r3 := d.replicas[0], d.replicas[2]
	c1 := harness.NewSession(t, "http://"+r1.addr(), "2025-11-25")
	const n = 30
	first := readThenClose(t, c1.Call(2, "count", map[string]any{"n": n, "interval_ms": 200}), 3)
	onR3 := rawOn(t, r3, "2025-11-25", c1.SessionID).Resume(lastID(first))
	defer onR3.Body.Close()
	mid := harness.ReadEvents(t, onR3, 2)
	nats.restart(t, t.TempDir(), time.Second)
	start := time.Now()
	rest, rerr := mcptest.ReadEvents(onR3.Body, 0, 30*time.Second)
	progress, result, errs := callParts(t, first, mid, rest)
	t.Logf("reader on r3: %d events in %v, result %q, errors %q, read error %v", len(rest), time.Since(start), result, errs, rerr)
	if err := mcptest.OnceInOrder(progress, len(progress)); err != nil {
		t.Fatal(err)
	}
	if result == "" && len(errs) == 0 {
		t.Fatalf("reader on r3 got no end after NATS lost its data (read error %v)", rerr)
	}
}

// r27Server is a nats-server on a fixed port that a test restarts.
type r27Server struct {
	mu   sync.Mutex
	srv  *server.Server
	port int
	url  string
}

// r27NATS starts a nats-server storing in dir, stopped at cleanup.
func r27NATS(t *testing.T, dir string) *r27Server {
	t.Helper()
	n := &r27Server{port: harness.FreePort(t)}
	srv, err := testnet.StartNATS(dir, n.port)
	if err != nil {
		t.Fatal(err)
	}
	n.srv, n.url = srv, fmt.Sprintf("nats://127.0.0.1:%d", n.port)
	t.Cleanup(func() { n.mu.Lock(); testnet.ShutdownNATS(n.srv); n.mu.Unlock() })
	return n
}

// restart stops the server, waits down, and starts it again on the same
// port storing in dir (its old directory: the data kept; a new one: lost).
func (n *r27Server) restart(t *testing.T, dir string, down time.Duration) {
	t.Helper()
	n.mu.Lock()
	defer n.mu.Unlock()
	testnet.ShutdownNATS(n.srv)
	time.Sleep(down)
	srv, err := testnet.StartNATS(dir, n.port)
	if err != nil {
		t.Fatal(err)
	}
	n.srv = srv
}
