package shared

import (
	"context"
	"fmt"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/internal/demoserver"
	"github.com/mcpresume/caddy-mcp-resume/internal/mcptest"
	"github.com/mcpresume/caddy-mcp-resume/internal/testnet"
)

// restart stops r with SIGTERM (it drains), waits for it to exit, and
// starts it again with the same config and data directory.
func (d *deployment) restart(r *replica) {
	d.t.Helper()
	if !r.Terminate(45 * time.Second) {
		d.t.Fatalf("replica %s did not exit within 45s of SIGTERM", r.name)
	}
	if err := r.Start(); err != nil {
		d.t.Fatalf("restart %s: %v", r.name, err)
	}
	r.waitStoreUp(d.t, 1)
}

// The only replica, with the embedded JetStream store in its data
// directory, is restarted mid tool call while its client is away: the
// stopping Caddy drains (keeps reading the call into the store), the new
// one finds it there, and the client's resume gets every progress
// notification once and the result.
func TestRestartOfTheOnlyReplica(t *testing.T) {
	t.Parallel()
	d := deploy(t, 1, "store nats {\n embedded\n drain_timeout 15s\n}", demoserver.Options{})
	a := d.replicas[0]
	c := d.client("2025-11-25")
	const n = 12
	restarted := c.After(4, func() int {
		cut := d.lb.Cut(false)
		d.restart(a)
		return cut
	})
	if got := callCount(t, c, n, 200); got != fmt.Sprintf("counted to %d", n) {
		t.Fatalf("result %q", got)
	}
	if cut := <-restarted; cut == 0 {
		t.Fatal("the client's connection was not cut")
	}
	assertOnceInOrder(t, c, n)
	if !strings.Contains(a.Logs(), `"drained"`) {
		t.Fatal("the stopping replica did not log that it drained")
	}
}

// A rolling restart of two replicas while 20 tool calls run, as an
// orchestrator does it: each replica in turn is taken out of the load
// balancer (no new connections; open ones stay), stopped with SIGTERM (it
// drains: the calls it reads go on into the store, their clients still
// connected), and started again. Meanwhile every client's own connection is
// cut once mid-call, so calls resume on whichever replica the load balancer
// picks, reading what the other one is still appending. No call loses its
// result or a notification.
func TestRollingRestartLosesNoResult(t *testing.T) {
	t.Parallel()
	ns := testnet.NATS(t)
	d := deploy(t, 2, storeNATS(natsURLs(ns), ""), demoserver.Options{})
	a, b := d.replicas[0], d.replicas[1]
	d.lb.SetTarget(a.addr(), b.addr())
	const calls, n = 20, 15
	var wg sync.WaitGroup
	errs := make(chan error, calls)
	for i := 0; i < calls; i++ {
		c := d.client("2025-11-25")
		c.CutAfter(3+i%7, i%2 == 0)
		wg.Add(1)
		go func() {
			defer wg.Done()
			time.Sleep(time.Duration(i) * 150 * time.Millisecond) // staggered: calls run through both restarts
			ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
			defer cancel()
			res, err := c.Session.CallTool(ctx, mcptest.CountParams(n, 100))
			switch {
			case err != nil:
				errs <- fmt.Errorf("call %d: %v", i, err)
			case mcptest.ResultText(res) != fmt.Sprintf("counted to %d", n):
				errs <- fmt.Errorf("call %d: result %q", i, mcptest.ResultText(res))
			default:
				if err := mcptest.OnceInOrder(c.ProgressAfterCall(n), n); err != nil {
					errs <- fmt.Errorf("call %d: %v", i, err)
				}
			}
		}()
	}
	time.Sleep(700 * time.Millisecond)
	for _, pair := range [][2]*replica{{a, b}, {b, a}} {
		stop, stay := pair[0], pair[1]
		d.lb.SetTarget(stay.addr())
		d.restart(stop)
		d.lb.SetTarget(a.addr(), b.addr())
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	for _, r := range d.replicas {
		if early := metric(t, r, "caddy_mcp_resume_events_evicted_before_ack_total"); early != 0 {
			t.Errorf("replica %s: events_evicted_before_ack_total = %v", r.name, early)
		}
		if !strings.Contains(r.Logs(), `"drained"`) {
			t.Errorf("replica %s did not drain when stopped", r.name)
		}
	}
	// The first restart comes while the first calls run (the second may
	// find every call ended), and it drained them.
	if !regexp.MustCompile(`"draining[^\n]*"upstream_reads":[1-9]`).MatchString(a.Logs()) {
		t.Errorf("replica %s was stopped with no call in flight, or did not drain them", a.name)
	}
}

// SIGKILL of the replica producing a call: the events it stored stay
// resumable on the other replica, and once the dead producer's lease lapses
// the call ends with the documented explicit failure (a gap and a JSON-RPC
// error for the request), never silence.
func TestKillOfTheProducingReplica(t *testing.T) {
	t.Parallel()
	ns := testnet.NATS(t)
	d := deploy(t, 2, storeNATS(natsURLs(ns), ""), demoserver.Options{})
	a, b := d.replicas[0], d.replicas[1]
	c := d.client("2025-11-25")
	killed := c.After(4, func() int {
		a.Kill()
		return d.moveTo(b)
	})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	start := time.Now()
	_, err := c.Session.CallTool(ctx, mcptest.CountParams(40, 100))
	<-killed
	if err == nil || !strings.Contains(err.Error(), "lost (upstream_failed)") {
		t.Fatalf("call after its producer was killed: err = %v, want the explicit failure (lost (upstream_failed))", err)
	}
	if took := time.Since(start); took > 30*time.Second {
		t.Fatalf("the failure took %v", took)
	}
	got := c.ProgressSeen()
	if len(got) < 4 {
		t.Fatalf("progress before the kill was lost: %v", got)
	}
	if err := mcptest.OnceInOrder(got, len(got)); err != nil {
		t.Fatal(err)
	}
	if gaps := metric(t, b, `caddy_mcp_resume_streams_failed_total`); gaps == 0 {
		t.Log("note: the failure was recorded by the sweeping replica")
	}
}

// A 3-node JetStream cluster (replicas 3) loses a node mid-stream, and the
// client is moved to another Caddy replica meanwhile: nothing is lost.
func TestClusterLosesANode(t *testing.T) {
	t.Parallel()
	servers := testnet.NATSCluster(t, 3)
	d := deploy(t, 2, storeNATS(natsURLs(servers...), "replicas 3"), demoserver.Options{})
	c := d.client("2025-11-25")
	const n = 20
	c.After(4, func() int { testnet.ShutdownNATS(servers[0]); return 0 })
	moved := c.After(8, func() int { return d.moveTo(d.replicas[1]) })
	if got := callCount(t, c, n, 150); got != fmt.Sprintf("counted to %d", n) {
		t.Fatalf("result %q", got)
	}
	if cut := <-moved; cut == 0 {
		t.Fatal("no connection was moved")
	}
	assertOnceInOrder(t, c, n)
}
