package buffer

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/internal/eventid"
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
		Key:           []byte("test key"),
		chunkSize:     1, // one chunk per event: exact, predictable byte counts
		Hooks: Hooks{EvictedBeforeAck: func(session string, stream uint32, seq, n uint64) {
			hookMu.Lock()
			early = append(early, fmt.Sprintf("%s/%d/%d+%d", session, stream, seq, n))
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
	s, err := st.CreateSession(id, SessionMeta{Version: "2025-06-18", Fingerprint: [32]byte{1}})
	if err != nil {
		t.Fatalf("CreateSession(%q): %v", id, err)
	}
	return s
}

var streamKeys uint64

func mustStream(t testing.TB, s Session, ids ...string) Stream {
	t.Helper()
	if len(ids) == 0 {
		ids = []string{"1"}
	}
	var key [32]byte
	streamKeys++
	copy(key[:], strconv.FormatUint(streamKeys, 10))
	str, err := s.NewStream(ids, key)
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

// fields is payload as the SSE fields a tap appends.
func fields(p []byte) []byte {
	return append(append([]byte("data: "), p...), '\n')
}

func mustAppend(t testing.TB, str Stream, data []byte) uint64 {
	t.Helper()
	seq, err := str.Append(context.Background(), fields(data), nil)
	if err != nil {
		t.Fatalf("Append: %v", err)
	}
	return seq
}

// appendN appends n events of size payload bytes and checks their seqs.
func appendN(t testing.TB, str Stream, n, size int) {
	t.Helper()
	for i := 0; i < n; i++ {
		want := str.View().Head + 1
		if seq := mustAppend(t, str, payload(want, size)); seq != want {
			t.Fatalf("Append gave seq %d, want %d", seq, want)
		}
	}
}

// event is one event as a test looks at it: its seq and payload.
type event struct {
	Seq  uint64
	Data []byte
}

// decode splits a batch back into events and checks its framing: each is
// "id: <epoch>-<num>-<seq>", its data line, a blank line, seqs First..Last.
func decode(b Batch) ([]event, error) {
	var out []event
	var all []byte
	for _, d := range b.Data {
		all = append(all, d...)
	}
	for len(all) > 0 {
		end := bytes.Index(all, []byte("\n\n"))
		if end < 0 || !bytes.HasPrefix(all, []byte("id: ")) {
			return out, fmt.Errorf("bad framing: %q", all)
		}
		ev := all[:end+1]
		all = all[end+2:]
		nl := bytes.IndexByte(ev, '\n')
		id, err := eventid.Parse(string(ev[4:nl]))
		if err != nil {
			return out, fmt.Errorf("bad id line %q", ev[:nl])
		}
		data := ev[nl+1:]
		if bytes.HasPrefix(data, []byte("data: ")) {
			data = bytes.TrimSuffix(data[len("data: "):], []byte("\n"))
		}
		out = append(out, event{Seq: id.Seq, Data: data})
	}
	if len(out) > 0 && (out[0].Seq != b.First || out[len(out)-1].Seq != b.Last) {
		return out, fmt.Errorf("batch says %d..%d, holds %d..%d", b.First, b.Last, out[0].Seq, out[len(out)-1].Seq)
	}
	return out, nil
}

// read reads one batch and decodes it.
func read(ctx context.Context, r Reader, maxBytes int) ([]event, error) {
	b, err := r.Read(ctx, nil, maxBytes, time.Hour)
	evs, derr := decode(b)
	if derr != nil {
		return evs, derr
	}
	return evs, err
}

// readUntil reads events until it has got n or an error ends the stream.
func readUntil(t testing.TB, r Reader, n int) ([]event, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var out []event
	for len(out) < n {
		evs, err := read(ctx, r, 1<<20)
		out = append(out, evs...)
		if err != nil {
			return out, err
		}
	}
	return out, nil
}

// readAll reads to the end of the stream and returns the error that ended it.
func readAll(t testing.TB, r Reader) ([]event, error) {
	t.Helper()
	evs, err := readUntil(t, r, 1<<30)
	if errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("read did not end")
	}
	return evs, err
}

func checkSeqs(t testing.TB, evs []event, from uint64, size int) {
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
		seq, err := str.Append(context.Background(), fields(data), nil)
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

// ack acknowledges a client position, as a resume does.
func ack(str Stream, seq uint64) { str.(*memStream).Ack(seq) }

// streamBytes is what a stream holds against the bounds now.
func streamBytes(str Stream) int64 {
	s := str.(*memStream)
	s.sess.store.budget.mu.Lock()
	defer s.sess.store.budget.mu.Unlock()
	return s.bytes
}

// costOf measures what appending n events of size payload bytes to a fresh
// stream under lim costs against the bounds.
func costOf(t testing.TB, lim Limits, n, size int) int64 {
	t.Helper()
	st := NewMemoryStore(Options{Limits: lim, SweepInterval: time.Hour})
	defer st.Close()
	str := mustStream(t, mustSession(t, st, "cost"))
	appendN(t, str, n, size)
	return streamBytes(str)
}

// evBytes is what one event of evSize payload bytes with a one-digit seq
// costs in a test store: its framing, its chunk's index and overhead.
const evBytes int64 = int64(len("id: ") + 8 + len("-1-1\n") + len("data: ") + evSize + len("\n\n") + minIndex*indexEntry + chunkOverhead)
