package mcptest

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// SDKClient is an official Go SDK client whose connections a test can cut,
// recording the progress notifications and log messages it receives.
type SDKClient struct {
	Session   *mcp.ClientSession
	Transport *CuttableTransport
	Gets      atomic.Int64 // GET requests the client sent (resumes, the standalone stream)

	mu       sync.Mutex
	progress []float64
	notices  []string
	seen     chan struct{} // one token per progress notification or notice
}

// RoundTripFunc is an http.RoundTripper.
type RoundTripFunc func(*http.Request) (*http.Response, error)

// RoundTrip implements http.RoundTripper.
func (f RoundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// ConnectSDK connects an SDK client to endpoint with the given protocol
// version. maxRetries is the transport's reconnect budget (0: the SDK's).
func ConnectSDK(ctx context.Context, endpoint, version string, maxRetries int) (*SDKClient, error) {
	return ConnectSDKWith(ctx, endpoint, version, maxRetries, NewCuttableTransport(0))
}

// ConnectSDKWith is ConnectSDK over the transport ct.
func ConnectSDKWith(ctx context.Context, endpoint, version string, maxRetries int, ct *CuttableTransport) (*SDKClient, error) {
	return ConnectSDKVia(ctx, endpoint, version, maxRetries, ct, nil)
}

// ConnectSDKVia is ConnectSDKWith whose requests go through wrap(ct) (nil:
// ct itself): a RoundTripper that adds credentials, say.
func ConnectSDKVia(ctx context.Context, endpoint, version string, maxRetries int, ct *CuttableTransport,
	wrap func(http.RoundTripper) http.RoundTripper) (*SDKClient, error) {
	c := &SDKClient{Transport: ct, seen: make(chan struct{}, 10000)}
	var rt http.RoundTripper = ct
	if wrap != nil {
		rt = wrap(ct)
	}
	client := mcp.NewClient(&mcp.Implementation{Name: "mcptest", Version: "1"}, &mcp.ClientOptions{
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
	s, err := client.Connect(ctx, &mcp.StreamableClientTransport{
		Endpoint:   endpoint,
		MaxRetries: maxRetries,
		HTTPClient: &http.Client{Transport: RoundTripFunc(func(r *http.Request) (*http.Response, error) {
			if r.Method == http.MethodGet {
				c.Gets.Add(1)
			}
			return rt.RoundTrip(r)
		})},
	}, &mcp.ClientSessionOptions{ProtocolVersion: version})
	if err != nil {
		return nil, err
	}
	c.Session = s
	return c, nil
}

// CutAfter cuts every connection once k notifications arrived, and sends
// how many it cut.
func (c *SDKClient) CutAfter(k int, reset bool) <-chan int {
	return c.After(k, func() int { return c.Transport.Cut(reset) })
}

// After runs fn once k notifications arrived, and sends its result.
func (c *SDKClient) After(k int, fn func() int) <-chan int {
	done := make(chan int, 1)
	go func() {
		for i := 0; i < k; i++ {
			<-c.seen
		}
		done <- fn()
	}()
	return done
}

// ProgressAfterCall returns the progress notifications seen once n arrived
// or a moment passed: the SDK client hands notifications to their handler
// on its own goroutines, so a replayed batch may still be on its way when
// the call returns with the result that followed it.
func (c *SDKClient) ProgressAfterCall(n int) []float64 {
	Eventually(5*time.Second, 5*time.Millisecond, func() bool { return len(c.ProgressSeen()) >= n })
	time.Sleep(50 * time.Millisecond) // and no more (a duplicate would show)
	return c.ProgressSeen()
}

// ProgressSeen returns the progress values received so far.
func (c *SDKClient) ProgressSeen() []float64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]float64(nil), c.progress...)
}

// NoticesSeen returns the log messages received so far.
func (c *SDKClient) NoticesSeen() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.notices...)
}

// CountParams calls the demo server's count tool: n progress notifications
// intervalMS apart, then "counted to n".
func CountParams(n, intervalMS int) *mcp.CallToolParams {
	params := &mcp.CallToolParams{Name: "count", Arguments: map[string]any{"n": n, "interval_ms": intervalMS}}
	params.SetProgressToken("progress-1")
	return params
}

// ResultText is the text content of a tool result.
func ResultText(r *mcp.CallToolResult) string {
	var b strings.Builder
	for _, c := range r.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			b.WriteString(tc.Text)
		}
	}
	return b.String()
}

// OnceInOrder reports whether got is exactly 1, 2, ..., n.
func OnceInOrder(got []float64, n int) error {
	if len(got) != n {
		return fmt.Errorf("got %d progress notifications, want %d: %v", len(got), n, got)
	}
	for i, p := range got {
		if p != float64(i+1) {
			return fmt.Errorf("progress[%d] = %v, want %d (all: %v)", i, p, i+1, got)
		}
	}
	return nil
}
