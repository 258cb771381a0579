// Package e2e tests mcp-resume end to end: a real Caddy (in-process) with the
// module in front of a real MCP server (the official Go SDK, no event store),
// real official-SDK clients and raw HTTP clients, over real loopback sockets.
package e2e

import (
	"testing"

	"github.com/mcpresume/caddy-mcp-resume/tests/harness"
)

// Its legs run in turn: side by side, the load made timing races show
// (resumes racing a DELETE, connections reset by a reload).
func TestMain(m *testing.M) { harness.MainBothStoresInTurn(m) }
