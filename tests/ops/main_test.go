// Package ops tests what an operator sees of mcp-resume: the Prometheus
// metrics Caddy exposes, the admin API, `caddy validate` on the documented
// configurations, and the Grafana dashboard and alert rule shipped with the
// module. Everything runs for real: Caddy in-process with the module, the
// demo MCP server (official Go SDK, no event store) on a loopback socket.
package ops

import (
	"testing"

	"github.com/mcpresume/caddy-mcp-resume/tests/harness"
)

func TestMain(m *testing.M) { harness.Main(m) }
