package shared

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/internal/demoserver"
	"github.com/mcpresume/caddy-mcp-resume/internal/mcptest"
	"github.com/mcpresume/caddy-mcp-resume/internal/testnet"
	"github.com/mcpresume/caddy-mcp-resume/tests/harness"
)

// A client that retries its POST (same id and body) instead of resuming
// with Last-Event-ID, after the replica producing its call died: the other
// replica answers the repeat from the retained stream, finds its producer
// gone and takes the upstream read over, as for a resume: every progress
// notification once, and the result.
func TestTakeoverWhenTheClientRepeatsItsPOST(t *testing.T) {
	ns := testnet.NATS(t)
	d := deploy(t, 2, storeNATS(natsURLs(ns), "takeover_wait 30s"), demoserver.Options{EventStore: true})
	a, b := d.replicas[0], d.replicas[1]
	const n = 20
	args := map[string]any{"n": n, "interval_ms": 200}
	ca := harness.NewSession(t, "http://"+a.addr(), "2025-06-18")
	resp := ca.Call(2, "count", args)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("call: %d", resp.StatusCode)
	}
	harness.ReadEvents(t, resp, 4)
	resp.Body.Close()
	a.Kill()
	time.Sleep(3 * 2 * time.Second) // three lease_ttl: the lease lapsed long ago, no client reads

	cb := harness.NewRawClient(t, "http://"+b.addr(), "2025-06-18")
	cb.SessionID = ca.SessionID
	resp = cb.Call(2, "count", args)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("the repeated POST on B: %d", resp.StatusCode)
	}
	evs := harness.ReadEvents(t, resp, 0)
	resp.Body.Close()
	progress, result, errs := callEvents(t, evs, "2")
	if len(errs) > 0 {
		t.Fatalf("the repeated call failed: %q", errs)
	}
	if result != fmt.Sprintf("counted to %d", n) {
		t.Fatalf("result %q after the repeat (%d events)", result, len(evs))
	}
	if err := mcptest.OnceInOrder(progress, n); err != nil {
		t.Fatal(err)
	}
	if v := series(t, b, "caddy_mcp_resume_repeated_requests_total"); v != 1 {
		t.Errorf("repeated_requests_total on B = %v, want 1: the repeat was not answered from the stream", v)
	}
	takenOver(t, b, false)
	noEarlyEviction(t, b)
}
