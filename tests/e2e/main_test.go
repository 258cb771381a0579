// Package e2e tests mcp-resume end to end: a real Caddy (in-process) with the
// module in front of a real MCP server (the official Go SDK, no event store),
// real official-SDK clients and raw HTTP clients, over real loopback sockets.
package e2e

import (
	"testing"

	"github.com/mcpresume/caddy-mcp-resume/tests/harness"
)

func TestMain(m *testing.M) { harness.MainBothStores(m) }
