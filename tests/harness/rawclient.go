package harness

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// RawClient speaks Streamable HTTP by hand, to check bytes on the wire. Its
// methods fail the test on any error, so only the test's own goroutine may
// call them.
type RawClient struct {
	t       testing.TB
	URL     string      // the MCP endpoint: base + "/mcp"
	SID     string      // Mcp-Session-Id, once Initialize opened a session
	Version string      // the protocol version asked for and sent with the session
	Header  http.Header // sent with every request (credentials, say)
	HTTP    *http.Client
}

// NewRawClient returns a client of the MCP endpoint at base with its own
// connection pool, closed when the test ends. After a reload call Reconnect:
// the old server closes its idle keep-alive connections, and a POST (not
// retried by net/http) on one of them would fail with EOF.
func NewRawClient(t testing.TB, base, version string) *RawClient {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	t.Cleanup(tr.CloseIdleConnections)
	return &RawClient{t: t, URL: base + "/mcp", Version: version, Header: http.Header{},
		HTTP: &http.Client{Timeout: 30 * time.Second, Transport: tr}}
}

// Reconnect drops idle connections (to a server a reload replaced).
func (c *RawClient) Reconnect() { c.HTTP.CloseIdleConnections() }

// Request sends a request (body "" means none, as for a GET stream) with the
// session's headers and the extra ones, and returns the response as is.
func (c *RawClient) Request(method, body string, extra map[string]string) *http.Response {
	c.t.Helper()
	req, err := NewStreamableRequest(context.Background(), method, c.URL, body, c.Header, c.SID, c.Version)
	if err != nil {
		c.t.Fatal(err)
	}
	for k, v := range extra {
		req.Header.Set(k, v)
	}
	resp, err := c.HTTP.Do(req)
	if err != nil {
		c.t.Fatalf("%s: %v", method, err)
	}
	return resp
}

// Initialize opens a session and sends notifications/initialized.
func (c *RawClient) Initialize() {
	c.t.Helper()
	resp := c.Request("POST", fmt.Sprintf(`{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":%q,"capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}`, c.Version), nil)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		c.t.Fatalf("initialize: %d %s", resp.StatusCode, body)
	}
	c.SID = resp.Header.Get("Mcp-Session-Id")
	if c.SID == "" || !bytes.Contains(body, []byte(c.Version)) {
		c.t.Fatalf("initialize: no session or other version: %q", body)
	}
	resp = c.Request("POST", `{"jsonrpc":"2.0","method":"notifications/initialized"}`, nil)
	resp.Body.Close()
	if resp.StatusCode != 202 {
		c.t.Fatalf("notifications/initialized: %d", resp.StatusCode)
	}
}

// Call starts tools/call and returns the open SSE response.
func (c *RawClient) Call(id int, tool string, args map[string]any) *http.Response {
	c.t.Helper()
	a, _ := json.Marshal(args)
	resp := c.Request("POST", fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":%q,"arguments":%s,"_meta":{"progressToken":"tok"}}}`, id, tool, a), nil)
	if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		b, _ := io.ReadAll(resp.Body)
		c.t.Fatalf("tools/call: %d %s %s", resp.StatusCode, resp.Header.Get("Content-Type"), b)
	}
	return resp
}

// CallToEnd runs a tool call and reads its whole SSE response.
func (c *RawClient) CallToEnd(id int, tool string, args map[string]any) []SSEEvent {
	c.t.Helper()
	resp := c.Call(id, tool, args)
	defer resp.Body.Close()
	return ReadEvents(c.t, resp, 0)
}

// Resume sends GET with Last-Event-ID.
func (c *RawClient) Resume(lastID string) *http.Response {
	c.t.Helper()
	return c.Request("GET", "", map[string]string{"Last-Event-ID": lastID})
}

// NewStreamableRequest builds a request to an MCP endpoint as a Streamable
// HTTP client sends it: header first (credentials, say), then the
// Content-Type and Accept the transport asks for (a JSON body, or none for a
// GET stream), then, once there is a session (sid), its Mcp-Session-Id and,
// when known, Mcp-Protocol-Version. Callers add their own extra headers to
// it. Every raw client here builds its requests with it, so they all send
// the same headers whether they fail the test or return errors.
func NewStreamableRequest(ctx context.Context, method, url, body string, header http.Header, sid, version string) (*http.Request, error) {
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, url, rd)
	if err != nil {
		return nil, err
	}
	for k, v := range header {
		req.Header[k] = v
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
	} else {
		req.Header.Set("Accept", "text/event-stream")
	}
	if sid != "" {
		req.Header.Set("Mcp-Session-Id", sid)
		if version != "" {
			req.Header.Set("Mcp-Protocol-Version", version)
		}
	}
	return req, nil
}
