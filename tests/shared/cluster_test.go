package shared

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/nats-io/nats-server/v2/server"

	"github.com/mcpresume/caddy-mcp-resume/internal/demoserver"
	"github.com/mcpresume/caddy-mcp-resume/internal/mcptest"
	"github.com/mcpresume/caddy-mcp-resume/tests/harness"
)

// replica is one Caddy process of the deployment.
type replica struct {
	*mcptest.Process
	name string
}

func (r *replica) addr() string {
	return fmt.Sprintf("127.0.0.1:%d", r.Config.Sites[0].Port)
}

func (r *replica) admin() string { return fmt.Sprintf("http://localhost:%d", r.Config.AdminPort) }

// deployment is N Caddy replicas with the shared store, a load balancer
// in front of them (a TCP relay whose target the test moves) and the
// demo MCP server behind them.
type deployment struct {
	t        *testing.T
	replicas []*replica
	lb       *mcptest.Relay
	upstream string
}

// storeNATS is the store block for JetStream servers at urls.
func storeNATS(urls []string, extra string) string {
	return fmt.Sprintf("store nats {\n url %s\n lease_ttl 2s\n drain_timeout 15s\n %s\n}", strings.Join(urls, " "), extra)
}

// deploy starts n replicas whose mcp_resume block holds store (e.g.
// storeNATS(...)), and a load balancer sending to the first.
func deploy(t *testing.T, n int, store string, upstreamOpts demoserver.Options) *deployment {
	t.Helper()
	return deployTo(t, n, store, harness.StartDemo(t, upstreamOpts))
}

// deployTo is deploy in front of the MCP server at upstream (host:port).
func deployTo(t *testing.T, n int, store, upstream string) *deployment {
	t.Helper()
	d := &deployment{t: t, upstream: upstream}
	for i := 0; i < n; i++ {
		d.replicas = append(d.replicas, d.start(fmt.Sprintf("r%d", i+1), store, true))
	}
	lb, err := mcptest.NewRelay(d.replicas[0].addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lb.Close() })
	d.lb = lb
	return d
}

// start starts a replica; connected waits until its store is connected.
func (d *deployment) start(name, store string, connected bool) *replica {
	t := d.t
	t.Helper()
	cfg := mcptest.Config{AdminPort: harness.CaddyPort(t), HTTPPort: harness.CaddyPort(t), HTTPSPort: harness.CaddyPort(t),
		Grace: "30s", LogLevel: "INFO",
		Sites: []mcptest.Site{{Port: harness.CaddyPort(t), Body: mcptest.ResumeRoute(d.upstream, store)}}}
	p, err := mcptest.StartProcess(caddyBin, t.TempDir(), cfg)
	if err != nil {
		t.Fatalf("replica %s: %v", name, err)
	}
	r := &replica{Process: p, name: name}
	t.Cleanup(func() {
		if !r.Exited() {
			r.Kill()
		}
		if strings.Contains(r.Logs(), "DATA RACE") {
			t.Errorf("replica %s: the race detector found a data race", name)
		}
		if t.Failed() {
			t.Logf("replica %s logs:\n%s", name, r.Logs())
		}
	})
	if connected { // the store connects once Caddy has started
		r.waitStoreUp(t, 1)
	}
	return r
}

// waitStoreUp waits until the replica's store_up gauge is up.
func (r *replica) waitStoreUp(t *testing.T, up float64) {
	t.Helper()
	harness.WaitFor(t, 30*time.Second, fmt.Sprintf("replica %s store_up %v", r.name, up), func() bool {
		m, err := mcptest.ScrapeMetrics(r.admin() + "/metrics")
		if err != nil {
			return false
		}
		v, ok := m.Sum("caddy_mcp_resume_store_up")
		return ok && v == up
	})
}

// client connects an SDK client through the load balancer.
func (d *deployment) client(version string) *mcptest.SDKClient {
	d.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// No keep-alive: the load balancer is L4, so a POST sent on an idle
	// connection just as the replica behind it stops fails with EOF, and
	// HTTP clients do not retry a POST (see the README's drain notes).
	ct := mcptest.NewCuttableTransport(0)
	ct.DisableKeepAlives = true
	c, err := mcptest.ConnectSDKWith(ctx, "http://"+d.lb.Addr()+"/mcp", version, 12, ct)
	if err != nil {
		d.t.Fatalf("connect: %v", err)
	}
	d.t.Cleanup(func() { c.Session.Close() })
	return c
}

// moveTo sends the load balancer's new connections to r and cuts the open
// ones: every client reconnects, to r.
func (d *deployment) moveTo(r *replica) int {
	d.lb.SetTarget(r.addr())
	return d.lb.Cut(false)
}

// natsURLs are the client URLs of servers.
func natsURLs(servers ...*server.Server) []string {
	var urls []string
	for _, s := range servers {
		urls = append(urls, s.ClientURL())
	}
	return urls
}

func callCount(t *testing.T, c *mcptest.SDKClient, n, intervalMS int) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	res, err := c.Session.CallTool(ctx, mcptest.CountParams(n, intervalMS))
	if err != nil {
		t.Fatalf("call: %v", err)
	}
	return mcptest.ResultText(res)
}

func assertOnceInOrder(t *testing.T, c *mcptest.SDKClient, n int) {
	t.Helper()
	if err := mcptest.OnceInOrder(c.ProgressAfterCall(n), n); err != nil {
		t.Fatal(err)
	}
}

// metric is the sum of a metric's series on replica r.
func metric(t *testing.T, r *replica, name string) float64 {
	t.Helper()
	m, err := mcptest.ScrapeMetrics(r.admin() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	v, _ := m.Sum(name)
	return v
}

// notify has the upstream send n notices on c's standalone stream, one every
// interval.
func notify(t *testing.T, c *mcptest.SDKClient, n int, interval time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	args := map[string]any{"n": n, "interval_ms": interval.Milliseconds()}
	if _, err := c.Session.CallTool(ctx, &mcp.CallToolParams{Name: "notify", Arguments: args}); err != nil {
		t.Fatal(err)
	}
}

// assertNotices checks that got is notices 1, 2, 3, ... of n, none skipped
// or repeated.
func assertNotices(t *testing.T, got []string, n int) {
	t.Helper()
	for i, s := range got {
		if want := fmt.Sprintf("notice %d of %d", i+1, n); s != want {
			t.Fatalf("notice #%d = %q, want %q (around: %q)", i+1, s, want, got[max(i-3, 0):min(i+3, len(got))])
		}
	}
}
