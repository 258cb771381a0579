package harness

import (
	"context"
	"errors"
	"net"
	"net/http"
	"syscall"
	"testing"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/internal/mcptest"
)

// RawClient is an mcptest.Client for a test's own goroutine: its
// Initialize, Call and Resume fail the test instead of returning an error.
type RawClient struct {
	*mcptest.Client
	t testing.TB
}

// NewRawClient returns a client of the MCP endpoint at base with its own
// connection pool, closed when the test ends. After a reload call Reconnect:
// the old server closes its idle keep-alive connections, and a POST (not
// retried by net/http) on one of them would fail with EOF.
func NewRawClient(t testing.TB, base, version string) *RawClient {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.DialContext = dialAgainOnReset
	t.Cleanup(tr.CloseIdleConnections)
	hc := &http.Client{Timeout: 30 * time.Second, Transport: tr}
	return &RawClient{Client: mcptest.NewClient(base, version, hc), t: t}
}

// dialAgainOnReset dials again when the connect is reset: on a reload
// Caddy opens a new listener beside the old one (SO_REUSEPORT) and closes
// the old, and a connection the kernel had just queued on the old one is
// reset before a byte is sent (seen in CI, a POST right after a reload).
// Nothing was sent, so a client dials again, as one reconnecting would.
func dialAgainOnReset(ctx context.Context, network, addr string) (net.Conn, error) {
	d := net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}
	for attempt := 1; ; attempt++ {
		c, err := d.DialContext(ctx, network, addr)
		if err == nil || attempt == 3 || !errors.Is(err, syscall.ECONNRESET) {
			return c, err
		}
	}
}

// NewRawClientOver is NewRawClient on hc (another protocol, say h2c).
func NewRawClientOver(t testing.TB, base, version string, hc *http.Client) *RawClient {
	return &RawClient{Client: mcptest.NewClient(base, version, hc), t: t}
}

// NewSession is a RawClient whose session is initialized.
func NewSession(t testing.TB, base, version string) *RawClient {
	t.Helper()
	c := NewRawClient(t, base, version)
	c.Initialize()
	return c
}

// Reconnect drops idle connections (to a server a reload replaced).
func (c *RawClient) Reconnect() { c.HTTP.CloseIdleConnections() }

// Request sends a request (body "" means none, as for a GET stream) with the
// session's headers and the extra ones, and returns the response as is.
func (c *RawClient) Request(method, body string, extra http.Header) *http.Response {
	c.t.Helper()
	resp, err := c.Do(context.Background(), method, body, extra)
	if err != nil {
		c.t.Fatalf("%s: %v", method, err)
	}
	return resp
}

// Initialize opens a session and sends notifications/initialized.
func (c *RawClient) Initialize() {
	c.t.Helper()
	if err := c.Client.Initialize(context.Background()); err != nil {
		c.t.Fatal(err)
	}
}

// Call starts tools/call and returns the open SSE response.
func (c *RawClient) Call(id int, tool string, args map[string]any) *http.Response {
	c.t.Helper()
	resp, err := c.Client.Call(context.Background(), id, tool, args, "tok")
	if err != nil {
		c.t.Fatal(err)
	}
	return resp
}

// CallToEnd runs a tool call and reads its whole SSE response.
func (c *RawClient) CallToEnd(id int, tool string, args map[string]any) []mcptest.Event {
	c.t.Helper()
	resp := c.Call(id, tool, args)
	defer resp.Body.Close()
	return ReadEvents(c.t, resp, 0)
}

// Resume sends GET with Last-Event-ID.
func (c *RawClient) Resume(lastID string) *http.Response {
	c.t.Helper()
	resp, err := c.Client.Resume(context.Background(), lastID)
	if err != nil {
		c.t.Fatalf("GET: %v", err)
	}
	return resp
}

// ReadEvents reads n events of a response (0: until the body ends), failing
// the test if that takes over 20s or the body breaks.
func ReadEvents(t testing.TB, resp *http.Response, n int) []mcptest.Event {
	t.Helper()
	evs, err := mcptest.ReadEvents(resp.Body, n, 20*time.Second)
	if err != nil {
		t.Fatalf("reading events: %v (got %d)", err, len(evs))
	}
	return evs
}
