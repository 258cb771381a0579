package e2e

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcpresume/caddy-mcp-resume/internal/demoserver"
	"github.com/mcpresume/caddy-mcp-resume/internal/mcptest"
	"github.com/mcpresume/caddy-mcp-resume/tests/harness"
)

// sdkClient is an official Go SDK client whose connections the test can cut.
type sdkClient struct {
	session   *mcp.ClientSession
	transport *mcptest.CuttableTransport

	gets atomic.Int64 // GET requests the client sent (resumes, the standalone stream)

	mu       sync.Mutex
	progress []float64
	notices  []string
	seen     chan struct{} // one token per progress notification or notice
}

// roundTripFunc is an http.RoundTripper.
type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

func connectSDK(t *testing.T, endpoint, version string) *sdkClient {
	t.Helper()
	c := &sdkClient{transport: mcptest.NewCuttableTransport(0), seen: make(chan struct{}, 10000)}
	client := mcp.NewClient(&mcp.Implementation{Name: "e2e", Version: "1"}, &mcp.ClientOptions{
		ProgressNotificationHandler: func(_ context.Context, req *mcp.ProgressNotificationClientRequest) {
			c.mu.Lock()
			c.progress = append(c.progress, req.Params.Progress)
			c.mu.Unlock()
			c.seen <- struct{}{}
		},
		LoggingMessageHandler: func(_ context.Context, req *mcp.LoggingMessageRequest) {
			c.mu.Lock()
			c.notices = append(c.notices, fmt.Sprint(req.Params.Data))
			c.mu.Unlock()
			c.seen <- struct{}{}
		},
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := client.Connect(ctx, &mcp.StreamableClientTransport{
		Endpoint: endpoint,
		HTTPClient: &http.Client{Transport: roundTripFunc(func(r *http.Request) (*http.Response, error) {
			if r.Method == http.MethodGet {
				c.gets.Add(1)
			}
			return c.transport.RoundTrip(r)
		})},
	}, &mcp.ClientSessionOptions{ProtocolVersion: version})
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	c.session = s
	return c
}

// cutAfter cuts every connection once k notifications arrived.
func (c *sdkClient) cutAfter(k int, reset bool) <-chan int {
	done := make(chan int, 1)
	go func() {
		for i := 0; i < k; i++ {
			<-c.seen
		}
		done <- c.transport.Cut(reset)
	}()
	return done
}

// progressAfterCall returns the progress notifications seen once n arrived
// or a moment passed: the SDK client hands notifications to their handler
// on its own goroutines, so a replayed batch may still be on its way when
// the call returns with the result that followed it.
func (c *sdkClient) progressAfterCall(n int) []float64 {
	mcptest.Eventually(5*time.Second, 5*time.Millisecond, func() bool { return len(c.progressSeen()) >= n })
	time.Sleep(50 * time.Millisecond) // and no more (a duplicate would show)
	return c.progressSeen()
}

func (c *sdkClient) progressSeen() []float64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]float64(nil), c.progress...)
}

func (c *sdkClient) noticesSeen() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.notices...)
}

func countTo(ctx context.Context, s *mcp.ClientSession, n, intervalMS int) (*mcp.CallToolResult, error) {
	return s.CallTool(ctx, countParams(n, intervalMS))
}

func countParams(n, intervalMS int) *mcp.CallToolParams {
	params := &mcp.CallToolParams{Name: "count", Arguments: map[string]any{"n": n, "interval_ms": intervalMS}}
	params.SetProgressToken("progress-1")
	return params
}

func resultText(r *mcp.CallToolResult) string {
	var b strings.Builder
	for _, c := range r.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			b.WriteString(tc.Text)
		}
	}
	return b.String()
}

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
				client := connectSDK(t, c.Base()+"/mcp", version)
				const n = 12
				cut := client.cutAfter(4, reset)
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				res, err := countTo(ctx, client.session, n, 150)
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
				harness.WaitFor(t, 5*time.Second, "progress", func() bool { return len(client.progressSeen()) >= n })
				time.Sleep(100 * time.Millisecond)
				assertOnceInOrder(t, client.progressAfterCall(n), n)
			})
		}
	}
}

func assertOnceInOrder(t *testing.T, got []float64, n int) {
	t.Helper()
	if len(got) != n {
		t.Fatalf("got %d progress notifications, want %d: %v", len(got), n, got)
	}
	for i, p := range got {
		if p != float64(i+1) {
			t.Fatalf("progress[%d] = %v, want %d (all: %v)", i, p, i+1, got)
		}
	}
}

// Why the module exists: the same cut without the proxy loses the call.
func TestToolCallWithoutProxyIsLost(t *testing.T) {
	upstream := harness.StartDemo(t, demoserver.Options{})
	client := connectSDK(t, "http://"+upstream+"/mcp", "2025-11-25")
	cut := client.cutAfter(4, false)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err := countTo(ctx, client.session, 12, 150)
	<-cut
	if err == nil {
		t.Fatal("the call survived a cut without the proxy; the server must have become resumable")
	}
	t.Logf("without the proxy the call fails: %v (progress seen: %v)", err, client.progressSeen())
}

// Server-initiated notifications on the standalone GET stream survive a cut
// too: the proxy keeps reading the upstream GET while the client is away.
func TestStandaloneStreamSurvivesConnectionCut(t *testing.T) {
	for _, reset := range []bool{false, true} {
		t.Run(fmt.Sprintf("reset=%v", reset), func(t *testing.T) {
			c, _ := proxyFor(t, demoserver.Options{}, "")
			client := connectSDK(t, c.Base()+"/mcp", "2025-11-25")
			const n = 10
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			// Let the standalone GET reach the upstream before notices are sent.
			harness.WaitFor(t, 5*time.Second, "standalone stream", func() bool {
				s := adminSessions(t, c)
				return len(s) == 1 && len(s[0].Streams) == 1
			})
			cut := client.cutAfter(3, reset)
			if _, err := client.session.CallTool(ctx, &mcp.CallToolParams{Name: "notify", Arguments: map[string]any{"n": n, "interval_ms": 150}}); err != nil {
				t.Fatal(err)
			}
			<-cut
			harness.WaitFor(t, 20*time.Second, "all notices", func() bool { return len(client.noticesSeen()) >= n })
			time.Sleep(300 * time.Millisecond) // a duplicate would arrive now
			got := client.noticesSeen()
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
