// Package shared tests mcp_resume with the shared store (NATS JetStream)
// the way operators run it: several real Caddy processes (cmd/caddy, built
// once per run) behind a load balancer, JetStream servers (single node,
// or a 3-node cluster) running in the test process with file storage,
// official Go SDK clients and the demo MCP server (official Go SDK, no
// event store). Replicas are stopped with SIGTERM, restarted and killed
// with SIGKILL while tool calls run.
package shared

import (
	"fmt"
	"os"
	"testing"

	"github.com/mcpresume/caddy-mcp-resume/internal/mcptest"
)

// caddyBin is the Caddy binary the replicas run; binDir holds it (and
// nats-server, once a test needs it).
var caddyBin, binDir string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "mcp-resume-shared-")
	if err != nil {
		panic(err)
	}
	binDir = dir
	caddyBin, err = mcptest.BuildCaddy(dir, raceEnabled)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}
