// Package e2e tests mcp-resume end to end: a real Caddy (in-process) with the
// module in front of a real MCP server (the official Go SDK, no event store),
// real official-SDK clients and raw HTTP clients, over real loopback sockets.
package e2e

import (
	"testing"

	"github.com/mcpresume/caddy-mcp-resume/tests/harness"
)

// Its tests mostly wait (idle timeouts, resume windows, restarts): each
// store's leg runs in two processes, side by side. The timing races that
// once made its legs run in turn (a resume racing a DELETE, a connection
// reset by a reload) were fixed where they were: in the relay, and by
// retrying as clients do.
func TestMain(m *testing.M) {
	harness.MainBothStores(m, harness.Shards{N: 2, Seconds: map[string]float64{
		"TestStopWithDetachedStreamsIsPrompt":       22, // builds a Caddy binary
		"TestToolCallSurvivesConnectionCut":         15,
		"TestResumeDecisions":                       8,
		"TestResumeAfterProxyRestartIsAGap":         5,
		"TestStandaloneStreamSurvivesConnectionCut": 5,
	}})
}
