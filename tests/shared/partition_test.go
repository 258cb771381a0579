package shared

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/internal/demoserver"
	"github.com/mcpresume/caddy-mcp-resume/internal/mcptest"
	"github.com/mcpresume/caddy-mcp-resume/internal/testnet"
)

// NATS is out of reach (a partition: the server keeps running) for three
// lease_ttl periods, far less than stall_timeout, while a tool call runs
// and its client stays connected: the call's events wait in its batch,
// then the upstream read waits (backpressure); when NATS is back the call
// ends with its result and every progress notification once.
func TestPartitionLongerThanLeaseTTL(t *testing.T) {
	t.Parallel()
	a := callAcrossAPartition(t, demoserver.Options{})
	if early := metric(t, a, "caddy_mcp_resume_events_evicted_before_ack_total"); early != 0 {
		t.Errorf("events_evicted_before_ack_total = %v", early)
	}
}

// callAcrossAPartition runs a call of 40 progress notifications (200 ms
// apart) on the only replica, whose NATS connections a relay cuts after
// the fourth and keeps cut for three lease_ttl, its client connected
// throughout; it checks the result and every notification once, in order,
// and returns the replica.
func callAcrossAPartition(t *testing.T, upstream demoserver.Options) *replica {
	t.Helper()
	ns := testnet.NATS(t)
	relay, real := natsRelay(t, ns)
	d := deploy(t, 1, storeNATS([]string{"nats://" + relay.Addr()}, ""), upstream)
	a := d.replicas[0]
	c := d.client("2025-11-25")
	const n = 40
	done := c.After(4, func() int {
		relay.SetTarget("127.0.0.1:1")
		cut := relay.Cut(true)
		a.waitStoreUp(t, 0)
		time.Sleep(6 * time.Second) // 3 x lease_ttl (2s)
		relay.SetTarget(real)
		return cut
	})
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	res, err := c.Session.CallTool(ctx, mcptest.CountParams(n, 200))
	if cut := <-done; cut == 0 {
		t.Fatal("the relay cut no NATS connection")
	}
	if err != nil {
		t.Fatalf("call across the partition: %v", err)
	}
	if got := mcptest.ResultText(res); got != fmt.Sprintf("counted to %d", n) {
		t.Fatalf("result %q", got)
	}
	assertOnceInOrder(t, c, n)
	return a
}
