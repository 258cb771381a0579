package e2e

import (
	"encoding/json"
	"net/http"
	"testing"

	"github.com/mcpresume/caddy-mcp-resume/internal/demoserver"
	"github.com/mcpresume/caddy-mcp-resume/tests/harness"
)

// proxyFor starts the demo server and a Caddy in front of it, configured
// exactly as the README's typical use plus the given mcp_resume options.
func proxyFor(t *testing.T, opts demoserver.Options, moduleOptions string) (*harness.Caddy, string) {
	t.Helper()
	upstream := harness.StartDemo(t, opts)
	c := harness.StartCaddy(t, harness.Site(upstream, moduleOptions))
	return c, upstream
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
