package shared

import (
	"context"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/internal/demoserver"
	"github.com/mcpresume/caddy-mcp-resume/internal/mcptest"
	"github.com/mcpresume/caddy-mcp-resume/internal/testnet"
	"github.com/mcpresume/caddy-mcp-resume/tests/harness"
)

// The sequel of TestFrozenProducerReplicaIsNotA409ForTheClient: the client
// resumed on B got its 200 while A, frozen past its lease, still held the
// session's upstream GET open. Once A runs again it finds its lease gone and
// closes that GET; B, asking again meanwhile, then opens its own, and what
// the upstream sends next reaches the client on the stream it already has.
func TestFrozenProducerThawsAndTheStandaloneStreamGoesOn(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	f := freezeTheProducer(t, ctx)
	up, b, cl, onB, r, thaw := f.up, f.b, f.cl, f.onB, f.resp, f.thaw
	defer r.Body.Close()
	if r.StatusCode != http.StatusOK {
		t.Fatalf("resume on B: %d, want 200", r.StatusCode)
	}
	time.Sleep(time.Second) // B asks again meanwhile
	thaw()
	harness.WaitFor(t, 15*time.Second, "B's upstream GET to open once A closed its own", func() bool {
		return strings.Contains(b.Logs(), "upstream opened the standalone GET after the previous producer's GET closed")
	})
	if n := up.Open(cl.SessionID); n != 1 {
		t.Fatalf("%d upstream GETs of the session open, want 1 (B's)", n)
	}

	call, err := onB.Call(ctx, 2, "notify", map[string]any{"n": 1, "interval_ms": 0}, "")
	if err != nil {
		t.Fatal(err)
	}
	call.Body.Close()
	got := false
	stop := context.AfterFunc(ctx, func() { r.Body.Close() })
	defer stop()
	harness.StreamEvents(r.Body, func(ev mcptest.Event) bool {
		got = strings.Contains(ev.Data, "notifications/message")
		return !got
	})
	if !got {
		t.Fatalf("the client's stream on B carried no notice after A thawed")
	}
	for _, l := range []string{"upstream answered 409 after the standalone stream was taken from a lapsed lease"} {
		if !strings.Contains(b.Logs(), l) {
			t.Errorf("B's log lacks %q", l)
		}
	}
	if strings.Contains(b.Logs(), "stopped asking") {
		t.Errorf("B gave up asking")
	}
}

// frozenProducer is a standalone stream whose producer replica (A) is
// frozen (SIGSTOP) past its lease with the session's upstream GET open,
// and the client's resume of it on B.
type frozenProducer struct {
	up   *mcptest.OneGET
	a, b *replica
	cl   *harness.RawClient
	onB  mcptest.Client // the client, talking to B
	resp *http.Response // its resume on B
	thaw func()         // SIGCONT to A (once; also at cleanup)
}

// freezeTheProducer opens the session's standalone stream on A, freezes A
// once its upstream GET is open, waits past lease_ttl, and resumes the
// stream on B within ctx.
func freezeTheProducer(t *testing.T, ctx context.Context) frozenProducer {
	t.Helper()
	ns := testnet.NATS(t)
	f := frozenProducer{up: &mcptest.OneGET{Next: demoserver.New(demoserver.Options{EventStore: true})}}
	d := &deployment{t: t, upstream: harness.StartHandler(t, f.up)}
	f.a = d.start("r1", storeNATS(natsURLs(ns), ""), true)
	f.b = d.start("r2", storeNATS(natsURLs(ns), ""), true)
	d.replicas = []*replica{f.a, f.b}

	f.cl = harness.NewSession(t, "http://"+f.a.addr(), "2025-11-25")
	resp := f.cl.Request("GET", "", nil)
	cursor := harness.ReadEvents(t, resp, 1)[0].ID // the priming event
	resp.Body.Close()
	harness.WaitFor(t, 10*time.Second, "A's upstream GET to be open", func() bool { return f.up.Open(f.cl.SessionID) == 1 })

	if err := syscall.Kill(f.a.Pid(), syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	thawed := false
	f.thaw = func() {
		if !thawed {
			thawed = true
			syscall.Kill(f.a.Pid(), syscall.SIGCONT)
		}
	}
	t.Cleanup(f.thaw)
	time.Sleep(3 * time.Second) // lease_ttl 2s: A's lease lapsed

	f.onB = *f.cl.Client
	f.onB.URL = "http://" + f.b.addr() + "/mcp"
	r, err := f.onB.Resume(ctx, cursor)
	if err != nil {
		t.Fatalf("resume on B: %v", err)
	}
	f.resp = r
	return f
}
