package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcpresume/caddy-mcp-resume/internal/demoserver"
	"github.com/mcpresume/caddy-mcp-resume/internal/mcptest"
	"github.com/mcpresume/caddy-mcp-resume/tests/harness"
)

func countTo(ctx context.Context, s *mcp.ClientSession, n, intervalMS int) (*mcp.CallToolResult, error) {
	return s.CallTool(ctx, countParams(n, intervalMS))
}

var countParams, resultText = mcptest.CountParams, mcptest.ResultText

// The mission in one test: a tool call streams progress, the connection is
// cut mid-stream, and the client still gets every progress notification
// exactly once, in order, and the result, from a server that keeps nothing.
func TestToolCallSurvivesConnectionCut(t *testing.T) {
	for _, version := range []string{"2025-11-25", "2025-06-18", "2025-03-26"} {
		for _, reset := range []bool{false, true} {
			name := fmt.Sprintf("%s/close", version)
			if reset {
				name = fmt.Sprintf("%s/reset", version)
			}
			t.Run(name, func(t *testing.T) {
				c, _ := proxyFor(t, demoserver.Options{}, "")
				client := harness.ConnectSDK(t, c.Base()+"/mcp", version)
				const n = 12
				cut := client.CutAfter(4, reset)
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				res, err := countTo(ctx, client.Session, n, 150)
				if err != nil {
					t.Fatalf("call failed through the proxy: %v", err)
				}
				if cuts := <-cut; cuts == 0 {
					t.Fatal("no connection was cut")
				}
				if got := resultText(res); got != fmt.Sprintf("counted to %d", n) {
					t.Fatalf("result %q", got)
				}
				// The SDK hands notifications to their handler asynchronously:
				// the last may be dispatched just after the result.
				harness.WaitFor(t, 5*time.Second, "progress", func() bool { return len(client.ProgressSeen()) >= n })
				time.Sleep(100 * time.Millisecond) // and no more: a duplicate would arrive now
				harness.AssertOnceInOrder(t, client.ProgressAfterCall(n), n)
			})
		}
	}
}

// Why the module exists: the same cut without the proxy loses the call.
func TestToolCallWithoutProxyIsLost(t *testing.T) {
	upstream := harness.StartDemo(t, demoserver.Options{})
	client := harness.ConnectSDK(t, "http://"+upstream+"/mcp", "2025-11-25")
	cut := client.CutAfter(4, false)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err := countTo(ctx, client.Session, 12, 150)
	<-cut
	if err == nil {
		t.Fatal("the call survived a cut without the proxy; the server must have become resumable")
	}
	t.Logf("without the proxy the call fails: %v (progress seen: %v)", err, client.ProgressSeen())
}

// Server-initiated notifications on the standalone GET stream survive a cut
// too: the proxy keeps reading the upstream GET while the client is away.
func TestStandaloneStreamSurvivesConnectionCut(t *testing.T) {
	for _, reset := range []bool{false, true} {
		t.Run(fmt.Sprintf("reset=%v", reset), func(t *testing.T) {
			c, _ := proxyFor(t, demoserver.Options{}, "")
			client := harness.ConnectSDK(t, c.Base()+"/mcp", "2025-11-25")
			const n = 10
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			// Let the standalone GET reach the upstream before notices are sent.
			harness.WaitFor(t, 5*time.Second, "standalone stream", func() bool {
				s := c.AdminSessions(t)
				return len(s) == 1 && len(s[0].Streams) == 1
			})
			cut := client.CutAfter(3, reset)
			if _, err := client.Session.CallTool(ctx, &mcp.CallToolParams{Name: "notify", Arguments: map[string]any{"n": n, "interval_ms": 150}}); err != nil {
				t.Fatal(err)
			}
			<-cut
			harness.WaitFor(t, 20*time.Second, "all notices", func() bool { return len(client.NoticesSeen()) >= n })
			time.Sleep(300 * time.Millisecond) // a duplicate would arrive now
			got := client.NoticesSeen()
			if len(got) != n {
				t.Fatalf("got %d notices, want %d: %v", len(got), n, got)
			}
			for i, s := range got {
				if want := fmt.Sprintf("notice %d of %d", i+1, n); s != want {
					t.Fatalf("notice %d = %q, want %q (all %v)", i, s, want, got)
				}
			}
		})
	}
}
