// Package storetest is the contract of buffer.Store, as tests any store
// must pass through the interfaces alone: buffer's MemoryStore and the
// JetStream store alike. Time is real and windows are short, so the suite
// runs against stores whose clocks cannot be faked. Its helpers (kit.go)
// serve a store's own tests too.
//
// Files: storetest.go (Run), events.go, backpressure.go, eviction.go,
// readers.go, sessions.go (the core seam's contracts), upstream.go (the
// upstream cursor's), capabilities.go (each optional capability's, run
// where the store has it, and the Inspector's), helpers.go and kit.go.
package storetest

import (
	"testing"

	"github.com/mcpresume/caddy-mcp-resume/buffer"
)

type contract struct {
	name string
	fn   func(t *testing.T, e *env)
}

// Run runs the contract. open returns a fresh, empty store with limits lim
// (its sweeper running every few tens of milliseconds); each test closes
// its stores.
func Run(t *testing.T, open func(t *testing.T, lim buffer.Limits) buffer.Backend) {
	var all []contract
	all = append(all, eventContracts...)
	all = append(all, backpressureContracts...)
	all = append(all, evictionContracts...)
	all = append(all, readerContracts...)
	all = append(all, sessionContracts...)
	all = append(all, upstreamContracts...)
	all = append(all, capabilityContracts...)
	for _, c := range all {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			c.fn(t, &env{t: t, open: open})
		})
	}
}
