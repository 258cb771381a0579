// Package security tests mcp-resume against hostile and malformed input, end
// to end: a real Caddy (in-process) with the module, in front of a real MCP
// server (the official Go SDK, no event store) or a deliberately malformed
// raw upstream, over real loopback sockets. It checks that no session's
// events leak to another credential or session, that bad input gets a clear
// answer (a JSON-RPC error body, or an explicit SSE failure), and that other
// sessions' streams lose nothing meanwhile.
package security

import (
	"testing"

	"github.com/mcpresume/caddy-mcp-resume/tests/harness"
)

func TestMain(m *testing.M) {
	harness.MainBothStores(m, harness.Shards{N: 2, Seconds: map[string]float64{
		"TestBadInputs":                               18,
		"TestStolenSessionCannotBeTakenOver":          14,
		"TestAnUnansweredCheckCostsItsTimeoutThen503": 10,
	}})
}
