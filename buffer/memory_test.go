package buffer

import (
	"context"
	"errors"
	"io"
	"sync"
	"testing"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/policy"
)

const evSize = 36 // payload bytes; with EventOverhead an event holds 100 bytes
const evBytes = evSize + EventOverhead

func TestAppendReadComplete(t *testing.T) {
	st, _ := newStore(t, bigLimits())
	s := mustSession(t, st, "s1")
	str := mustStream(t, s)
	if v := str.View(); v.Floor != 1 || v.Head != 0 || v.State != policy.Live || v.Kind != policy.RequestStream {
		t.Fatalf("fresh stream view %+v", v)
	}
	appendN(t, str, 3, evSize)
	seq, err := str.Append(context.Background(), payload(4, evSize), true)
	if err != nil || seq != 4 {
		t.Fatalf("Append(response) = %d, %v", seq, err)
	}
	mustAppend(t, str, payload(5, evSize)) // a later response does not move ResponseSeq
	if _, err := str.Append(context.Background(), payload(6, evSize), true); err != nil {
		t.Fatal(err)
	}
	str.Complete()
	if v := str.View(); v.State != policy.Complete || v.Head != 6 || v.ResponseSeq != 4 {
		t.Fatalf("view after complete %+v", v)
	}
	if _, err := str.Append(context.Background(), payload(7, evSize), false); !errors.Is(err, ErrStreamEnded) {
		t.Fatalf("Append after Complete: %v, want ErrStreamEnded", err)
	}
	r, err := str.Attach(1)
	if err != nil {
		t.Fatal(err)
	}
	evs, err := readAll(t, r)
	if err != io.EOF {
		t.Fatalf("end of complete stream: %v, want io.EOF", err)
	}
	checkSeqs(t, evs, 1, evSize)
	if len(evs) != 6 {
		t.Fatalf("got %d events", len(evs))
	}
	// At the end, again: still EOF, nothing more.
	if evs, err := r.Read(context.Background(), make([]Event, 4)); len(evs) != 0 || err != io.EOF {
		t.Fatalf("second read at end: %d events, %v", len(evs), err)
	}
	// Attaching at head+1 of a complete stream: EOF at once.
	r2, err := str.Attach(7)
	if err != nil {
		t.Fatal(err)
	}
	if evs, err := r2.Read(context.Background(), make([]Event, 4)); len(evs) != 0 || err != io.EOF {
		t.Fatalf("read at head+1: %d events, %v", len(evs), err)
	}
	if n := st.Counters().EventsEnqueued.Load(); n != 6 {
		t.Errorf("EventsEnqueued = %d, want 6", n)
	}
	if got := str.RequestIDs(); len(got) != 1 || got[0] != "1" {
		t.Errorf("RequestIDs = %v", got)
	}
}

func TestReaderFollowsLive(t *testing.T) {
	st, _ := newStore(t, bigLimits())
	str := mustStream(t, mustSession(t, st, "s1"))
	r, err := str.Attach(1) // before the first event (priming position)
	if err != nil {
		t.Fatal(err)
	}
	got := async(func() []Event { evs, _ := readUntil(t, r, 3); return evs })
	time.Sleep(20 * time.Millisecond)
	appendN(t, str, 3, evSize)
	select {
	case evs := <-got:
		checkSeqs(t, evs, 1, evSize)
	case <-time.After(10 * time.Second):
		t.Fatal("reader did not follow live")
	}
	// A blocked read returns when its context ends.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if _, err := r.Read(ctx, make([]Event, 4)); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("read with expired context: %v", err)
	}
}

func TestReaderFailedStream(t *testing.T) {
	st, _ := newStore(t, bigLimits())
	str := mustStream(t, mustSession(t, st, "s1"))
	appendN(t, str, 2, evSize)
	str.Fail(policy.ReasonUpstreamFailed)
	str.Fail(policy.ReasonStalled) // the first reason sticks
	r, _ := str.Attach(1)
	evs, err := readAll(t, r)
	var fe *FailedError
	if !errors.As(err, &fe) || fe.Reason != policy.ReasonUpstreamFailed {
		t.Fatalf("end of failed stream: %v", err)
	}
	checkSeqs(t, evs, 1, evSize)
	if len(evs) != 2 {
		t.Fatalf("got %d events, want the 2 retained", len(evs))
	}
	if n := st.Counters().FailedStreams()[policy.ReasonUpstreamFailed]; n != 1 {
		t.Errorf("FailedStreams[upstream_failed] = %d", n)
	}
	if fe.Error() == "" {
		t.Error("empty error text")
	}
}

// ---- backpressure ----------------------------------------------------------

func TestBackpressureStreamBound(t *testing.T) {
	lim := bigLimits()
	lim.MaxStreamBytes = 10 * evBytes
	st, clk := newStore(t, lim)
	str := mustStream(t, mustSession(t, st, "s1"))
	appendN(t, str, 10, evSize)

	blocked := asyncAppend(str, payload(11, evSize))
	assertBlocked(t, blocked, 100*time.Millisecond)
	if s := st.Stats(); s.StalledStreams != 1 || s.RetainedBytes != 10*evBytes {
		t.Fatalf("stats while blocked: %+v", s)
	}
	// Time passing and sweeping evict nothing undelivered, and the stall
	// timeout (an hour) is not reached.
	clk.Advance(30 * time.Minute)
	st.Sweep()
	assertBlocked(t, blocked, 50*time.Millisecond)
	if v := str.View(); v.Floor != 1 || v.Head != 10 {
		t.Fatalf("view while blocked: %+v", v)
	}
	if n := st.Counters().EventsEvicted.Load(); n != 0 {
		t.Fatalf("EventsEvicted = %d while blocked, want 0", n)
	}
	if n := st.Counters().Stalls.Load(); n != 1 {
		t.Fatalf("Stalls = %d, want 1", n)
	}

	str.Ack(2) // the client holds 1..2: they go, and room appears
	r := awaitAppend(t, blocked)
	if r.err != nil || r.seq != 11 {
		t.Fatalf("unblocked Append = %d, %v", r.seq, r.err)
	}
	if v := str.View(); v.Floor != 3 || v.Head != 11 {
		t.Fatalf("view after ack: %+v", v)
	}
	if n := st.Counters().EventsEvicted.Load(); n != 2 {
		t.Fatalf("EventsEvicted = %d, want 2", n)
	}
	if s := st.Stats(); s.StalledStreams != 0 || s.RetainedBytes != 9*evBytes {
		t.Fatalf("stats after: %+v", s)
	}
	if st.Counters().StallNanos.Load() == 0 {
		t.Error("StallNanos not counted")
	}
}

func TestBackpressureSessionBound(t *testing.T) {
	lim := bigLimits()
	lim.MaxSessionBytes = 10 * evBytes
	st, _ := newStore(t, lim)
	s := mustSession(t, st, "s1")
	a, b := mustStream(t, s), mustStream(t, s)
	appendN(t, a, 6, evSize)
	appendN(t, b, 4, evSize)
	blocked := asyncAppend(b, payload(5, evSize))
	assertBlocked(t, blocked, 100*time.Millisecond)
	// Another session is not affected.
	other := mustStream(t, mustSession(t, st, "s2"))
	appendN(t, other, 5, evSize)
	assertBlocked(t, blocked, 10*time.Millisecond)
	if a.View().Floor != 1 || b.View().Floor != 1 || st.Counters().EventsEvicted.Load() != 0 {
		t.Fatal("something was evicted while blocked")
	}
	a.Ack(1) // room in the session, freed by the other stream
	if r := awaitAppend(t, blocked); r.err != nil || r.seq != 5 {
		t.Fatalf("unblocked Append = %d, %v", r.seq, r.err)
	}
}

// TestBackpressureTotalBound also shows the fair-share reserve in the store:
// a session above its share stays blocked while only a little is freed.
func TestBackpressureTotalBound(t *testing.T) {
	lim := bigLimits()
	lim.MaxTotalBytes = 10 * evBytes
	st, _ := newStore(t, lim)
	x := mustStream(t, mustSession(t, st, "x"))
	y := mustStream(t, mustSession(t, st, "y"))
	appendN(t, x, 5, evSize)
	appendN(t, y, 5, evSize) // total full: 10 events
	blocked := asyncAppend(y, payload(6, evSize))
	assertBlocked(t, blocked, 100*time.Millisecond)

	// One event frees room, but y would go above its fair share (half) and
	// into the reserve: still blocked.
	x.Ack(1)
	assertBlocked(t, blocked, 100*time.Millisecond)
	if v := y.View(); v.Head != 5 || v.Floor != 1 {
		t.Fatalf("y view %+v", v)
	}
	// x below its share may still use the room.
	appendN(t, x, 1, evSize)
	assertBlocked(t, blocked, 10*time.Millisecond)

	// x lets go of everything: y is the only session holding bytes now.
	x.Ack(6)
	if r := awaitAppend(t, blocked); r.err != nil || r.seq != 6 {
		t.Fatalf("unblocked Append = %d, %v", r.seq, r.err)
	}
	if s := st.Stats(); s.RetainedBytes != 6*evBytes {
		t.Fatalf("RetainedBytes = %d", s.RetainedBytes)
	}
}

func TestBackpressureUnblocksOnLimitRaise(t *testing.T) {
	lim := bigLimits()
	lim.MaxStreamBytes = 2 * evBytes
	st, _ := newStore(t, lim)
	str := mustStream(t, mustSession(t, st, "s1"))
	appendN(t, str, 2, evSize)
	blocked := asyncAppend(str, payload(3, evSize))
	assertBlocked(t, blocked, 50*time.Millisecond)
	lim.MaxStreamBytes = 3 * evBytes
	st.SetLimits(lim)
	if r := awaitAppend(t, blocked); r.err != nil || r.seq != 3 {
		t.Fatalf("Append after raising the bound = %d, %v", r.seq, r.err)
	}
	if st.Limits().MaxStreamBytes != 3*evBytes {
		t.Error("Limits not updated")
	}
}

func TestBlockedAppendEnds(t *testing.T) {
	lim := bigLimits()
	lim.MaxStreamBytes = evBytes
	st, _ := newStore(t, lim)
	s := mustSession(t, st, "s1")

	// context cancelled
	str := mustStream(t, s)
	appendN(t, str, 1, evSize)
	ctx, cancel := context.WithCancel(context.Background())
	ch := async(func() error { _, err := str.Append(ctx, payload(2, evSize), false); return err })
	time.Sleep(20 * time.Millisecond)
	cancel()
	if err := <-ch; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled Append: %v", err)
	}
	if str.View().State != policy.Live {
		t.Fatal("a cancelled append must not fail the stream")
	}

	// stream completed by someone else
	ch2 := asyncAppend(str, payload(2, evSize))
	assertBlocked(t, ch2, 20*time.Millisecond)
	str.Complete()
	if r := awaitAppend(t, ch2); !errors.Is(r.err, ErrStreamEnded) {
		t.Fatalf("Append on completed stream: %v", r.err)
	}

	// session deleted
	str3 := mustStream(t, s)
	appendN(t, str3, 1, evSize)
	ch3 := asyncAppend(str3, payload(2, evSize))
	assertBlocked(t, ch3, 20*time.Millisecond)
	st.Delete("s1", policy.ReasonDeleted)
	if r := awaitAppend(t, ch3); !errors.Is(r.err, ErrStreamEnded) {
		t.Fatalf("Append on deleted session: %v", r.err)
	}
	if b := st.Stats().RetainedBytes; b != 0 {
		t.Fatalf("RetainedBytes = %d after delete", b)
	}
}

func TestStall(t *testing.T) {
	lim := bigLimits()
	lim.MaxStreamBytes = 3 * evBytes
	lim.StallTimeout = 50 * time.Millisecond
	var mu sync.Mutex
	var started, ended, failed int
	clk := newClock()
	st := NewMemoryStore(Options{Limits: lim, Now: clk.Now, SweepInterval: time.Hour, Hooks: Hooks{
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
	t.Cleanup(func() { assertNoEarlyEviction(t, st); st.Close() })
	str := mustStream(t, mustSession(t, st, "s1"))
	appendN(t, str, 3, evSize)
	reader, _ := str.Attach(4) // a client at the end, waiting for more

	blocked := asyncAppend(str, payload(4, evSize))
	waitFor(t, "the append to stall", func() bool { return st.Stats().StalledStreams == 1 })
	assertBlocked(t, blocked, 100*time.Millisecond) // the store's clock has not moved
	clk.Advance(lim.StallTimeout)
	r := awaitAppend(t, blocked)
	var fe *FailedError
	if !errors.As(r.err, &fe) || fe.Reason != policy.ReasonStalled {
		t.Fatalf("stalled Append = %d, %v; want FailedError(stalled)", r.seq, r.err)
	}
	v := str.View()
	if v.State != policy.Failed || v.Head != 3 || v.Floor != 1 {
		t.Fatalf("view after stall: %+v (history must stay)", v)
	}
	_, err := readAll(t, reader)
	if !errors.As(err, &fe) || fe.Reason != policy.ReasonStalled {
		t.Fatalf("reader at the end got %v, want FailedError(stalled)", err)
	}
	// A resuming reader still gets the retained history, then the failure.
	r2, _ := str.Attach(1)
	evs, err := readAll(t, r2)
	checkSeqs(t, evs, 1, evSize)
	if len(evs) != 3 || !errors.As(err, &fe) {
		t.Fatalf("resume after stall: %d events, %v", len(evs), err)
	}
	if n := st.Counters().FailedStreams()[policy.ReasonStalled]; n != 1 {
		t.Errorf("FailedStreams[stalled] = %d", n)
	}
	if st.Stats().StalledStreams != 0 || st.Counters().EventsEvicted.Load() != 0 {
		t.Errorf("after stall: %+v, evicted %d", st.Stats(), st.Counters().EventsEvicted.Load())
	}
	mu.Lock()
	defer mu.Unlock()
	if started != 1 || ended != 1 || failed != 1 {
		t.Errorf("hooks: started %d ended %d failed %d", started, ended, failed)
	}
}

func TestTooLarge(t *testing.T) {
	for _, bound := range []string{"stream", "session", "total"} {
		t.Run(bound, func(t *testing.T) {
			lim := bigLimits()
			switch bound {
			case "stream":
				lim.MaxStreamBytes = 2 * evBytes
			case "session":
				lim.MaxSessionBytes = 2 * evBytes
			case "total":
				lim.MaxTotalBytes = 2 * evBytes
			}
			st, _ := newStore(t, lim)
			str := mustStream(t, mustSession(t, st, "s1"))
			_, err := str.Append(context.Background(), make([]byte, 2*evBytes), false)
			var fe *FailedError
			if !errors.As(err, &fe) || fe.Reason != policy.ReasonTooLarge {
				t.Fatalf("oversized Append: %v", err)
			}
			if str.View().State != policy.Failed {
				t.Fatal("stream not failed")
			}
		})
	}
}

// ---- eviction --------------------------------------------------------------

func TestEvictAcked(t *testing.T) {
	st, _ := newStore(t, bigLimits())
	str := mustStream(t, mustSession(t, st, "s1"))
	appendN(t, str, 5, evSize)
	str.Ack(3) // at once, no sweep needed
	if v := str.View(); v.Floor != 4 || v.Head != 5 {
		t.Fatalf("view after Ack(3): %+v", v)
	}
	if b := st.Stats().RetainedBytes; b != 2*evBytes {
		t.Fatalf("RetainedBytes = %d, want %d", b, 2*evBytes)
	}
	if _, err := str.Attach(3); !errors.Is(err, ErrBelowFloor) {
		t.Fatalf("Attach below floor: %v", err)
	}
	r, err := str.Attach(4)
	if err != nil {
		t.Fatal(err)
	}
	evs, _ := readUntil(t, r, 2)
	checkSeqs(t, evs, 4, evSize)
	str.Ack(1)    // lower ack: nothing changes
	str.Ack(1000) // beyond head: clamps
	if v := str.View(); v.Floor != 6 || v.Head != 5 {
		t.Fatalf("view after Ack(1000): %+v", v)
	}
	if b := st.Stats().RetainedBytes; b != 0 {
		t.Fatalf("RetainedBytes = %d", b)
	}
	// Appends continue after the acked position.
	if seq := mustAppend(t, str, payload(6, evSize)); seq != 6 {
		t.Fatalf("seq %d", seq)
	}
	if v := str.View(); v.Floor != 6 || v.Head != 6 {
		t.Fatalf("view %+v", v)
	}
}

func TestEvictDeliveredAfterWindow(t *testing.T) {
	lim := bigLimits()
	st, clk := newStore(t, lim)
	str := mustStream(t, mustSession(t, st, "s1"))
	appendN(t, str, 5, evSize)
	r, _ := str.Attach(1)
	readUntil(t, r, 5)
	r.Delivered(3) // only 1..3 were written and flushed
	st.Sweep()
	if v := str.View(); v.Floor != 1 {
		t.Fatalf("delivered events evicted before the window: %+v", v)
	}
	clk.Advance(lim.ResumeWindow - time.Nanosecond)
	st.Sweep()
	if v := str.View(); v.Floor != 1 {
		t.Fatalf("evicted inside the window: %+v", v)
	}
	clk.Advance(time.Nanosecond) // exactly the window
	st.Sweep()
	if v := str.View(); v.Floor != 4 {
		t.Fatalf("after the window: %+v, want floor 4 (4..5 undelivered)", v)
	}
	// Undelivered events never go, however long.
	clk.Advance(1000 * time.Hour)
	st.Sweep()
	if v := str.View(); v.Floor != 4 || v.Head != 5 {
		t.Fatalf("undelivered evicted: %+v", v)
	}
	if b := st.Stats().RetainedBytes; b != 2*evBytes {
		t.Fatalf("RetainedBytes = %d", b)
	}
	// Delivered later: they go one window after that delivery.
	r.Delivered(5)
	clk.Advance(lim.ResumeWindow / 2)
	st.Sweep()
	if str.View().Floor != 4 {
		t.Fatal("evicted early")
	}
	clk.Advance(lim.ResumeWindow / 2)
	st.Sweep()
	if v := str.View(); v.Floor != 6 || st.Stats().RetainedBytes != 0 {
		t.Fatalf("after second window: %+v", v)
	}
	if n := st.Counters().EventsEvicted.Load(); n != 5 {
		t.Fatalf("EventsEvicted = %d", n)
	}
}

func TestDeliveredByTakenOverReaderIgnored(t *testing.T) {
	st, clk := newStore(t, bigLimits())
	str := mustStream(t, mustSession(t, st, "s1"))
	appendN(t, str, 3, evSize)
	old, _ := str.Attach(1)
	readUntil(t, old, 3)
	if _, err := str.Attach(1); err != nil {
		t.Fatal(err)
	}
	old.Delivered(3) // too late: that connection no longer owns the stream
	clk.Advance(time.Hour)
	st.Sweep()
	if v := str.View(); v.Floor != 1 {
		t.Fatalf("evicted on a stale reader's delivery: %+v", v)
	}
}

func TestAckBelowDeliveredResetsDelivery(t *testing.T) {
	lim := bigLimits()
	st, clk := newStore(t, lim)
	str := mustStream(t, mustSession(t, st, "s1"))
	appendN(t, str, 5, evSize)
	r, _ := str.Attach(1)
	readUntil(t, r, 5)
	r.Delivered(5)
	clk.Advance(lim.ResumeWindow / 2)
	// The client resumes from 2: 3..5 were written to it but never arrived.
	str.Ack(2)
	if v := str.View(); v.Floor != 3 {
		t.Fatalf("after Ack(2): %+v", v)
	}
	clk.Advance(lim.ResumeWindow)
	st.Sweep()
	if v := str.View(); v.Floor != 3 {
		t.Fatalf("3..5 evicted although the ack reset their delivery: %+v", v)
	}
	// Delivered again on the new connection: then they age out.
	r2, err := str.Attach(3)
	if err != nil {
		t.Fatal(err)
	}
	evs, _ := readUntil(t, r2, 3)
	checkSeqs(t, evs, 3, evSize)
	r2.Delivered(5)
	clk.Advance(lim.ResumeWindow)
	st.Sweep()
	if v := str.View(); v.Floor != 6 {
		t.Fatalf("after redelivery and window: %+v", v)
	}
}

func TestDeleteSession(t *testing.T) {
	st, _ := newStore(t, bigLimits())
	meta := SessionMeta{Version: "2025-11-25", Fingerprint: [32]byte{9, 9}}
	s, err := st.NewSession("s1", meta)
	if err != nil {
		t.Fatal(err)
	}
	if s.ID() != "s1" || s.Meta() != meta || len(s.Epoch()) != 8 {
		t.Fatalf("session %q %+v %q", s.ID(), s.Meta(), s.Epoch())
	}
	a, b := mustStream(t, s), mustStream(t, s)
	appendN(t, a, 4, evSize)
	appendN(t, b, 3, evSize)
	keep := mustStream(t, mustSession(t, st, "s2"))
	appendN(t, keep, 2, evSize)
	r, _ := a.Attach(1)
	if st.Stats().RetainedBytes != 9*evBytes {
		t.Fatal("bytes before delete")
	}
	if !st.Delete("s1", policy.ReasonDeleted) {
		t.Fatal("Delete = false")
	}
	if st.Delete("s1", policy.ReasonDeleted) {
		t.Fatal("second Delete = true")
	}
	if b := st.Stats().RetainedBytes; b != 2*evBytes {
		t.Fatalf("RetainedBytes = %d after delete, want only s2's", b)
	}
	select {
	case <-r.Done():
	default:
		t.Fatal("reader not done after delete")
	}
	if _, err := r.Read(context.Background(), make([]Event, 4)); !errors.Is(err, ErrSessionGone) {
		t.Fatalf("read after delete: %v", err)
	}
	if s.Context().Err() == nil {
		t.Fatal("session context not cancelled")
	}
	if _, ok := st.Session("s1"); ok {
		t.Fatal("session still there")
	}
	tomb, ok := st.Tombstone("s1")
	if !ok || tomb.Reason != policy.ReasonDeleted || tomb.Epoch != s.Epoch() || tomb.Fingerprint != meta.Fingerprint {
		t.Fatalf("tombstone %+v, %v", tomb, ok)
	}
	if _, err := s.NewStream(policy.RequestStream, nil); !errors.Is(err, ErrSessionGone) {
		t.Fatalf("NewStream on deleted session: %v", err)
	}
	if _, err := a.Attach(5); !errors.Is(err, ErrSessionGone) {
		t.Fatalf("Attach on deleted session: %v", err)
	}
	if st.Counters().EventsEvicted.Load() != 7 {
		t.Fatalf("EventsEvicted = %d", st.Counters().EventsEvicted.Load())
	}
	// A new session under the same id clears the tombstone.
	mustSession(t, st, "s1")
	if _, ok := st.Tombstone("s1"); ok {
		t.Fatal("tombstone survived re-creation")
	}
	st.Delete("s2", policy.ReasonDeleted)
	st.Delete("s1", policy.ReasonDeleted)
	if s := st.Stats(); s.RetainedBytes != 0 || s.Sessions != 0 {
		t.Fatalf("stats after deleting all: %+v", s)
	}
}

func TestIdleExpiry(t *testing.T) {
	lim := bigLimits()
	lim.SessionIdleTimeout = 10 * time.Minute
	var mu sync.Mutex
	var ended []policy.Reason
	clk := newClock()
	st := NewMemoryStore(Options{Limits: lim, Now: clk.Now, SweepInterval: time.Hour, Hooks: Hooks{
		SessionEnded: func(_ string, r policy.Reason) { mu.Lock(); ended = append(ended, r); mu.Unlock() },
	}})
	t.Cleanup(func() { assertNoEarlyEviction(t, st); st.Close() })

	idle := mustSession(t, st, "idle")
	appendN(t, mustStream(t, idle), 3, evSize)
	touched := mustSession(t, st, "touched")
	connected := mustSession(t, st, "connected")
	cstr := mustStream(t, connected)
	r, _ := cstr.Attach(1)

	clk.Advance(lim.SessionIdleTimeout - time.Second)
	touched.Touch()
	st.Sweep()
	if st.Stats().Sessions != 3 {
		t.Fatal("expired early")
	}
	clk.Advance(time.Second)
	st.Sweep()
	if _, ok := st.Session("idle"); ok {
		t.Fatal("idle session not expired")
	}
	if tomb, ok := st.Tombstone("idle"); !ok || tomb.Reason != policy.ReasonExpired {
		t.Fatalf("tombstone %+v %v", tomb, ok)
	}
	if _, ok := st.Session("touched"); !ok {
		t.Fatal("touched session expired")
	}
	if _, ok := st.Session("connected"); !ok {
		t.Fatal("connected session expired")
	}
	if st.Stats().RetainedBytes != 0 {
		t.Fatalf("RetainedBytes = %d", st.Stats().RetainedBytes)
	}
	clk.Advance(lim.SessionIdleTimeout)
	st.Sweep()
	if _, ok := st.Session("touched"); ok {
		t.Fatal("touched session outlived its idle timeout")
	}
	if _, ok := st.Session("connected"); !ok {
		t.Fatal("a session with a client connected expired")
	}
	// Once the client leaves, the idle clock starts from then.
	r.Close()
	clk.Advance(lim.SessionIdleTimeout - time.Second)
	st.Sweep()
	if _, ok := st.Session("connected"); !ok {
		t.Fatal("expired before its idle timeout after disconnect")
	}
	clk.Advance(time.Second)
	st.Sweep()
	if _, ok := st.Session("connected"); ok {
		t.Fatal("not expired after disconnect + idle timeout")
	}
	mu.Lock()
	defer mu.Unlock()
	if len(ended) != 3 || ended[0] != policy.ReasonExpired {
		t.Fatalf("SessionEnded hooks: %v", ended)
	}
}

// ---- readers ---------------------------------------------------------------

func TestTakeover(t *testing.T) {
	st, _ := newStore(t, bigLimits())
	str := mustStream(t, mustSession(t, st, "s1"))
	appendN(t, str, 4, evSize)
	r1, _ := str.Attach(1)
	evs, _ := readUntil(t, r1, 2)
	checkSeqs(t, evs[:2], 1, evSize)
	// r1 blocks at the end in another goroutine.
	waiting := async(func() error {
		_, err := readUntil(t, r1, 100)
		return err
	})
	time.Sleep(20 * time.Millisecond)

	r2, err := str.Attach(3)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-r1.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("old reader's Done not closed")
	}
	select {
	case err := <-waiting:
		if !errors.Is(err, ErrTakenOver) {
			t.Fatalf("old reader got %v, want ErrTakenOver", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("old reader still blocked after takeover")
	}
	// Even with events available, the old reader gets nothing more.
	if evs, err := r1.Read(context.Background(), make([]Event, 4)); len(evs) != 0 || !errors.Is(err, ErrTakenOver) {
		t.Fatalf("old reader read %d, %v", len(evs), err)
	}
	select {
	case <-r2.Done():
		t.Fatal("new reader done")
	default:
	}
	if c := st.Stats().Connected; c != 1 {
		t.Fatalf("Connected = %d, want 1", c)
	}
	appendN(t, str, 2, evSize)
	evs, err = readUntil(t, r2, 4)
	if err != nil {
		t.Fatal(err)
	}
	checkSeqs(t, evs, 3, evSize)
	r1.Close() // closing a taken-over reader must not detach the new one
	if c := st.Stats().Connected; c != 1 {
		t.Fatalf("Connected = %d after closing the old reader", c)
	}
	info := st.Sessions()[0].Streams[0]
	if !info.Connected {
		t.Fatal("stream shows no connection")
	}
	r2.Close()
	if c := st.Stats().Connected; c != 0 {
		t.Fatalf("Connected = %d after closing both", c)
	}
}

func TestStandaloneAndLimits(t *testing.T) {
	lim := bigLimits()
	lim.MaxSessions = 2
	lim.MaxStreamsPerSession = 2
	st, _ := newStore(t, lim)
	s := mustSession(t, st, "s1")
	if _, err := st.NewSession("s1", SessionMeta{}); !errors.Is(err, ErrSessionExists) {
		t.Fatalf("duplicate session: %v", err)
	}
	mustSession(t, st, "s2")
	if _, err := st.NewSession("s3", SessionMeta{}); !errors.Is(err, ErrTooManySessions) {
		t.Fatalf("third session: %v", err)
	}

	g1, err := s.Standalone()
	if err != nil {
		t.Fatal(err)
	}
	g2, err := s.Standalone()
	if err != nil {
		t.Fatal(err)
	}
	if g1 != g2 || g1.Kind() != policy.StandaloneStream {
		t.Fatalf("Standalone twice: %v %v", g1, g2)
	}
	if got, ok := s.Stream(g1.Num()); !ok || got != g1 {
		t.Fatal("Stream(num) does not find the standalone stream")
	}
	p := mustStream(t, s) // second active stream
	if p.Num() == g1.Num() {
		t.Fatal("stream numbers collide")
	}
	if _, err := s.NewStream(policy.RequestStream, nil); !errors.Is(err, ErrTooManyStreams) {
		t.Fatalf("third stream: %v", err)
	}
	// Only live streams count: a complete one frees its slot at once, even
	// while it still holds events (the byte bounds cover those).
	appendN(t, p, 1, evSize)
	p.Complete()
	q, err := s.NewStream(policy.RequestStream, nil)
	if err != nil {
		t.Fatalf("stream after the old one completed: %v", err)
	}
	p.Ack(1)
	if q.Num() != 3 {
		t.Fatalf("stream number %d, want 3", q.Num())
	}
	// Its metadata stays: a late resume can still be answered.
	if v := p.View(); v.Head != 1 || v.Floor != 2 || v.State != policy.Complete {
		t.Fatalf("completed stream view %+v", v)
	}
	if _, ok := s.Stream(99); ok {
		t.Fatal("Stream(99) found")
	}
	if !g1.ClaimProducer() || g1.ClaimProducer() {
		t.Fatal("ClaimProducer must succeed once")
	}
	if st.Stats().Producing != 1 {
		t.Fatal("Producing gauge")
	}
	g1.ReleaseProducer()
	if !g1.ClaimProducer() {
		t.Fatal("ClaimProducer after release")
	}
	info := s.Info()
	if len(info.Streams) != 3 || info.Streams[0].Kind != "standalone" || info.Streams[1].State != "complete" {
		t.Fatalf("info %+v", info)
	}
}

func TestCloseStore(t *testing.T) {
	st := NewMemoryStore(Options{Limits: bigLimits()})
	str := mustStream(t, mustSession(t, st, "s1"))
	appendN(t, str, 2, evSize)
	r, _ := str.Attach(3)
	done := async(func() error { _, err := readAll(t, r); return err })
	st.Close()
	// The waiting reader learns that its session ended: either from its
	// reader (ErrSessionGone) or from the stream (failed, reason deleted).
	var fe *FailedError
	if err := <-done; !errors.Is(err, ErrSessionGone) && !(errors.As(err, &fe) && fe.Reason == policy.ReasonDeleted) {
		t.Fatalf("reader after Close: %v", err)
	}
	if s := st.Stats(); s.Sessions != 0 || s.RetainedBytes != 0 {
		t.Fatalf("stats after close %+v", s)
	}
	assertNoEarlyEviction(t, st)
}

func TestStandaloneAfterFailure(t *testing.T) {
	st, _ := newStore(t, bigLimits())
	s := mustSession(t, st, "s1")
	g1, _ := s.Standalone()
	g1.Fail(policy.ReasonUpstreamFailed)
	g2, err := s.Standalone()
	if err != nil {
		t.Fatal(err)
	}
	if g2 == g1 || g2.View().State != policy.Live || g2.Kind() != policy.StandaloneStream {
		t.Fatalf("Standalone after failure: same=%v view %+v", g2 == g1, g2.View())
	}
	if g3, _ := s.Standalone(); g3 != g2 {
		t.Fatal("Standalone not stable after re-creation")
	}
	if n := s.ActiveStreams(); n != 1 {
		t.Fatalf("ActiveStreams = %d, want 1 (the failed one holds nothing)", n)
	}
}

func TestStandaloneReaderEndsWithoutProducer(t *testing.T) {
	st, _ := newStore(t, bigLimits())
	s := mustSession(t, st, "s1")
	g, _ := s.Standalone()
	if !g.ClaimProducer() || !g.Producing() {
		t.Fatal("ClaimProducer")
	}
	appendN(t, g, 2, evSize)
	r, _ := g.Attach(1)
	evs, err := readUntil(t, r, 2)
	if err != nil {
		t.Fatal(err)
	}
	checkSeqs(t, evs, 1, evSize)
	ended := async(func() error { _, err := readAll(t, r); return err })
	time.Sleep(20 * time.Millisecond)
	g.ReleaseProducer() // the upstream GET ended: a caught-up reader ends too
	if err := <-ended; !errors.Is(err, ErrProducerGone) {
		t.Fatalf("caught-up standalone reader got %v, want ErrProducerGone", err)
	}
	// A reader behind the head still gets the retained events first.
	r2, _ := g.Attach(1)
	evs, err = readAll(t, r2)
	if len(evs) != 2 || !errors.Is(err, ErrProducerGone) {
		t.Fatalf("behind reader: %d events, %v", len(evs), err)
	}
}

func TestAttachFromUndelivered(t *testing.T) {
	st, _ := newStore(t, bigLimits())
	str := mustStream(t, mustSession(t, st, "s1"))
	appendN(t, str, 5, evSize)
	r, _ := str.Attach(FromUndelivered)
	evs, _ := readUntil(t, r, 5)
	checkSeqs(t, evs, 1, evSize)
	r.Delivered(3)
	r2, _ := str.Attach(FromUndelivered) // a reconnect without Last-Event-ID
	evs, _ = readUntil(t, r2, 2)
	checkSeqs(t, evs, 4, evSize)
	str.Ack(4)
	r3, _ := str.Attach(FromUndelivered)
	evs, _ = readUntil(t, r3, 1)
	checkSeqs(t, evs, 5, evSize)
}

// TestReadFillsCapacity: Read fills buf's capacity (callers pass buf[:0]).
func TestReadFillsCapacity(t *testing.T) {
	st, _ := newStore(t, bigLimits())
	str := mustStream(t, mustSession(t, st, "s1"))
	appendN(t, str, 10, evSize)
	r, _ := str.Attach(1)
	buf := make([]Event, 0, 4)
	evs, err := r.Read(context.Background(), buf)
	if err != nil || len(evs) != 4 || &evs[0] != &buf[:1][0] {
		t.Fatalf("Read(buf[:0] cap 4) = %d events, %v (or not in buf's array)", len(evs), err)
	}
	checkSeqs(t, evs, 1, evSize)
	evs, _ = r.Read(context.Background(), evs[:0])
	checkSeqs(t, evs, 5, evSize)
}
