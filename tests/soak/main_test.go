// Package soak tests sessions that run long, end to end: a real Caddy
// in-process with the module in front of the official-SDK demo server or a
// flood upstream on real loopback sockets, and raw clients whose
// connections drop, reset and pause while they make call after call. Every
// event arrives exactly once, and what a session keeps stays bounded.
//
// It was part of tests/backpressure; apart, its tests (which wait on the
// clock, not the CPU) run beside the other suites, and its two store legs
// side by side: nothing here measures the process.
package soak

import (
	"testing"

	"github.com/mcpresume/caddy-mcp-resume/tests/harness"
)

// Each leg runs in two processes: the 40 s soak in one, the rest in the
// other.
func TestMain(m *testing.M) {
	harness.MainBothStores(m, harness.Shards{N: 2, Seconds: map[string]float64{
		"TestSoakDisconnectResume":        47,
		"TestEndedStreamsLeaveTheSession": 21,
	}})
}
