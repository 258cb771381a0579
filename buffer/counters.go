package buffer

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/policy"
)

// Counters only ever grow; they outlive configuration reloads with their
// store, so exported metrics never reset on reload.
type Counters struct {
	EventsEnqueued atomic.Uint64
	EventsEvicted  atomic.Uint64
	// EventsEvictedBeforeAck counts events that left a log while a client
	// could still ask for them, or that a reader found gone. It must stay 0:
	// anything else is a bug.
	EventsEvictedBeforeAck atomic.Uint64
	// ResumesFromEvicted counts resumes whose cursor was below the floor.
	ResumesFromEvicted atomic.Uint64
	Stalls             atomic.Uint64 // appends that had to wait for room
	StallNanos         atomic.Uint64 // total time appends waited
	// TombstonesDropped counts ended sessions forgotten before their time
	// because MaxTombstones were remembered already.
	TombstonesDropped atomic.Uint64

	mu     sync.Mutex
	failed map[policy.Reason]uint64
}

func (c *Counters) addFailed(r policy.Reason) {
	c.mu.Lock()
	if c.failed == nil {
		c.failed = make(map[policy.Reason]uint64)
	}
	c.failed[r]++
	c.mu.Unlock()
}

// AddFailed counts a failed stream. Stores other than MemoryStore (which
// live in other packages) count their failures with it.
func (c *Counters) AddFailed(r policy.Reason) { c.addFailed(r) }

// FailedStreams returns the number of failed streams by reason.
func (c *Counters) FailedStreams() map[policy.Reason]uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	m := make(map[policy.Reason]uint64, len(c.failed))
	for k, v := range c.failed {
		m[k] = v
	}
	return m
}

// Hooks let the embedding layer log and meter what a store decides on its
// own. Any of them may be nil. They are called without store locks held.
type Hooks struct {
	StallStarted func(session string, stream uint32)
	StallEnded   func(session string, stream uint32, waited time.Duration)
	StreamFailed func(session string, stream uint32, reason policy.Reason)
	SessionEnded func(session string, reason policy.Reason)
	// EvictedBeforeAck fires if events left a log while a client could still
	// ask for them, or a reader found them gone. It never should.
	EvictedBeforeAck func(session string, stream uint32, seq uint64, n uint64)
	// TombstoneDropped fires when an ended session is forgotten early.
	TombstoneDropped func(session string)
}
