// Package backpressure tests mcp-resume's backpressure and bounded memory
// end to end (issue 4): a real Caddy in-process with the module, real
// upstream MCP servers on real loopback sockets (a flood server written with
// net/http, and the official-SDK demo server), raw HTTP and official-SDK
// clients that stop reading, vanish, and come back.
//
// Only one in-process Caddy runs at a time, so no test here is parallel.
package backpressure

import (
	"testing"

	"github.com/mcpresume/caddy-mcp-resume/tests/harness"
)

// Its legs run in turn: its tests measure the process (heap growth, stall
// clocks), and the other leg's load would be in their figures.
func TestMain(m *testing.M) { harness.MainBothStoresInTurn(m) }

// heapVersusRetained is why the heap tests run with the memory store only.
const heapVersusRetained = "it measures the process heap against retained_bytes; the JetStream store keeps events in JetStream (here an embedded server in the same heap), bounded by JetStream's max_bytes"
