package buffer_test

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/buffer"
	"github.com/mcpresume/caddy-mcp-resume/buffer/storetest"
	"github.com/mcpresume/caddy-mcp-resume/policy"
)

// The memory store's own tests check what the contract (buffer/storetest,
// run on this store by storetest_test.go) cannot see through the
// interfaces in real time: exact byte accounting with one chunk per event,
// exact windows and timeouts on a fake clock, hooks, and internal state
// through export_test.go. They use the contract's kit for the rest.

const evSize = storetest.EvSize

// evBytes is what one event of evSize payload bytes with a one-digit seq
// costs in a test store: its framing, its chunk's index and overhead.
const evBytes = int64(len("id: ")+8+len("-1-1\n")+len("data: ")+evSize+len("\n\n")) + buffer.ChunkOverhead

// fakeClock is the store's clock in tests; time moves only when told.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// newStore returns a store with opts on a fake clock, one chunk per event
// (exact, predictable byte counts), whose background sweeper never runs
// during a test (tests call Sweep). Cleanup checks the invariant that no
// event ever left a log while a client could still ask for it.
func newStore(t testing.TB, opts buffer.Options) (*buffer.MemoryStore, *fakeClock) {
	t.Helper()
	clk := &fakeClock{now: time.Date(2025, 6, 18, 12, 0, 0, 0, time.UTC)}
	var hookMu sync.Mutex
	var early []string
	opts.Now = clk.Now
	opts.SweepInterval = time.Hour
	opts.Hooks.EvictedBeforeAck = func(session string, stream uint32, seq, n uint64) {
		hookMu.Lock()
		early = append(early, fmt.Sprintf("%s/%d/%d+%d", session, stream, seq, n))
		hookMu.Unlock()
	}
	st := buffer.NewMemoryStore(buffer.OneChunkPerEvent(opts))
	t.Cleanup(func() {
		assertNoEarlyEviction(t, st)
		st.Close()
		assertNoEarlyEviction(t, st)
		hookMu.Lock()
		defer hookMu.Unlock()
		if len(early) > 0 {
			t.Errorf("EvictedBeforeAck hook fired for %v", early)
		}
	})
	return st, clk
}

func assertNoEarlyEviction(t testing.TB, st *buffer.MemoryStore) {
	t.Helper()
	if n := st.Counters().EventsEvictedBeforeAck.Load(); n != 0 {
		t.Errorf("EventsEvictedBeforeAck = %d, must stay 0", n)
	}
}

// stallStore is a test store whose streams hold three events, with
// stall_timeout stall and resume_window window; hooks tells how many stalls
// its hooks heard start and end, and how many streams failed as stalled.
func stallStore(t *testing.T, stall, window time.Duration) (*buffer.MemoryStore, *fakeClock, func() (started, ended, failed int)) {
	lim := storetest.BigLimits()
	lim.MaxStreamBytes = 3 * evBytes
	lim.StallTimeout = stall
	lim.ResumeWindow = window
	var mu sync.Mutex
	var started, ended, failed int
	st, clk := newStore(t, buffer.Options{Limits: lim, Hooks: buffer.Hooks{
		StallStarted: func(string, uint32) { mu.Lock(); started++; mu.Unlock() },
		StallEnded:   func(string, uint32, time.Duration) { mu.Lock(); ended++; mu.Unlock() },
		StreamFailed: func(_ string, _ uint32, r policy.Reason) {
			mu.Lock()
			if r == policy.ReasonStalled {
				failed++
			}
			mu.Unlock()
		},
	}})
	return st, clk, func() (int, int, int) { mu.Lock(); defer mu.Unlock(); return started, ended, failed }
}

// newStream opens a request stream in a new session id of st, holding n
// events of evSize payload bytes.
func newStream(t testing.TB, st buffer.Store, id string, n int) buffer.Stream {
	t.Helper()
	str := storetest.MustStream(t, storetest.MustSession(t, st, id))
	storetest.AppendN(t, str, n, evSize)
	return str
}
