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

// Its tests mostly wait (reconnect backoffs up to the 10 s cap, upstreams
// that close their streams): each store's leg runs in two processes, side
// by side, as tests/e2e's.
func TestMain(m *testing.M) {
	harness.MainBothStores(m, harness.Shards{N: 2, Seconds: map[string]float64{
		"TestFollowsAStandaloneStreamTheServerCloses":      11,
		"TestAHugeRetryIsTheLongestWait":                   10,
		"TestFollowsAnUpstreamThatClosesItsStreams":        10,
		"TestStandaloneReconnectStorm":                     7,
		"TestPrimingOnlyStandaloneGETIsNotAskedForever":    6,
		"TestEmptyStandaloneGETIsNotAskedForever":          5,
		"TestIDlessStandaloneGreetingIsNotRepeatedForever": 3,
		"TestFollowsAnUpstreamConnectionThatDrops":         3,
	}})
}
