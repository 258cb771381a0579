package storetest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/buffer"
	"github.com/mcpresume/caddy-mcp-resume/internal/eventid"
	"github.com/mcpresume/caddy-mcp-resume/policy"
)

// env opens the stores of one test.
type env struct {
	t    *testing.T
	open func(t *testing.T, lim buffer.Limits) buffer.Store
}

// store opens a fresh store. Cleanup checks the invariant that no event
// ever left a log while a client could still ask for it.
func (e *env) store(lim buffer.Limits) buffer.Store {
	t := e.t
	t.Helper()
	st := e.open(t, lim)
	t.Cleanup(func() {
		noEarlyEviction(t, st)
		st.Close()
		noEarlyEviction(t, st)
	})
	return st
}

func noEarlyEviction(t testing.TB, st buffer.Store) {
	t.Helper()
	if n := st.Counters().EventsEvictedBeforeAck.Load(); n != 0 {
		t.Errorf("EventsEvictedBeforeAck = %d, must stay 0", n)
	}
}

// bigLimits never block or expire anything in small tests.
func bigLimits() buffer.Limits {
	return buffer.Limits{
		MaxStreamBytes:       64 << 20,
		MaxSessionBytes:      64 << 20,
		MaxTotalBytes:        256 << 20,
		MaxSessions:          1000,
		MaxStreamsPerSession: 1000,
		ResumeWindow:         time.Minute,
		StallTimeout:         time.Hour,
	}
}

const (
	evSize  = 36   // payload bytes of the small events most tests append
	bigSize = 1000 // payload bytes of the events that fill bounds
)

func mustSession(t testing.TB, st buffer.Store, id string) buffer.Session {
	t.Helper()
	s, err := st.CreateSession(id, buffer.SessionMeta{Version: "2025-06-18", Fingerprint: [32]byte{1}})
	if err != nil {
		t.Fatalf("CreateSession(%q): %v", id, err)
	}
	return s
}

var streamKeys atomic.Uint64

func mustStream(t testing.TB, s buffer.Session, ids ...string) buffer.Stream {
	t.Helper()
	if len(ids) == 0 {
		ids = []string{"1"}
	}
	var key [32]byte
	copy(key[:], strconv.FormatUint(streamKeys.Add(1), 10))
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

func mustAppend(t testing.TB, str buffer.Stream, data []byte) uint64 {
	t.Helper()
	seq, err := str.Append(context.Background(), fields(data), nil)
	if err != nil {
		t.Fatalf("Append: %v", err)
	}
	return seq
}

// appendN appends n events of size payload bytes and checks their seqs.
func appendN(t testing.TB, str buffer.Stream, n, size int) {
	t.Helper()
	for i := 0; i < n; i++ {
		want := str.View().Head + 1
		if seq := mustAppend(t, str, payload(want, size)); seq != want {
			t.Fatalf("Append gave seq %d, want %d", seq, want)
		}
	}
}

// fill appends events of size payload bytes until one blocks, and returns
// that blocked append and how many went in before it.
func fill(t testing.TB, str buffer.Stream, size, atMost int) (int, <-chan appendResult) {
	t.Helper()
	return fillCtx(t, context.Background(), str, size, atMost)
}

func fillCtx(t testing.TB, ctx context.Context, str buffer.Stream, size, atMost int) (int, <-chan appendResult) {
	t.Helper()
	for n := 0; n < atMost; n++ {
		seq := str.View().Head + 1
		ch := async(func() appendResult {
			seq, err := str.Append(ctx, fields(payload(seq, size)), nil)
			return appendResult{seq, err}
		})
		select {
		case r := <-ch:
			if r.err != nil || r.seq != seq {
				t.Fatalf("append %d: seq %d, %v", seq, r.seq, r.err)
			}
		case <-time.After(300 * time.Millisecond):
			return n, ch
		}
	}
	t.Fatalf("%d appends went in: no bound blocked", atMost)
	return 0, nil
}

// event is one event as a test looks at it: its seq and payload.
type event struct {
	Seq  uint64
	Data []byte
}

// decode splits a batch back into events and checks its framing: each is
// "id: <epoch>-<num>-<seq>", its data line, a blank line, seqs First..Last.
func decode(b buffer.Batch) ([]event, error) {
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
func read(ctx context.Context, r buffer.Reader, maxBytes int) ([]event, error) {
	b, err := r.Read(ctx, nil, maxBytes, time.Hour)
	evs, derr := decode(b)
	if derr != nil {
		return evs, derr
	}
	return evs, err
}

// readUntil reads events until it has got n or an error ends the stream.
func readUntil(t testing.TB, r buffer.Reader, n int) ([]event, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
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
func readAll(t testing.TB, r buffer.Reader) ([]event, error) {
	t.Helper()
	evs, err := readUntil(t, r, 1<<30)
	if errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("read did not end")
	}
	return evs, err
}

// deliver reads n events and marks them delivered, as a relay does.
func deliver(t testing.TB, r buffer.Reader, n int) []event {
	t.Helper()
	evs, err := readUntil(t, r, n)
	if err != nil {
		t.Fatalf("read: %v", err)
	}
	r.Delivered(evs[len(evs)-1].Seq)
	return evs
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

func asyncAppend(str buffer.Stream, data []byte) <-chan appendResult {
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
	case <-time.After(20 * time.Second):
		t.Fatal("Append still blocked")
		return appendResult{}
	}
}

// waitFor polls cond until it holds.
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// ack acknowledges a client position, as a resume that ends at once does:
// a gap whose stream has nothing left to send acknowledges without
// attaching.
func ack(t testing.TB, str buffer.Stream, seq uint64) {
	t.Helper()
	d, r, err := str.Resume(seq, func(policy.StreamView) policy.Resume {
		return policy.Resume{Kind: policy.Gap, Then: policy.ThenEnd}
	})
	if err != nil || r != nil || d.Kind != policy.Gap {
		t.Fatalf("ack(%d): %+v %v %v", seq, d, r, err)
	}
}

// floorOf is the stream's floor now.
func floorOf(str buffer.Stream) uint64 { return str.View().Floor }
