package shared

import (
	"fmt"
	"testing"

	"github.com/mcpresume/caddy-mcp-resume/internal/demoserver"
	"github.com/mcpresume/caddy-mcp-resume/internal/mcptest"
	"github.com/mcpresume/caddy-mcp-resume/internal/testnet"
)

// A client cut on replica A resumes on replica B and gets exactly the rest
// of its stream (from the shared store), then live events as A's tap keeps
// appending, and the result: every progress notification once, in order.
func TestResumeOnAnotherReplica(t *testing.T) {
	t.Parallel()
	ns := testnet.NATS(t)
	d := deploy(t, 2, storeNATS(natsURLs(ns), ""), demoserver.Options{})
	a, b := d.replicas[0], d.replicas[1]
	for _, version := range []string{"2025-11-25", "2025-06-18", "2025-03-26"} {
		t.Run(version, func(t *testing.T) {
			d.lb.SetTarget(a.addr())
			c := d.client(version)
			resumedOnB := metric(t, b, "caddy_mcp_resume_resumes_total")
			const n = 12
			moved := c.After(4, func() int { return d.moveTo(b) })
			if got := callCount(t, c, n, 150); got != fmt.Sprintf("counted to %d", n) {
				t.Fatalf("result %q", got)
			}
			if cut := <-moved; cut == 0 {
				t.Fatal("no connection was moved to B")
			}
			assertOnceInOrder(t, c, n)
			if after := metric(t, b, "caddy_mcp_resume_resumes_total"); after <= resumedOnB {
				t.Fatalf("replica B answered no resume (%v -> %v)", resumedOnB, after)
			}
			// B's admin API sees the session A registered.
			sessions, err := mcptest.Sessions(b.admin())
			if err != nil {
				t.Fatal(err)
			}
			if len(sessions) == 0 {
				t.Fatal("replica B's admin API shows no session")
			}
		})
	}
}
