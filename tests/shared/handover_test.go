package shared

import (
	"strings"
	"testing"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/internal/demoserver"
	"github.com/mcpresume/caddy-mcp-resume/internal/mcptest"
	"github.com/mcpresume/caddy-mcp-resume/internal/testnet"
	"github.com/mcpresume/caddy-mcp-resume/tests/harness"
)

// The replica producing the standalone stream is cut off from NATS (not
// from the upstream) while its client moves to the other replica. It
// cannot renew its lease, so it closes its upstream GET at 2/3 of
// lease_ttl, before the lease lapses; only then does the other replica
// take the stream over and open its GET. The official Go SDK server (with
// an event store) behind an upstream that answers 409 to a second GET of
// a session never sees two, and the client gets every notice once, in
// order. (The cut-off replica once read on: the other one's GETs got 409,
// swallowed and asked again, and the client lost the stream.)
func TestStandaloneProducerCutOffFromNATSClosesItsGETFirst(t *testing.T) {
	t.Parallel()
	ns := testnet.NATS(t)
	real := strings.TrimPrefix(ns.ClientURL(), "nats://")
	toNATS, err := mcptest.NewRelay(real) // replica A's way to NATS
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { toNATS.Close() })
	up := &mcptest.OneGET{Next: demoserver.New(demoserver.Options{EventStore: true})}
	d := &deployment{t: t, upstream: harness.StartHandler(t, up)}
	a := d.start("r1", storeNATS([]string{"nats://" + toNATS.Addr()}, ""), true)
	b := d.start("r2", storeNATS(natsURLs(ns), ""), true)
	d.replicas = []*replica{a, b}
	lb, err := mcptest.NewRelay(a.addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lb.Close() })
	d.lb = lb

	c := d.client("2025-11-25")
	sid := c.Session.ID()
	harness.WaitFor(t, 10*time.Second, "the standalone GET to be open on A", func() bool { return up.Open(sid) == 1 })
	const n = 60
	notify(t, c, n, 100*time.Millisecond)
	mcptest.Eventually(10*time.Second, 10*time.Millisecond, func() bool { return len(c.NoticesSeen()) >= 10 })
	toNATS.SetTarget("127.0.0.1:1")
	if toNATS.Cut(true) == 0 {
		t.Fatal("the relay cut no NATS connection of A")
	}
	d.moveTo(b)
	if !mcptest.Eventually(40*time.Second, 50*time.Millisecond, func() bool { return len(c.NoticesSeen()) >= n }) {
		t.Logf("only %d notices of %d", len(c.NoticesSeen()), n)
	}
	time.Sleep(time.Second) // anything repeated would have come by now
	got := c.NoticesSeen()
	gets, lags := up.Counts()
	t.Logf("%d notices; %d upstream GETs, %d answered 409 %v", len(got), gets, len(lags), lags)
	if len(lags) != 0 {
		t.Errorf("%d upstream GETs came while another GET of the session was open", len(lags))
	}
	assertNotices(t, got, n)
	if len(got) != n {
		t.Fatalf("%d notices, want %d", len(got), n)
	}
}
