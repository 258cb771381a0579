package shared

import (
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/internal/demoserver"
	"github.com/mcpresume/caddy-mcp-resume/internal/mcptest"
	"github.com/mcpresume/caddy-mcp-resume/internal/testnet"
	"github.com/mcpresume/caddy-mcp-resume/tests/harness"
)

// The standalone stream's upstream read is paused by backpressure (its log
// holds a window's worth of delivered notifications) when its replica is
// stopped: the drain ends standalone reads at once. The event being
// appended must not be lost: the upstream cursor the next replica resumes
// from is the last event the store took, not the last one the tap read
// (found by review: notice 52 of 120 went missing, silently).
func TestDrainKeepsTheStandaloneEventBeingAppended(t *testing.T) {
	t.Parallel()
	ns := testnet.NATS(t)
	store := storeNATS(natsURLs(ns), "") + "\nmax_stream_bytes 8KiB\nmax_event_bytes 2KiB"
	d := deploy(t, 2, store, demoserver.Options{EventStore: true})
	a, b := d.replicas[0], d.replicas[1]
	c := d.client("2025-11-25")
	time.Sleep(300 * time.Millisecond) // the client's standalone GET is open on A
	const n = 120
	notify(t, c, n, 20*time.Millisecond)
	time.Sleep(3 * time.Second) // the log is full of delivered notices: A's upstream read waits for room
	seenOnA := len(c.NoticesSeen())
	if seenOnA >= n {
		t.Fatalf("the standalone log never filled (%d notices)", seenOnA)
	}
	d.lb.SetTarget(b.addr())
	if !a.Terminate(45 * time.Second) {
		t.Fatal("A did not stop")
	}
	mcptest.Eventually(10*time.Second, 50*time.Millisecond, func() bool { return len(c.NoticesSeen()) >= n })
	time.Sleep(500 * time.Millisecond)
	got := c.NoticesSeen()
	t.Logf("%d notices on A before the stop, %d in all (the rest waits for the window: backpressure)", seenOnA, len(got))
	// What arrived must be notices 1, 2, 3, ... with none skipped.
	assertNotices(t, got, n)
}

// A client's standalone GET is waiting for the upstream's answer on B when
// B is stopped: the drain ends the upstream GET it opened for the client.
// What reverse_proxy makes of that cancellation (499, a status with no
// text) is no answer for the client: the Go SDK takes a non-2xx answer to
// a reconnect of its standalone stream for a broken session ("standalone
// SSE stream: " and nothing after: the rare failure of
// TestRollingRestartLosesNoResult). The client gets its stream, which the
// drain ends as it ends the open ones: it reconnects to the replica that
// stays, and its session goes on.
func TestDrainOfAStandaloneGETWaitingForTheUpstream(t *testing.T) {
	t.Parallel()
	ns := testnet.NATS(t)
	gate := &getGate{next: demoserver.New(demoserver.Options{}), held: make(chan struct{}, 1), gets: make(chan struct{}, 100)}
	mux := http.NewServeMux()
	mux.Handle("/mcp", gate)
	d := deployTo(t, 2, storeNATS(natsURLs(ns), ""), harness.StartHandler(t, mux))
	a, b := d.replicas[0], d.replicas[1]
	c := d.client("2025-11-25")
	gate.waitGET(t, "the client's standalone GET on A")
	// A is stopped: its drain ends the client's standalone stream, and the
	// client's next GET goes to B, whose upstream GET the gate holds.
	gate.armed.Store(true)
	d.lb.SetTarget(b.addr())
	d.restart(a)
	select {
	case <-gate.held:
	case <-time.After(30 * time.Second):
		t.Fatal("the client's standalone GET never reached the upstream through B")
	}
	// B is stopped while that GET waits for the upstream's answer. A GET
	// that passed before is not the reconnect this waits for.
	for len(gate.gets) > 0 {
		<-gate.gets
	}
	d.lb.SetTarget(a.addr())
	ended := make(chan error, 1)
	go func() { ended <- c.Session.Wait() }()
	stopped := make(chan bool, 1)
	go func() { stopped <- b.Terminate(45 * time.Second) }()
	select {
	case <-gate.gets: // the client's next GET, through A
	case err := <-ended:
		t.Fatalf("the client's session broke when B drained: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("the client never opened its standalone stream again")
	}
	if !<-stopped {
		t.Fatal("B did not stop")
	}
	if !strings.Contains(b.Logs(), `"drained"`) {
		t.Fatal("B did not drain")
	}
	if got := callCount(t, c, 3, 50); got != "counted to 3" {
		t.Fatalf("result %q", got)
	}
}

// getGate is an MCP server's front door that, once armed, holds the next
// GET until its request ends (the proxy cancels it), and tells of every
// other GET as it passes it on.
type getGate struct {
	next  http.Handler
	armed atomic.Bool
	held  chan struct{} // a token once the armed GET is held
	gets  chan struct{} // a token per GET passed on
}

func (g *getGate) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method == http.MethodGet {
		if g.armed.CompareAndSwap(true, false) {
			g.held <- struct{}{}
			<-r.Context().Done()
			return
		}
		select {
		case g.gets <- struct{}{}:
		default:
		}
	}
	g.next.ServeHTTP(w, r)
}

func (g *getGate) waitGET(t *testing.T, what string) {
	t.Helper()
	select {
	case <-g.gets:
	case <-time.After(30 * time.Second):
		t.Fatalf("%s never reached the upstream", what)
	}
}
