package storetest

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/buffer"
	"github.com/mcpresume/caddy-mcp-resume/policy"
)

var backpressureContracts = []contract{
	{"BackpressureStreamBound", testBackpressureStream},
	{"BackpressureSessionBound", testBackpressureSession},
	{"BackpressureTotalBoundAndReserve", testBackpressureTotal},
	{"BackpressureUnblocksOnLimitRaise", testLimitRaise},
	{"BlockedAppendEnds", testBlockedAppendEnds},
	{"Stall", testStall},
	{"FastReaderNeverStalls", testFastReaderNeverStalls},
	{"ProgressingReaderNeverStalls", testProgressingReaderNeverStalls},
}

// A full stream blocks its producer, evicts nothing undelivered, and
// unblocks when a resume acknowledges what the client holds.
func testBackpressureStream(t *testing.T, e *env) {
	lim := BigLimits()
	lim.MaxStreamBytes = 8 << 10
	st, str := e.stream(lim, 0)
	n, blocked := fill(t, str, bigSize, 100)
	if n < 3 || n > 8 {
		t.Fatalf("%d events of %d bytes fit %d bytes", n, bigSize, lim.MaxStreamBytes)
	}
	AssertBlocked(t, blocked, 200*time.Millisecond)
	if s := st.Stats(); s.StalledStreams != 1 || s.RetainedBytes == 0 {
		t.Fatalf("stats while blocked: %+v", s)
	}
	if v := str.View(); v.Floor != 1 || v.Head != uint64(n) {
		t.Fatalf("view while blocked: %+v", v)
	}
	if got := st.Counters().EventsEvicted.Load(); got != 0 {
		t.Fatalf("EventsEvicted = %d while blocked", got)
	}
	if got := st.Counters().Stalls.Load(); got != 1 {
		t.Fatalf("Stalls = %d, want 1", got)
	}
	if si := streamInfoOf(t, st, str); !si.Stalled || si.Stalls != 1 {
		t.Fatalf("the stream's info while blocked: stalled %v, stalls %d; want true, 1", si.Stalled, si.Stalls)
	}
	ack(t, str, 2) // the client holds 1..2: they go, and room appears
	if r := AwaitAppend(t, blocked); r.Err != nil || r.Seq != uint64(n+1) {
		t.Fatalf("unblocked Append = %d, %v", r.Seq, r.Err)
	}
	if v := str.View(); v.Floor != 3 || v.Head != uint64(n+1) {
		t.Fatalf("view after ack: %+v", v)
	}
	if got := st.Counters().EventsEvicted.Load(); got != 2 {
		t.Fatalf("EventsEvicted = %d, want 2", got)
	}
	WaitFor(t, "the stall to end", func() bool { return st.Stats().StalledStreams == 0 })
	if st.Counters().StallNanos.Load() == 0 {
		t.Error("StallNanos not counted")
	}
}

func testBackpressureSession(t *testing.T, e *env) {
	lim := BigLimits()
	lim.MaxSessionBytes = 8 << 10
	st := e.store(lim)
	s := MustSession(t, st, "s1")
	a, b := MustStream(t, s), MustStream(t, s)
	AppendN(t, a, 3, bigSize)
	_, blocked := fill(t, b, bigSize, 100)
	AssertBlocked(t, blocked, 200*time.Millisecond)
	// Another session is not affected.
	other := MustStream(t, MustSession(t, st, "s2"))
	AppendN(t, other, 5, bigSize)
	AssertBlocked(t, blocked, 10*time.Millisecond)
	if floorOf(a) != 1 || floorOf(b) != 1 || st.Counters().EventsEvicted.Load() != 0 {
		t.Fatal("something was evicted while blocked")
	}
	ack(t, a, 3) // room in the session, freed by the other stream
	if r := AwaitAppend(t, blocked); r.Err != nil {
		t.Fatalf("unblocked Append = %d, %v", r.Seq, r.Err)
	}
}

// The total bound, with its reserve: a quarter of the total is kept for
// streams a client is reading. Small stream bounds keep every store's
// accounting close to the events' bytes.
func testBackpressureTotal(t *testing.T, e *env) {
	lim := BigLimits()
	lim.MaxStreamBytes = 8 << 10
	lim.MaxTotalBytes = 32 << 10
	st := e.store(lim)
	var full []buffer.Stream
	for i := 0; i < 4; i++ { // detached streams: three quarters at most
		x := MustStream(t, MustSession(t, st, fmt.Sprintf("x%d", i)))
		ctx, cancel := context.WithCancel(context.Background())
		_, blocked := fillCtx(t, ctx, x, bigSize, 100)
		cancel()
		if r := AwaitAppend(t, blocked); !errors.Is(r.Err, context.Canceled) {
			t.Fatalf("cancelled append: %v", r.Err)
		}
		full = append(full, x)
	}
	w := MustStream(t, MustSession(t, st, "w"))
	bw := AsyncAppend(w, Payload(1, bigSize))
	AssertBlocked(t, bw, 300*time.Millisecond)

	// A client reading z may use the reserve.
	z := MustStream(t, MustSession(t, st, "z"))
	rz, err := z.Attach(1)
	if err != nil {
		t.Fatal(err)
	}
	AppendN(t, z, 2, bigSize)
	AssertBlocked(t, bw, 100*time.Millisecond)
	Deliver(t, rz, 2)
	rz.Close()

	// x0 lets go of everything: room for w outside the reserve again.
	ack(t, full[0], full[0].View().Head)
	if r := AwaitAppend(t, bw); r.Err != nil || r.Seq != 1 {
		t.Fatalf("unblocked Append = %d, %v", r.Seq, r.Err)
	}
}

func testLimitRaise(t *testing.T, e *env) {
	lim := BigLimits()
	lim.MaxStreamBytes = 4 << 10
	st, str := e.stream(lim, 0)
	n, blocked := fill(t, str, bigSize, 100)
	AssertBlocked(t, blocked, 50*time.Millisecond)
	lim.MaxStreamBytes = 64 << 10
	st.SetLimits(lim)
	if r := AwaitAppend(t, blocked); r.Err != nil || r.Seq != uint64(n+1) {
		t.Fatalf("Append after raising the bound = %d, %v", r.Seq, r.Err)
	}
}

func testBlockedAppendEnds(t *testing.T, e *env) {
	lim := BigLimits()
	lim.MaxStreamBytes = 2 << 10
	st := e.store(lim)
	s := MustSession(t, st, "s1")

	// context cancelled
	str := MustStream(t, s)
	n, _ := fill(t, str, bigSize, 100)
	ctx, cancel := context.WithCancel(context.Background())
	ch := Async(func() error { _, err := str.Append(ctx, buffer.Entry{Fields: Fields(Payload(9, bigSize))}); return err })
	time.Sleep(50 * time.Millisecond)
	cancel()
	select {
	case err := <-ch:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("cancelled Append: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("cancelled Append still blocked")
	}
	if str.View().State != policy.Live {
		t.Fatal("a cancelled append must not fail the stream")
	}
	_ = n

	// stream completed by someone else (the first fill's blocked append
	// ends too)
	ch2 := AsyncAppend(str, Payload(9, bigSize))
	AssertBlocked(t, ch2, 50*time.Millisecond)
	str.Complete()
	if r := AwaitAppend(t, ch2); !errors.Is(r.Err, buffer.ErrStreamEnded) {
		t.Fatalf("Append on completed stream: %v", r.Err)
	}

	// session deleted
	str3 := MustStream(t, s)
	_, ch3 := fill(t, str3, bigSize, 100)
	st.Delete("s1", policy.ReasonDeleted)
	if r := AwaitAppend(t, ch3); !errors.Is(r.Err, buffer.ErrStreamEnded) {
		t.Fatalf("Append on deleted session: %v", r.Err)
	}
	WaitFor(t, "the deleted session's bytes to go", func() bool { return st.Stats().RetainedBytes == 0 })
}

// A client that does not read: the append stalls and fails after
// stall_timeout, not before; the history stays for a resume.
func testStall(t *testing.T, e *env) {
	lim := BigLimits()
	lim.MaxStreamBytes = 4 << 10
	lim.StallTimeout = 1200 * time.Millisecond // well above what fill takes to see the block
	st, str := e.stream(lim, 0)
	start := time.Now()
	n, blocked := fill(t, str, bigSize, 100)
	r := AwaitAppend(t, blocked)
	var fe *buffer.FailedError
	if !errors.As(r.Err, &fe) || fe.Reason != policy.ReasonStalled {
		t.Fatalf("stalled Append = %d, %v; want FailedError(stalled)", r.Seq, r.Err)
	}
	if waited := time.Since(start); waited < lim.StallTimeout {
		t.Fatalf("failed after %s, before the stall timeout", waited)
	}
	str.Fail(fe.Reason, buffer.Signal{Fields: Fields(Payload(uint64(n+1), bigSize))}) // what the tap does
	v := str.View()
	if v.State != policy.Failed || v.Head != uint64(n+1) || v.Floor != 1 {
		t.Fatalf("view after stall: %+v (history must stay, then the signal)", v)
	}
	// A resuming reader gets the retained history, the signal, then the failure.
	rd, _ := str.Attach(1)
	defer rd.Close()
	evs, err := ReadAll(t, rd)
	CheckSeqs(t, evs, 1, bigSize)
	if len(evs) != n+1 || !errors.As(err, &fe) || fe.Reason != policy.ReasonStalled {
		t.Fatalf("resume after stall: %d events, %v", len(evs), err)
	}
	if got := st.Counters().FailedStreams()[policy.ReasonStalled]; got != 1 {
		t.Errorf("FailedStreams[stalled] = %d", got)
	}
	if got := st.Counters().Stalls.Load(); got != 1 {
		t.Errorf("Stalls = %d", got)
	}
	if st.Stats().StalledStreams != 0 || st.Counters().EventsEvicted.Load() != 0 {
		t.Errorf("after stall: %+v, evicted %d", st.Stats(), st.Counters().EventsEvicted.Load())
	}
}

// A reader at full speed is never failed: while it has every retained
// event, an append that waits for the window to release room is being
// slowed down, not stalled, even when the window is longer than the stall
// timeout.
func testFastReaderNeverStalls(t *testing.T, e *env) {
	lim := BigLimits()
	lim.MaxStreamBytes = 4 << 10
	lim.StallTimeout = 150 * time.Millisecond
	lim.ResumeWindow = 400 * time.Millisecond
	st, str := e.stream(lim, 0)
	r, _ := str.Attach(1)
	defer r.Close()
	waits := 0
	for seq := uint64(1); seq <= 10; seq++ {
		ch := AsyncAppend(str, Payload(seq, bigSize))
		var res AppendResult
		select {
		case res = <-ch:
		case <-time.After(lim.StallTimeout):
			waits++ // full of delivered events: waiting for the window
			res = AwaitAppend(t, ch)
		}
		if res.Err != nil || res.Seq != seq {
			t.Fatalf("append %d: %d %v", seq, res.Seq, res.Err)
		}
		evs := Deliver(t, r, 1)
		CheckSeqs(t, evs, seq, bigSize)
	}
	if waits == 0 {
		t.Fatal("no append waited for the window: the bound was not exercised")
	}
	if n := st.Counters().FailedStreams()[policy.ReasonStalled]; n != 0 {
		t.Fatalf("a reader at full speed was failed %d times", n)
	}
}

// A slow reader that keeps making progress is never failed either: each
// delivery restarts the stall clock.
func testProgressingReaderNeverStalls(t *testing.T, e *env) {
	lim := BigLimits()
	lim.MaxStreamBytes = 4 << 10
	lim.StallTimeout = 2 * time.Second // well above a delivery's spacing, even on a loaded machine
	_, str := e.stream(lim, 0)
	n, blocked := fill(t, str, bigSize, 100)
	r, _ := str.Attach(1)
	defer r.Close()
	for i := 0; i < n; i++ { // a delivery every 300ms: progress, but no room (the window holds it)
		time.Sleep(300 * time.Millisecond)
		evs, err := Read(context.Background(), r, 1)
		if err != nil {
			t.Fatal(err)
		}
		r.Delivered(evs[len(evs)-1].Seq)
		AssertBlocked(t, blocked, time.Millisecond)
	}
	time.Sleep(lim.StallTimeout * 5 / 4) // caught up now: still not stalled
	AssertBlocked(t, blocked, time.Millisecond)
	ack(t, str, uint64(n)) // the client resumes from n: room
	if res := AwaitAppend(t, blocked); res.Err != nil {
		t.Fatalf("append: %v", res.Err)
	}
}
