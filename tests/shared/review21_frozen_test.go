package shared

// review21: attacks on the standalone producer handover across replicas
// (this one from tests/shared/review21_test.go of branch review21).

import (
	"context"
	"io"
	"net/http"
	"syscall"
	"testing"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/internal/demoserver"
	"github.com/mcpresume/caddy-mcp-resume/internal/mcptest"
	"github.com/mcpresume/caddy-mcp-resume/internal/testnet"
	"github.com/mcpresume/caddy-mcp-resume/tests/harness"
)

// The replica producing a session's standalone stream freezes (SIGSTOP:
// a VM stall, a debugger, a long GC pause) with its upstream GET open:
// its lease lapses, but it cannot close the GET, and its TCP connection
// to the upstream stays up. The client moves to the other replica, which
// takes the stream over once the lease lapsed and opens its own GET. An
// upstream that allows one GET per session (the official SDK servers)
// answers 409, because of the proxy's own frozen GET, not of anything the
// client did. The design says never 409 for a second connection to the
// same stream; the client should get a 200 stream (the proxy riding out
// its own conflict until the frozen GET goes), not a 409 that makes SDK
// clients give up their standalone stream for the rest of the session.
func TestFrozenProducerReplicaIsNotA409ForTheClient(t *testing.T) {
	ns := testnet.NATS(t)
	up := &mcptest.OneGET{Next: demoserver.New(demoserver.Options{EventStore: true})}
	d := &deployment{t: t, upstream: harness.StartHandler(t, up)}
	a := d.start("r1", storeNATS(natsURLs(ns), ""), true)
	b := d.start("r2", storeNATS(natsURLs(ns), ""), true)
	d.replicas = []*replica{a, b}

	cl := harness.NewSession(t, "http://"+a.addr(), "2025-11-25")
	resp := cl.Request("GET", "", nil)
	cursor := harness.ReadEvents(t, resp, 1)[0].ID // the priming event
	resp.Body.Close()
	harness.WaitFor(t, 10*time.Second, "A's upstream GET to be open", func() bool { return up.Open(cl.SessionID) == 1 })

	if err := syscall.Kill(a.Pid(), syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	thawed := false
	thaw := func() {
		if !thawed {
			thawed = true
			syscall.Kill(a.Pid(), syscall.SIGCONT)
		}
	}
	t.Cleanup(thaw)
	time.Sleep(3 * time.Second) // lease_ttl 2s: A's lease lapsed

	onB := *cl.Client
	onB.URL = "http://" + b.addr() + "/mcp"
	ctx, cancel := context.WithTimeout(t.Context(), 25*time.Second)
	defer cancel()
	r, err := onB.Resume(ctx, cursor)
	if err != nil {
		t.Fatalf("resume on B: %v", err)
	}
	defer r.Body.Close()
	status := r.StatusCode
	var body []byte
	if status != http.StatusOK {
		body, _ = io.ReadAll(r.Body)
	}
	gets, lags := up.Counts()
	thaw()
	t.Logf("resume on B: %d %q; upstream saw %d GETs (%d 409 lags measured so far: a lag counts once the other GET ended)", status, body, gets, len(lags))
	if status != http.StatusOK {
		t.Fatalf("the client's resume on B got %d %q: a 409 the proxy caused itself (its frozen replica's GET is still open at the upstream), want a 200 stream", status, body)
	}
}
