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
)

// The kit: what the contract's tests do to a store, exported for a store's
// own tests (buffer's memory-specific ones among them), which would
// otherwise copy it.

// BigLimits never block or expire anything in small tests.
func BigLimits() buffer.Limits {
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

// EvSize is the payload bytes of the small events most tests append.
const EvSize = 36

// MustSession creates session id.
// MustProduce takes the producer role of str.
func MustProduce(t testing.TB, str buffer.Stream) buffer.Producer {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	p, err := str.TakeProducer(ctx)
	if err != nil {
		t.Fatalf("TakeProducer: %v", err)
	}
	return p
}

func MustSession(t testing.TB, st buffer.Store, id string) buffer.Session {
	t.Helper()
	s, err := st.CreateSession(id, buffer.SessionMeta{Version: "2025-06-18", Fingerprint: [32]byte{1}})
	if err != nil {
		t.Fatalf("CreateSession(%q): %v", id, err)
	}
	return s
}

var streamKeys atomic.Uint64

// MustStream opens a request stream for the requests ids (default "1"),
// under a request key no other stream of the process has.
func MustStream(t testing.TB, s buffer.Session, ids ...string) buffer.Stream {
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

// Payload is n bytes naming its seq, so misordered delivery is visible.
func Payload(seq uint64, n int) []byte {
	b := make([]byte, n)
	s := fmt.Sprintf("e%d.", seq)
	for i := range b {
		b[i] = s[i%len(s)]
	}
	return b
}

// Fields is p as the SSE fields a tap appends.
func Fields(p []byte) []byte {
	return append(append([]byte("data: "), p...), '\n')
}

// MustAppend appends the event whose payload is data and returns its seq.
func MustAppend(t testing.TB, str buffer.Stream, data []byte) uint64 {
	t.Helper()
	seq, err := str.Append(context.Background(), buffer.Entry{Fields: Fields(data)})
	if err != nil {
		t.Fatalf("Append: %v", err)
	}
	return seq
}

// AppendN appends n events of size payload bytes and checks their seqs.
func AppendN(t testing.TB, str buffer.Stream, n, size int) {
	t.Helper()
	for i := 0; i < n; i++ {
		want := str.View().Head + 1
		if seq := MustAppend(t, str, Payload(want, size)); seq != want {
			t.Fatalf("Append gave seq %d, want %d", seq, want)
		}
	}
}

// Event is one event as a test looks at it: its seq and payload.
type Event struct {
	Seq  uint64
	Data []byte
}

// Decode splits a batch back into events and checks its framing: each is
// "id: <epoch>-<num>-<seq>", its data line, a blank line, seqs First..Last.
func Decode(b buffer.Batch) ([]Event, error) {
	var out []Event
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
		out = append(out, Event{Seq: id.Seq, Data: data})
	}
	if len(out) > 0 && (out[0].Seq != b.First || out[len(out)-1].Seq != b.Last) {
		return out, fmt.Errorf("batch says %d..%d, holds %d..%d", b.First, b.Last, out[0].Seq, out[len(out)-1].Seq)
	}
	return out, nil
}

// Read reads one batch and decodes it, checking its framing.
func Read(ctx context.Context, r buffer.Reader, maxBytes int) ([]Event, error) {
	b, err := r.Read(ctx, nil, maxBytes, time.Hour)
	evs, derr := Decode(b)
	if derr != nil {
		return evs, derr
	}
	return evs, err
}

// ReadUntil reads events until it has got n or an error ends the stream.
func ReadUntil(t testing.TB, r buffer.Reader, n int) ([]Event, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var out []Event
	for len(out) < n {
		evs, err := Read(ctx, r, 1<<20)
		out = append(out, evs...)
		if err != nil {
			return out, err
		}
	}
	return out, nil
}

// ReadAll reads to the end of the stream and returns the error that ended it.
func ReadAll(t testing.TB, r buffer.Reader) ([]Event, error) {
	t.Helper()
	evs, err := ReadUntil(t, r, 1<<30)
	if errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("read did not end")
	}
	return evs, err
}

// Deliver reads n events and marks them delivered, as a relay does.
func Deliver(t testing.TB, r buffer.Reader, n int) []Event {
	t.Helper()
	evs, err := ReadUntil(t, r, n)
	if err != nil {
		t.Fatalf("read: %v", err)
	}
	r.Delivered(evs[len(evs)-1].Seq)
	return evs
}

// DeliverAndClose delivers n events to a reader from 1 and closes it: a
// connection that was sent them and went away.
func DeliverAndClose(t testing.TB, str buffer.Stream, n int) {
	t.Helper()
	r, err := str.Attach(1)
	if err != nil {
		t.Fatalf("Attach(1): %v", err)
	}
	Deliver(t, r, n)
	r.Close()
}

// CheckSeqs checks that evs are the events from seq from on, each of size
// payload bytes as AppendN appends them.
func CheckSeqs(t testing.TB, evs []Event, from uint64, size int) {
	t.Helper()
	for i, e := range evs {
		want := from + uint64(i)
		if e.Seq != want {
			t.Fatalf("event %d has seq %d, want %d", i, e.Seq, want)
		}
		if string(e.Data) != string(Payload(want, size)) {
			t.Fatalf("event seq %d has data %q", e.Seq, e.Data)
		}
	}
}

// Async runs f in a goroutine and hands its result on the channel.
func Async[T any](f func() T) <-chan T {
	ch := make(chan T, 1)
	go func() { ch <- f() }()
	return ch
}

// AppendResult is what an Append returned.
type AppendResult struct {
	Seq uint64
	Err error
}

// AsyncAppend appends the event whose payload is data in a goroutine.
func AsyncAppend(str buffer.Stream, data []byte) <-chan AppendResult {
	return Async(func() AppendResult {
		seq, err := str.Append(context.Background(), buffer.Entry{Fields: Fields(data)})
		return AppendResult{seq, err}
	})
}

// AssertBlocked checks that the append on ch is still blocked after d.
func AssertBlocked(t testing.TB, ch <-chan AppendResult, d time.Duration) {
	t.Helper()
	select {
	case r := <-ch:
		t.Fatalf("Append returned (%d, %v) while the log was full", r.Seq, r.Err)
	case <-time.After(d):
	}
}

// AwaitAppend waits for the append on ch to return.
func AwaitAppend(t testing.TB, ch <-chan AppendResult) AppendResult {
	t.Helper()
	select {
	case r := <-ch:
		return r
	case <-time.After(20 * time.Second):
		t.Fatal("Append still blocked")
		return AppendResult{}
	}
}

// WaitFor polls cond until it holds.
func WaitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}
