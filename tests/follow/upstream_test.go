package follow

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcpresume/caddy-mcp-resume/internal/demoserver"
	"github.com/mcpresume/caddy-mcp-resume/internal/mcptest"
	"github.com/mcpresume/caddy-mcp-resume/tests/harness"
)

// The proxy follows the upstream: an upstream that closes a call's stream
// on purpose (2025-11-25 SSE polling, here the official Go SDK's
// CloseSSEStream with its event store) is resumed by the proxy with its own
// Last-Event-ID, whatever the client does meanwhile. The Go SDK client gets
// every progress notification once, in order, and the result, also when its
// own connection is cut before or after the upstream's close.
func TestFollowsAnUpstreamThatClosesItsStreams(t *testing.T) {
	upstream := harness.StartDemo(t, demoserver.Options{EventStore: true})
	c := harness.StartCaddy(t, mcptest.ResumeRoute(upstream, ""))
	for _, tc := range []struct {
		name  string
		cutAt int // progress notifications before the client's cut; 0: none
		reset bool
	}{
		{"no client cut", 0, false},
		{"client cut before the upstream closes", 2, false},
		{"client reset before the upstream closes", 2, true},
		{"client cut after the upstream closed", 6, false},
		{"client reset after the upstream closed", 6, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := metric(t, c, `caddy_mcp_resume_upstream_reconnects_total{outcome="resumed"}`)
			client := harness.ConnectSDK(t, c.Base()+"/mcp", "2025-11-25")
			if tc.cutAt > 0 {
				client.CutAfter(tc.cutAt, tc.reset)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			params := mcptest.CountParams(10, 100)
			params.Arguments.(map[string]any)["close_after"] = 4
			params.Arguments.(map[string]any)["retry_ms"] = 200
			res, err := client.Session.CallTool(ctx, params)
			if err != nil {
				t.Fatalf("call through the proxy: %v", err)
			}
			if got := mcptest.ResultText(res); got != "counted to 10" {
				t.Fatalf("result %q", got)
			}
			harness.AssertOnceInOrder(t, client.ProgressAfterCall(10), 10)
			if after := metric(t, c, `caddy_mcp_resume_upstream_reconnects_total{outcome="resumed"}`); after <= before {
				t.Fatalf("upstream_reconnects_total{outcome=resumed} did not move (%v -> %v): the upstream's close was not followed", before, after)
			}
		})
	}
}

// The connection between the proxy and the upstream drops mid-call. An
// upstream with an event store is resumed by the proxy and the call
// completes; one without (the server most users run) cannot be asked for
// the rest, so the client gets the explicit failure for its call, promptly,
// and does not reconnect in a loop.
func TestFollowsAnUpstreamConnectionThatDrops(t *testing.T) {
	for _, withStore := range []bool{true, false} {
		t.Run(fmt.Sprintf("event store %v", withStore), func(t *testing.T) {
			upstream := harness.StartDemo(t, demoserver.Options{EventStore: withStore})
			relay, err := mcptest.NewRelay(upstream)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { relay.Close() })
			c := harness.StartCaddy(t, mcptest.ResumeRoute(relay.Addr(), ""))
			client := harness.ConnectSDK(t, c.Base()+"/mcp", "2025-11-25")
			client.After(3, func() int { return relay.Cut(true) }) // the path to the upstream, not the client's
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			start := time.Now()
			getsBefore := client.Gets.Load()
			res, err := client.Session.CallTool(ctx, mcptest.CountParams(8, 150))
			if withStore {
				if err != nil {
					t.Fatalf("call: %v", err)
				}
				if got := mcptest.ResultText(res); got != "counted to 8" {
					t.Fatalf("result %q", got)
				}
				harness.AssertOnceInOrder(t, client.ProgressAfterCall(8), 8)
				return
			}
			if err == nil || !strings.Contains(err.Error(), "lost (upstream_failed)") {
				t.Fatalf("call over a dropped upstream without an event store: %v, %v; want the explicit failure", res, err)
			}
			if d := time.Since(start); d > 5*time.Second {
				t.Fatalf("the failure took %v", d)
			}
			time.Sleep(time.Second) // a client that loops would be reconnecting now
			if n := client.Gets.Load() - getsBefore; n > 1 {
				t.Fatalf("the client sent %d GETs after the failure: it reconnects in a loop", n)
			}
		})
	}
}

// A server that ends its standalone GET stream every second (with an event
// store, so what it sends meanwhile is kept for a GET with Last-Event-ID)
// while it sends notifications for 10 seconds: the proxy reopens the
// upstream's stream each time, and the client gets each notification once.
func TestFollowsAStandaloneStreamTheServerCloses(t *testing.T) {
	upstream := harness.StartDemo(t, demoserver.Options{EventStore: true, CloseStandaloneAfter: time.Second})
	c := harness.StartCaddy(t, mcptest.ResumeRoute(upstream, ""))
	client := harness.ConnectSDK(t, c.Base()+"/mcp", "2025-11-25")
	// The client's standalone GET is open and the proxy's upstream GET with
	// it (the first notice is 500ms after the call), so none is missed.
	harness.WaitFor(t, 5*time.Second, "the standalone stream fed by an upstream GET", func() bool {
		for _, s := range c.AdminSessions(t) {
			for _, st := range s.Streams {
				if st.Kind == "standalone" && st.Connected && st.Producing {
					return true
				}
			}
		}
		return false
	})
	const n = 20
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := client.Session.CallTool(ctx, notifyParams(n, 500)); err != nil {
		t.Fatalf("notify: %v", err)
	}
	harness.WaitFor(t, 20*time.Second, fmt.Sprintf("%d notices", n), func() bool { return len(client.NoticesSeen()) >= n })
	time.Sleep(500 * time.Millisecond) // and no more
	got := client.NoticesSeen()
	if len(got) != n {
		t.Fatalf("got %d notices, want %d: %q", len(got), n, got)
	}
	for i, s := range got {
		if want := fmt.Sprintf("notice %d of %d", i+1, n); s != want {
			t.Fatalf("notice %d is %q, want %q (all: %q)", i, s, want, got)
		}
	}
	if r := metric(t, c, `caddy_mcp_resume_upstream_reconnects_total{outcome="resumed"}`); r < 5 {
		t.Fatalf("upstream_reconnects_total{resumed} = %v: the server's closes were not followed", r)
	}
}

func notifyParams(n, intervalMS int) *mcp.CallToolParams {
	return &mcp.CallToolParams{Name: "notify", Arguments: map[string]any{"n": n, "interval_ms": intervalMS}}
}

// metric reads one series from the admin endpoint's /metrics (0 if absent).
func metric(t *testing.T, c *harness.Caddy, series string) float64 {
	t.Helper()
	m, err := c.Metrics()
	if err != nil {
		t.Fatal(err)
	}
	return m.Series[series]
}
