package storetest

import (
	"context"
	"testing"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/buffer"
	"github.com/mcpresume/caddy-mcp-resume/policy"
)

// env opens the stores of one test.
type env struct {
	t    *testing.T
	open func(t *testing.T, lim buffer.Limits) buffer.Backend
}

// store opens a fresh store. Cleanup checks the invariant that no event
// ever left a log while a client could still ask for it.
func (e *env) store(lim buffer.Limits) buffer.Backend {
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

// stream opens a fresh store under lim with one request stream, of a
// session "s1", holding n events of EvSize payload bytes.
func (e *env) stream(lim buffer.Limits, n int) (buffer.Backend, buffer.Stream) {
	e.t.Helper()
	st := e.store(lim)
	str := MustStream(e.t, MustSession(e.t, st, "s1"))
	AppendN(e.t, str, n, EvSize)
	return st, str
}

func noEarlyEviction(t testing.TB, st buffer.Inspector) {
	t.Helper()
	if n := st.Counters().EventsEvictedBeforeAck.Load(); n != 0 {
		t.Errorf("EventsEvictedBeforeAck = %d, must stay 0", n)
	}
}

// bigSize is the payload bytes of the events that fill bounds.
const bigSize = 1000

// fill appends events of size payload bytes until one blocks, and returns
// that blocked append and how many went in before it.
func fill(t testing.TB, str buffer.Stream, size, atMost int) (int, <-chan AppendResult) {
	t.Helper()
	return fillCtx(t, context.Background(), str, size, atMost)
}

func fillCtx(t testing.TB, ctx context.Context, str buffer.Stream, size, atMost int) (int, <-chan AppendResult) {
	t.Helper()
	for n := 0; n < atMost; n++ {
		seq := str.View().Head + 1
		ch := Async(func() AppendResult {
			seq, err := str.Append(ctx, buffer.Entry{Fields: Fields(Payload(seq, size))})
			return AppendResult{seq, err}
		})
		select {
		case r := <-ch:
			if r.Err != nil || r.Seq != seq {
				t.Fatalf("append %d: seq %d, %v", seq, r.Seq, r.Err)
			}
		case <-time.After(300 * time.Millisecond):
			return n, ch
		}
	}
	t.Fatalf("%d appends went in: no bound blocked", atMost)
	return 0, nil
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

// infoOf is what the store's Inspector says of session s.
func infoOf(t testing.TB, st buffer.Inspector, s buffer.Session) buffer.SessionInfo {
	t.Helper()
	info, ok := st.SessionInfo(s.ID())
	if !ok {
		t.Fatalf("SessionInfo(%q): not found", s.ID())
	}
	return info
}

// streamInfoOf is the operator's view of str, the only stream of its number
// in st's sessions.
func streamInfoOf(t testing.TB, st buffer.Inspector, str buffer.Stream) buffer.StreamInfo {
	t.Helper()
	for _, s := range st.Sessions() {
		for _, si := range s.Streams {
			if si.Num == str.Num() {
				return si
			}
		}
	}
	t.Fatalf("stream %d: not in any session", str.Num())
	return buffer.StreamInfo{}
}
