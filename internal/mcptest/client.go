// Package mcptest is the kit the end-to-end tests and the benchmark share:
// a raw Streamable HTTP client, a scriptable MCP upstream on plain net/http,
// an SSE reader, a Prometheus text-format parser, and the config of an
// in-process Caddy. Its helpers return errors instead of failing a test, so
// a command and a test's background goroutines can use them too;
// tests/harness wraps them for tests.
package mcptest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strings"
)

// Client speaks Streamable HTTP by hand, to see the bytes on the wire. A
// Client is one session; WithHeader copies it to send other credentials in
// the same session.
type Client struct {
	URL       string       // the MCP endpoint: base + "/mcp"
	Version   string       // the protocol version initialize asks for, sent with every request of the session
	SessionID string       // Mcp-Session-Id, once Initialize opened a session
	Header    http.Header  // sent with every request (credentials, say)
	HTTP      *http.Client // nil: http.DefaultClient
}

// NewClient returns a client of the MCP endpoint at base (e.g.
// http://127.0.0.1:PORT) that sends its requests through hc.
func NewClient(base, version string, hc *http.Client) *Client {
	return &Client{URL: base + "/mcp", Version: version, HTTP: hc}
}

// WithHeader returns a copy of c, same session, that sends header instead.
func (c *Client) WithHeader(header http.Header) *Client {
	d := *c
	d.Header = header
	return &d
}

// NewRequest builds a request as a Streamable HTTP client sends it: c.Header
// first, then the Content-Type and Accept the transport asks for (a JSON
// body, or none for a GET stream), then, once there is a session, its
// Mcp-Session-Id and Mcp-Protocol-Version, and last the extra headers, which
// override all of those (a nil value removes the header).
func (c *Client) NewRequest(ctx context.Context, method, body string, extra http.Header) (*http.Request, error) {
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.URL, rd)
	if err != nil {
		return nil, err
	}
	for k, v := range c.Header {
		req.Header[k] = v
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
	} else {
		req.Header.Set("Accept", "text/event-stream")
	}
	if c.SessionID != "" {
		req.Header.Set("Mcp-Session-Id", c.SessionID)
		if c.Version != "" {
			req.Header.Set("Mcp-Protocol-Version", c.Version)
		}
	}
	for k, v := range extra {
		if v == nil {
			req.Header.Del(k)
		} else {
			req.Header[http.CanonicalHeaderKey(k)] = v
		}
	}
	return req, nil
}

// Do sends a request (body "" means none, as for a GET stream) and returns
// the response as it is.
func (c *Client) Do(ctx context.Context, method, body string, extra http.Header) (*http.Response, error) {
	req, err := c.NewRequest(ctx, method, body, extra)
	if err != nil {
		return nil, err
	}
	if c.HTTP == nil {
		return http.DefaultClient.Do(req)
	}
	return c.HTTP.Do(req)
}

// Initialize opens a session and sends notifications/initialized.
func (c *Client) Initialize(ctx context.Context) error {
	resp, err := c.Do(ctx, "POST", fmt.Sprintf(`{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":%q,"capabilities":{},"clientInfo":{"name":"mcptest","version":"1"}}}`, c.Version), nil)
	if err != nil {
		return fmt.Errorf("initialize: %w", err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("initialize: %d %s", resp.StatusCode, body)
	}
	c.SessionID = resp.Header.Get("Mcp-Session-Id")
	if c.SessionID == "" || !bytes.Contains(body, []byte(c.Version)) {
		return fmt.Errorf("initialize: no session or another version: %q", body)
	}
	resp, err = c.Do(ctx, "POST", `{"jsonrpc":"2.0","method":"notifications/initialized"}`, nil)
	if err != nil {
		return fmt.Errorf("notifications/initialized: %w", err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusAccepted {
		return fmt.Errorf("notifications/initialized: %d", resp.StatusCode)
	}
	return nil
}

// CallBody is a tools/call request with id (any JSON value) whose progress
// notifications carry progressToken.
func CallBody(id any, tool string, args any, progressToken string) string {
	i, _ := json.Marshal(id)
	a, _ := json.Marshal(args)
	return fmt.Sprintf(`{"jsonrpc":"2.0","id":%s,"method":"tools/call","params":{"name":%q,"arguments":%s,"_meta":{"progressToken":%q}}}`, i, tool, a, progressToken)
}

// Call starts a tools/call and returns its open SSE response; any other
// answer is an error.
func (c *Client) Call(ctx context.Context, id any, tool string, args any, progressToken string) (*http.Response, error) {
	resp, err := c.Do(ctx, "POST", CallBody(id, tool, args, progressToken), nil)
	if err != nil {
		return nil, fmt.Errorf("tools/call %s: %w", tool, err)
	}
	if resp.StatusCode != http.StatusOK || MediaType(resp.Header) != "text/event-stream" {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return nil, fmt.Errorf("tools/call %s: %d %s %s", tool, resp.StatusCode, resp.Header.Get("Content-Type"), b)
	}
	return resp, nil
}

// Resume sends GET with Last-Event-ID and returns the response as it is.
func (c *Client) Resume(ctx context.Context, lastEventID string) (*http.Response, error) {
	return c.Do(ctx, "GET", "", http.Header{"Last-Event-Id": {lastEventID}})
}

// Delete ends the session (DELETE), as a client that is done does.
func (c *Client) Delete(ctx context.Context) error {
	resp, err := c.Do(ctx, "DELETE", "", nil)
	if err != nil {
		return err
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("DELETE: %d", resp.StatusCode)
	}
	return nil
}

// MediaType is a response's Content-Type without its parameters.
func MediaType(h http.Header) string {
	mt, _, _ := mime.ParseMediaType(h.Get("Content-Type"))
	return mt
}
