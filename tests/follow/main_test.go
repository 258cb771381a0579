// Package follow tests mcp-resume as a client of its upstreams, end to
// end: a real Caddy (in-process) with the module in front of MCP servers
// that close their streams on purpose (official Go SDK servers with an
// event store), drop connections, repeat or restart their event IDs, greet
// with nothing or with one event, ask for huge retries, or answer 404: the
// proxy follows them with GET + Last-Event-ID, backs off and stops, and
// fails loudly when it cannot. Real clients (official Go SDK and raw HTTP)
// over real loopback sockets.
//
// It was part of tests/e2e; apart, the two suites run side by side.
package follow

import (
	"testing"

	"github.com/mcpresume/caddy-mcp-resume/tests/harness"
)

// Its legs run in turn, as tests/e2e's: side by side, the load made timing
// races show (resumes racing a DELETE).
func TestMain(m *testing.M) { harness.MainBothStoresInTurn(m) }
