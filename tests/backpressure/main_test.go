// Package backpressure tests mcp-resume's backpressure and bounded memory
// end to end (issue 4): a real Caddy in-process with the module, real
// upstream MCP servers on real loopback sockets (a flood server written with
// net/http, and the official-SDK demo server), raw HTTP and official-SDK
// clients that stop reading, vanish, and come back.
//
// Only one in-process Caddy runs per process, so no test here is parallel:
// the tests overlap as processes (see harness.MainBothStores).
package backpressure

import (
	"testing"

	"github.com/mcpresume/caddy-mcp-resume/tests/harness"
)

// Its tests measure their process (heap growth, CPU) and mostly wait
// (stall timeouts, resume windows, slow readers): each store's leg runs in
// two processes, side by side; a test's figures are its own process's.
// Heap figures are given time to settle (see mcptest.SettledHeap and
// TestIdleStreamsGiveLargeBuffersBack), as other packages' tests load the
// machine too.
func TestMain(m *testing.M) {
	harness.MainBothStores(m, harness.Shards{N: 2, Seconds: map[string]float64{
		"TestManySessionsBoundedMemory":                22,
		"TestRepeatedRequestOverASlowLinkLosesNothing": 13,
		"TestRaisingStallTimeoutDoesNotSpin":           12,
		"TestRetainedBytesTrackTheHeap":                11,
		"TestIdleStreamsGiveLargeBuffersBack":          11,
		"TestSlowConsumerRelayMemory":                  10,
		"TestAFastReaderIsNeverFailed":                 7,
		"TestStreamBackpressureShortWindow":            4,
		"TestStreamBackpressureBoundsUpstream":         3,
		"TestMaxEventBytesIsOneSize":                   3,
	}})
}

// heapVersusRetained is why the heap tests run with the memory store only.
const heapVersusRetained = "it measures the process heap against retained_bytes; the JetStream store keeps events in JetStream (here an embedded server in the same heap), bounded by JetStream's max_bytes"
