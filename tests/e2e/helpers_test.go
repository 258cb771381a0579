package e2e

import (
	"testing"

	"github.com/mcpresume/caddy-mcp-resume/internal/demoserver"
	"github.com/mcpresume/caddy-mcp-resume/internal/mcptest"
	"github.com/mcpresume/caddy-mcp-resume/tests/harness"
)

// proxyFor starts the demo server and a Caddy in front of it, configured
// exactly as the README's typical use plus the given mcp_resume options.
func proxyFor(t *testing.T, opts demoserver.Options, moduleOptions string) (*harness.Caddy, string) {
	t.Helper()
	upstream := harness.StartDemo(t, opts)
	c := harness.StartCaddy(t, mcptest.ResumeRoute(upstream, moduleOptions))
	return c, upstream
}
