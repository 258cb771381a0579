package buffer

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/policy"
)

// fakeClock is the store's clock in tests; time moves only when told.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func newClock() *fakeClock {
	return &fakeClock{now: time.Date(2025, 6, 18, 12, 0, 0, 0, time.UTC)}
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

// bigLimits never block or expire anything in small tests.
func bigLimits() Limits {
	return Limits{
		MaxStreamBytes:       1 << 30,
		MaxSessionBytes:      1 << 30,
		MaxTotalBytes:        1 << 32,
		MaxSessions:          1000,
		MaxStreamsPerSession: 1000,
		ResumeWindow:         time.Minute,
		StallTimeout:         time.Hour,
	}
}

// newStore returns a store on a fake clock whose background sweeper never
// runs during a test (tests call Sweep). Cleanup checks the invariant that
// no event ever left a log while a client could still ask for it.
func newStore(t testing.TB, lim Limits) (*MemoryStore, *fakeClock) {
	t.Helper()
	clk := newClock()
	var hookMu sync.Mutex
	var early []string
	st := NewMemoryStore(Options{
		Limits:        lim,
		Now:           clk.Now,
		SweepInterval: time.Hour,
		Hooks: Hooks{EvictedBeforeAck: func(session string, stream uint32, seq uint64) {
			hookMu.Lock()
			early = append(early, fmt.Sprintf("%s/%d/%d", session, stream, seq))
			hookMu.Unlock()
		}},
	})
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

func assertNoEarlyEviction(t testing.TB, st *MemoryStore) {
	t.Helper()
	if n := st.Counters().EventsEvictedBeforeAck.Load(); n != 0 {
		t.Errorf("EventsEvictedBeforeAck = %d, must stay 0", n)
	}
}

func mustSession(t testing.TB, st Store, id string) Session {
	t.Helper()
	s, err := st.NewSession(id, SessionMeta{Version: "2025-06-18", Fingerprint: [32]byte{1}})
	if err != nil {
		t.Fatalf("NewSession(%q): %v", id, err)
	}
	return s
}

func mustStream(t testing.TB, s Session) Stream {
	t.Helper()
	str, err := s.NewStream(policy.RequestStream, []string{"1"})
	if err != nil {
		t.Fatalf("NewStream: %v", err)
	}
	return str
}

// payload is n bytes naming its seq, so misordered delivery is visible.
func payload(seq uint64, n int) []byte {
	b := make([]byte, n)
	s := fmt.Sprintf("e%d.", seq)
	for i := range b {
		b[i] = s[i%len(s)]
	}
	return b
}

func mustAppend(t testing.TB, str Stream, data []byte) uint64 {
	t.Helper()
	seq, err := str.Append(context.Background(), data, false)
	if err != nil {
		t.Fatalf("Append: %v", err)
	}
	return seq
}

// appendN appends n events of size bytes (payload only) and checks their seqs.
func appendN(t testing.TB, str Stream, n, size int) {
	t.Helper()
	for i := 0; i < n; i++ {
		want := str.View().Head + 1
		if seq := mustAppend(t, str, payload(want, size)); seq != want {
			t.Fatalf("Append gave seq %d, want %d", seq, want)
		}
	}
}

// readUntil reads events until it has got n or an error ends the stream.
func readUntil(t testing.TB, r Reader, n int) ([]Event, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var out []Event
	buf := make([]Event, 8)
	for len(out) < n {
		evs, err := r.Read(ctx, buf)
		out = append(out, evs...)
		if err != nil {
			return out, err
		}
	}
	return out, nil
}

// readAll reads to the end of the stream and returns the error that ended it.
func readAll(t testing.TB, r Reader) ([]Event, error) {
	t.Helper()
	evs, err := readUntil(t, r, 1<<30)
	if errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("read did not end")
	}
	return evs, err
}

func checkSeqs(t testing.TB, evs []Event, from uint64, size int) {
	t.Helper()
	for i, e := range evs {
		want := from + uint64(i)
		if e.Seq != want {
			t.Fatalf("event %d has seq %d, want %d", i, e.Seq, want)
		}
		if string(e.Data) != string(payload(want, size)) {
			t.Fatalf("event seq %d has data %q", e.Seq, e.Data)
		}
	}
}

// returnsWithin runs f and reports whether it returned within d.
func async[T any](f func() T) <-chan T {
	ch := make(chan T, 1)
	go func() { ch <- f() }()
	return ch
}

type appendResult struct {
	seq uint64
	err error
}

func asyncAppend(str Stream, data []byte) <-chan appendResult {
	return async(func() appendResult {
		seq, err := str.Append(context.Background(), data, false)
		return appendResult{seq, err}
	})
}

func assertBlocked(t testing.TB, ch <-chan appendResult, d time.Duration) {
	t.Helper()
	select {
	case r := <-ch:
		t.Fatalf("Append returned (%d, %v) while the log was full", r.seq, r.err)
	case <-time.After(d):
	}
}

func awaitAppend(t testing.TB, ch <-chan appendResult) appendResult {
	t.Helper()
	select {
	case r := <-ch:
		return r
	case <-time.After(10 * time.Second):
		t.Fatal("Append still blocked")
		return appendResult{}
	}
}

// waitFor polls cond until it holds.
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}
