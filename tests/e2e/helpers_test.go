package e2e

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

	"github.com/mcpresume/caddy-mcp-resume/internal/demoserver"
	"github.com/mcpresume/caddy-mcp-resume/tests/harness"
)

// proxyFor starts the demo server and a Caddy in front of it, configured
// exactly as the README's typical use plus the given mcp_resume options.
func proxyFor(t *testing.T, opts demoserver.Options, moduleOptions string) (*harness.Caddy, string) {
	t.Helper()
	upstream := harness.StartDemo(t, opts)
	c := harness.StartCaddy(t, siteFor(upstream, moduleOptions))
	return c, upstream
}

func siteFor(upstream, moduleOptions string) string {
	if moduleOptions != "" {
		moduleOptions = "{\n" + moduleOptions + "\n}"
	}
	return fmt.Sprintf(`	route /mcp* {
		mcp_resume %s
		reverse_proxy %s
	}`, moduleOptions, upstream)
}

// rawClient speaks Streamable HTTP by hand, to check bytes on the wire.
type rawClient struct {
	t       *testing.T
	url     string
	sid     string
	version string
	http    *http.Client
	header  http.Header
}

func newRawClient(t *testing.T, base, version string) *rawClient {
	return &rawClient{t: t, url: base + "/mcp", version: version, http: &http.Client{Timeout: 30 * time.Second}, header: http.Header{}}
}

func (c *rawClient) request(method, body string, extra map[string]string) *http.Response {
	c.t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, c.url, rd)
	if err != nil {
		c.t.Fatal(err)
	}
	for k, v := range c.header {
		req.Header[k] = v
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
	} else {
		req.Header.Set("Accept", "text/event-stream")
	}
	if c.sid != "" {
		req.Header.Set("Mcp-Session-Id", c.sid)
	}
	if c.version != "" && c.sid != "" {
		req.Header.Set("Mcp-Protocol-Version", c.version)
	}
	for k, v := range extra {
		req.Header.Set(k, v)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		c.t.Fatalf("%s: %v", method, err)
	}
	return resp
}

// initialize opens a session and sends notifications/initialized.
func (c *rawClient) initialize() {
	c.t.Helper()
	resp := c.request("POST", fmt.Sprintf(`{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":%q,"capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}`, c.version), nil)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		c.t.Fatalf("initialize: %d %s", resp.StatusCode, body)
	}
	c.sid = resp.Header.Get("Mcp-Session-Id")
	if c.sid == "" || !bytes.Contains(body, []byte(c.version)) {
		c.t.Fatalf("initialize: no session or other version: %q", body)
	}
	resp = c.request("POST", `{"jsonrpc":"2.0","method":"notifications/initialized"}`, nil)
	resp.Body.Close()
	if resp.StatusCode != 202 {
		c.t.Fatalf("notifications/initialized: %d", resp.StatusCode)
	}
}

// call starts tools/call and returns the open SSE response.
func (c *rawClient) call(id int, tool string, args map[string]any) *http.Response {
	c.t.Helper()
	a, _ := json.Marshal(args)
	resp := c.request("POST", fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":%q,"arguments":%s,"_meta":{"progressToken":"tok"}}}`, id, tool, a), nil)
	if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		b, _ := io.ReadAll(resp.Body)
		c.t.Fatalf("tools/call: %d %s %s", resp.StatusCode, resp.Header.Get("Content-Type"), b)
	}
	return resp
}

// resume sends GET with Last-Event-ID.
func (c *rawClient) resume(lastID string) *http.Response {
	c.t.Helper()
	return c.request("GET", "", map[string]string{"Last-Event-ID": lastID})
}

func readEvents(t *testing.T, resp *http.Response, n int) []harness.SSEEvent {
	t.Helper()
	evs, err := harness.ReadSSE(resp.Body, n, 20*time.Second)
	if err != nil {
		t.Fatalf("reading events: %v (got %d)", err, len(evs))
	}
	return evs
}

func adminSessions(t *testing.T, c *harness.Caddy) []map[string]any {
	t.Helper()
	resp, err := http.Get(c.Admin() + "/mcp_resume/sessions")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out []map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		t.Fatal(err)
	}
	return out
}

// waitFor polls cond until it holds or the timeout passes.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	for !cond() {
		select {
		case <-ctx.Done():
			t.Fatalf("timed out waiting for %s", what)
		case <-time.After(20 * time.Millisecond):
		}
	}
}
