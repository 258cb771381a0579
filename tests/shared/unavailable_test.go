package shared

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"testing"

	"github.com/mcpresume/caddy-mcp-resume/internal/demoserver"
	"github.com/mcpresume/caddy-mcp-resume/internal/mcptest"
	"github.com/mcpresume/caddy-mcp-resume/internal/testnet"
	"github.com/mcpresume/caddy-mcp-resume/tests/harness"
)

// assert503 checks a refusal: 503, Retry-After, a JSON-RPC error body.
func assert503(t *testing.T, resp *http.Response, why string) {
	t.Helper()
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	var msg struct {
		Error struct {
			Code    int
			Message string
		}
	}
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" ||
		json.Unmarshal(body, &msg) != nil || msg.Error.Message != "mcp-resume: "+why {
		t.Fatalf("got %d (Retry-After %q) %s; want 503 with Retry-After and %q", resp.StatusCode,
			resp.Header.Get("Retry-After"), body, why)
	}
}

// While NATS is unreachable, nothing is passed through untapped: new
// sessions and calls get 503 with Retry-After before they reach the
// upstream, store_up shows 0; when NATS is back, the same session goes on.
// A replica that starts while NATS is down starts anyway (Caddy serves its
// other sites) and answers 503 until it connects.
func TestNATSUnreachable(t *testing.T) {
	t.Parallel()
	dir, port := t.TempDir(), harness.FreePort(t)
	ns, err := testnet.StartNATS(dir, port)
	if err != nil {
		t.Fatal(err)
	}
	url := fmt.Sprintf("nats://127.0.0.1:%d", port)
	d := deploy(t, 1, storeNATS([]string{url}, ""), demoserver.Options{})
	a := d.replicas[0]
	base := "http://" + a.addr()
	rc := harness.NewSession(t, base, "2025-06-18")
	if evs := rc.CallToEnd(1, "count", map[string]any{"n": 2, "interval_ms": 1}); len(evs) != 3 {
		t.Fatalf("call before the outage: %d events", len(evs))
	}

	testnet.ShutdownNATS(ns)
	a.waitStoreUp(t, 0)
	refusedBefore := metric(t, a, "caddy_mcp_resume_store_refusals_total")
	assert503(t, rc.Request(http.MethodPost, mcptest.CallBody(2, "count", map[string]any{"n": 2, "interval_ms": 1}, "tok"), nil),
		"the retention store is unavailable; retry later")
	fresh := harness.NewRawClient(t, base, "2025-06-18")
	if err := fresh.Client.Initialize(t.Context()); err == nil {
		t.Fatal("initialize succeeded while the store was unreachable")
	}
	if after := metric(t, a, "caddy_mcp_resume_store_refusals_total"); after < refusedBefore+2 {
		t.Fatalf("store_refusals_total moved %v -> %v, want +2", refusedBefore, after)
	}

	ns, err = testnet.StartNATS(dir, port)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { testnet.ShutdownNATS(ns) })
	a.waitStoreUp(t, 1)
	if evs := rc.CallToEnd(3, "count", map[string]any{"n": 2, "interval_ms": 1}); len(evs) != 3 {
		t.Fatalf("call after the outage: %d events", len(evs))
	}

	// A replica started while NATS is down.
	testnet.ShutdownNATS(ns)
	b := d.start("late", storeNATS([]string{url}, ""), false)
	lateClient := harness.NewRawClient(t, "http://"+b.addr(), "2025-06-18")
	if err := lateClient.Client.Initialize(t.Context()); err == nil {
		t.Fatal("initialize succeeded on a replica not connected to its store")
	}
	ns, err = testnet.StartNATS(dir, port)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { testnet.ShutdownNATS(ns) })
	b.waitStoreUp(t, 1)
	lateClient.Initialize()
	if evs := lateClient.CallToEnd(1, "count", map[string]any{"n": 2, "interval_ms": 1}); len(evs) != 3 {
		t.Fatalf("call on the late replica: %d events", len(evs))
	}
}

// A 3-node JetStream cluster (replicas 3) loses two nodes: the replica's
// connection to the survivor stays up, but JetStream can store nothing.
// That is unavailable too: calls get 503 before they reach the upstream
// (none passes through untapped), and store_up shows 0 until the quorum is
// back, when the session goes on.
func TestQuorumLossIsUnavailable(t *testing.T) {
	t.Parallel()
	dirs := []string{t.TempDir(), t.TempDir(), t.TempDir()}
	servers, err := testnet.StartNATSCluster(dirs...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { testnet.ShutdownNATS(servers...) })
	d := deploy(t, 1, storeNATS(natsURLs(servers[0]), "replicas 3"), demoserver.Options{})
	a := d.replicas[0]
	rc := harness.NewSession(t, "http://"+a.addr(), "2025-06-18")
	if evs := rc.CallToEnd(1, "count", map[string]any{"n": 2, "interval_ms": 1}); len(evs) != 3 {
		t.Fatalf("call before: %d events", len(evs))
	}

	testnet.ShutdownNATS(servers[1], servers[2])
	a.waitStoreUp(t, 0)
	untapped := metric(t, a, "caddy_mcp_resume_untapped_total")
	assert503(t, rc.Request(http.MethodPost, mcptest.CallBody(2, "count", map[string]any{"n": 2, "interval_ms": 1}, "tok"), nil),
		"the retention store is unavailable; retry later")
	if after := metric(t, a, "caddy_mcp_resume_untapped_total"); after != untapped {
		t.Fatalf("untapped_total moved %v -> %v: a call passed through while JetStream had no quorum", untapped, after)
	}
}
