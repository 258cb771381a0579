// Package shared tests mcp_resume with the shared store (NATS JetStream)
// the way operators run it: several real Caddy processes (cmd/caddy, built
// once per run) behind a load balancer, JetStream servers (single node,
// or a 3-node cluster) running in the test process with file storage,
// official Go SDK clients and the demo MCP server (official Go SDK, no
// event store). Replicas are stopped with SIGTERM, restarted and killed
// with SIGKILL while tool calls run.
package shared

import (
	"flag"
	"fmt"
	"os"
	"runtime"
	"strconv"
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
	waitersInParallel(8)
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// waitersInParallel lets n parallel tests run at once unless -parallel
// says otherwise. go test's default is GOMAXPROCS (2 on a 2-core machine),
// but these tests mostly wait (lease TTLs, restarts, kills, timeouts), each
// on its own processes and ports: more of them than cores can wait at once.
func waitersInParallel(n int) {
	flag.Parse()
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == "test.parallel" })
	if !set && runtime.GOMAXPROCS(0) < n {
		flag.Set("test.parallel", strconv.Itoa(n))
	}
}
