package buffer_test

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/buffer"
	"github.com/mcpresume/caddy-mcp-resume/buffer/storetest"
	"github.com/mcpresume/caddy-mcp-resume/internal/eventid"
	"github.com/mcpresume/caddy-mcp-resume/policy"
)

// Epochs are keyed with Options.Key.
func TestKeyOption(t *testing.T) {
	key := []byte("test key")
	st, _ := newStore(t, buffer.Options{Limits: storetest.BigLimits(), Key: key})
	s := storetest.MustSession(t, st, "s1")
	if !bytes.Equal(st.Key(), key) || !eventid.Minted(key, "s1", s.Epoch()) {
		t.Fatal("the session's epoch does not verify under Options.Key")
	}
}

// Reads are exact: as many whole events as fit in maxBytes, at least one.
func TestReadBatchesExact(t *testing.T) {
	st, _ := newStore(t, buffer.Options{Limits: storetest.BigLimits()})
	str := newStream(t, st, "s1", 9)
	r, _ := str.Attach(1)
	one := len("id: 12345678-1-1\n") + len("data: ") + evSize + 2
	from := uint64(1)
	for _, c := range []struct{ maxBytes, want int }{{3 * one, 3}, {1, 1}, {1 << 20, 5}} {
		evs, err := storetest.Read(context.Background(), r, c.maxBytes)
		if err != nil || len(evs) != c.want {
			t.Fatalf("read of at most %d bytes: %d events, %v; want %d", c.maxBytes, len(evs), err, c.want)
		}
		storetest.CheckSeqs(t, evs, from, evSize)
		from += uint64(len(evs))
	}
}

// ---- backpressure ----------------------------------------------------------

// A stream's bound is exact: 8 events fill 8 events' bytes and the 9th
// waits. While it waits, time and sweeps evict nothing undelivered and
// half the stall timeout does not fail it; an acknowledgement frees
// exactly what it lets go.
func TestStreamBoundIsExact(t *testing.T) {
	lim := storetest.BigLimits()
	lim.MaxStreamBytes = 8 * evBytes
	st, clk := newStore(t, buffer.Options{Limits: lim})
	str := newStream(t, st, "s1", 8)

	blocked := storetest.AsyncAppend(str, storetest.Payload(9, evSize))
	storetest.AssertBlocked(t, blocked, 100*time.Millisecond)
	if s := st.Stats(); s.StalledStreams != 1 || s.RetainedBytes != 8*evBytes {
		t.Fatalf("stats while blocked: %+v", s)
	}
	clk.Advance(lim.StallTimeout / 2)
	st.Sweep()
	storetest.AssertBlocked(t, blocked, 50*time.Millisecond)
	if v := str.View(); v.Floor != 1 || v.Head != 8 || st.Counters().EventsEvicted.Load() != 0 {
		t.Fatalf("view while blocked: %+v, %d evicted", v, st.Counters().EventsEvicted.Load())
	}

	buffer.Ack(str, 2) // the client holds 1..2: they go, and room appears
	if r := storetest.AwaitAppend(t, blocked); r.Err != nil || r.Seq != 9 {
		t.Fatalf("unblocked Append = %d, %v", r.Seq, r.Err)
	}
	if s := st.Stats(); s.StalledStreams != 0 || s.RetainedBytes != 7*evBytes {
		t.Fatalf("stats after: %+v", s)
	}
}

// A session's bound is exact too: one event freed by another stream of
// the session is room for the waiting one.
func TestSessionBoundIsExact(t *testing.T) {
	lim := storetest.BigLimits()
	lim.MaxSessionBytes = 9 * evBytes
	st, _ := newStore(t, buffer.Options{Limits: lim})
	s := storetest.MustSession(t, st, "s1")
	a, b := storetest.MustStream(t, s), storetest.MustStream(t, s)
	storetest.AppendN(t, a, 5, evSize)
	storetest.AppendN(t, b, 4, evSize)
	blocked := storetest.AsyncAppend(b, storetest.Payload(5, evSize))
	storetest.AssertBlocked(t, blocked, 100*time.Millisecond)
	buffer.Ack(a, 1)
	if r := storetest.AwaitAppend(t, blocked); r.Err != nil || r.Seq != 5 {
		t.Fatalf("unblocked Append = %d, %v", r.Seq, r.Err)
	}
}

// The reserve is exactly a quarter of the total: detached streams hold 6
// of 8 events' bytes, and a stream a client reads may take the other 2.
func TestReserveIsAQuarter(t *testing.T) {
	lim := storetest.BigLimits()
	lim.MaxTotalBytes = 8 * evBytes
	st, _ := newStore(t, buffer.Options{Limits: lim})
	x, y := newStream(t, st, "x", 3), newStream(t, st, "y", 3)
	blocked := storetest.AsyncAppend(y, storetest.Payload(4, evSize))
	storetest.AssertBlocked(t, blocked, 100*time.Millisecond)

	rx, _ := x.Attach(4)
	storetest.AppendN(t, x, 2, evSize)
	storetest.AssertBlocked(t, blocked, 10*time.Millisecond)
	rx.Close()

	// x lets go of everything: room for y outside the reserve again.
	buffer.Ack(x, 5)
	if r := storetest.AwaitAppend(t, blocked); r.Err != nil || r.Seq != 4 {
		t.Fatalf("unblocked Append = %d, %v", r.Seq, r.Err)
	}
	if s := st.Stats(); s.RetainedBytes != 4*evBytes {
		t.Fatalf("RetainedBytes = %d", s.RetainedBytes)
	}
}

// The review's scenario: sessions start chatty calls and hang up; an
// unrelated client that reads its call still gets every event.
func TestReserveServesConnectedClients(t *testing.T) {
	lim := storetest.BigLimits()
	lim.MaxTotalBytes = 32 * evBytes
	lim.MaxSessionBytes = 4 * evBytes
	lim.MaxStreamBytes = 4 * evBytes
	st, _ := newStore(t, buffer.Options{Limits: lim})
	var blocked []<-chan storetest.AppendResult
	for i := 0; i < 8; i++ { // 8 hung-up sessions want 32 events: they get 24
		str := newStream(t, st, "hungup-"+string(rune('a'+i)), 0)
		for k := 0; k < 4; k++ {
			ch := storetest.AsyncAppend(str, storetest.Payload(uint64(k+1), evSize))
			select {
			case r := <-ch:
				if r.Err != nil {
					t.Fatal(r.Err)
				}
			case <-time.After(50 * time.Millisecond):
				blocked = append(blocked, ch) // out of room for detached streams
				k = 4
			}
		}
	}
	if got := st.Stats().RetainedBytes; got != 24*evBytes {
		t.Fatalf("hung-up sessions hold %d bytes, want %d (three quarters)", got, 24*evBytes)
	}
	str := newStream(t, st, "connected", 0)
	r, _ := str.Attach(1)
	storetest.AppendN(t, str, 4, evSize) // would block forever without the reserve
	evs, _ := storetest.ReadUntil(t, r, 4)
	storetest.CheckSeqs(t, evs, 1, evSize)
	for _, ch := range blocked {
		storetest.AssertBlocked(t, ch, time.Millisecond)
	}
	st.Close() // ends the blocked appends
	for _, ch := range blocked {
		<-ch
	}
}

// A stall fails its append when the store's clock reaches the stall
// timeout, not before; the hooks hear of its start, end and failure once
// each.
func TestStallOnTheClock(t *testing.T) {
	const stall, window = 50 * time.Millisecond, time.Minute
	st, clk, hooks := stallStore(t, stall, window)
	str := newStream(t, st, "s1", 3)

	blocked := storetest.AsyncAppend(str, storetest.Payload(4, evSize))
	storetest.WaitFor(t, "the append to stall", func() bool { return st.Stats().StalledStreams == 1 })
	storetest.AssertBlocked(t, blocked, 100*time.Millisecond) // the store's clock has not moved
	clk.Advance(stall)
	r := storetest.AwaitAppend(t, blocked)
	var fe *buffer.FailedError
	if !errors.As(r.Err, &fe) || fe.Reason != policy.ReasonStalled {
		t.Fatalf("stalled Append = %d, %v; want FailedError(stalled)", r.Seq, r.Err)
	}
	str.Fail(fe.Reason, buffer.Signal{Fields: storetest.Fields(storetest.Payload(4, evSize))}) // what the tap does
	if st.Stats().StalledStreams != 0 || st.Counters().EventsEvicted.Load() != 0 {
		t.Errorf("after stall: %+v, evicted %d", st.Stats(), st.Counters().EventsEvicted.Load())
	}
	if started, ended, failed := hooks(); started != 1 || ended != 1 || failed != 1 {
		t.Errorf("hooks: started %d ended %d failed %d", started, ended, failed)
	}
}

// A reader at full speed is never failed: while it has every retained
// event, an append that waits for the window to release room is being slowed
// down, not stalled, however long the window (the review's defaults case:
// stall_timeout equal to resume_window).
func TestFastReaderNeverStalls(t *testing.T) {
	const stall, window = time.Minute, time.Minute
	st, clk, hooks := stallStore(t, stall, window)
	str := newStream(t, st, "s1", 0)
	r, _ := str.Attach(1)
	waits := 0
	for seq := uint64(1); seq <= 12; seq++ {
		ch := storetest.AsyncAppend(str, storetest.Payload(seq%10, evSize))
		var res storetest.AppendResult
		select {
		case res = <-ch:
		case <-time.After(50 * time.Millisecond):
			// Full of delivered events: waiting for the window, which is as
			// long as the stall timeout.
			waits++
			// The append wakes (its stall deadline, no sweep yet): it must
			// take the room the window released, not fail as stalled.
			clk.Advance(window)
			st.Wake()
			res = storetest.AwaitAppend(t, ch)
		}
		if res.Err != nil || res.Seq != seq {
			t.Fatalf("append %d: %d %v", seq, res.Seq, res.Err)
		}
		evs, _ := storetest.ReadUntil(t, r, 1)
		if evs[0].Seq != seq {
			t.Fatalf("read seq %d, want %d", evs[0].Seq, seq)
		}
		r.Delivered(seq)
	}
	if waits < 2 {
		t.Fatalf("only %d appends waited for the window: the bound was not exercised", waits)
	}
	if _, _, failed := hooks(); failed != 0 {
		t.Fatalf("a reader at full speed was failed %d times", failed)
	}
}

// With a stall timeout shorter than the window, a caught-up reader's
// append waits the whole window for room: still not a stall.
func TestCaughtUpReaderOutlastsShortStallTimeout(t *testing.T) {
	const stall, window = time.Minute, time.Hour
	st, clk, hooks := stallStore(t, stall, window)
	str := newStream(t, st, "s1", 3)
	r, _ := str.Attach(1)
	storetest.Deliver(t, r, 3)
	blocked := storetest.AsyncAppend(str, storetest.Payload(4, evSize))
	storetest.WaitFor(t, "the append to wait", func() bool { return st.Stats().StalledStreams == 1 })
	for i := 0; i < 5; i++ {
		clk.Advance(stall)
		st.Wake()
		storetest.AssertBlocked(t, blocked, 20*time.Millisecond)
	}
	clk.Advance(window)
	st.Sweep()
	if res := storetest.AwaitAppend(t, blocked); res.Err != nil || res.Seq != 4 {
		t.Fatalf("append after the window: %d %v", res.Seq, res.Err)
	}
	if _, _, failed := hooks(); failed != 0 {
		t.Fatal("a caught-up reader was failed")
	}
}

// A slow reader that keeps making progress is never failed either: each
// delivery restarts the stall clock.
func TestSlowReaderProgressResetsStall(t *testing.T) {
	const stall, window = time.Minute, time.Hour // delivered events keep their room throughout
	st, clk, hooks := stallStore(t, stall, window)
	str := newStream(t, st, "s1", 3)
	r, _ := str.Attach(1)
	blocked := storetest.AsyncAppend(str, storetest.Payload(4, evSize))
	storetest.WaitFor(t, "the append to stall", func() bool { return st.Stats().StalledStreams == 1 })
	for i := 0; i < 3; i++ {
		clk.Advance(stall * 3 / 4)
		evs, _ := storetest.Read(context.Background(), r, 1)
		r.Delivered(evs[0].Seq) // progress, but no room: the window holds it
		st.Wake()
		storetest.AssertBlocked(t, blocked, 20*time.Millisecond)
	}
	buffer.Ack(str, 3) // the client resumes from 3: room
	if res := storetest.AwaitAppend(t, blocked); res.Err != nil {
		t.Fatalf("append: %v", res.Err)
	}
	if _, _, failed := hooks(); failed != 0 {
		t.Fatal("a progressing reader was failed")
	}
}

// Raising stall_timeout on reload must not make stalled appends spin: the
// timer re-arms for the new deadline, not every millisecond.
func TestStallTimeoutRaiseDoesNotSpin(t *testing.T) {
	lim := storetest.BigLimits()
	lim.MaxStreamBytes = evBytes
	lim.StallTimeout = 20 * time.Millisecond
	st, clk := newStore(t, buffer.Options{Limits: lim})
	str := newStream(t, st, "s1", 1)
	blocked := storetest.AsyncAppend(str, storetest.Payload(2, evSize))
	storetest.WaitFor(t, "the append to stall", func() bool { return st.Stats().StalledStreams == 1 })
	lim.StallTimeout = time.Hour
	st.SetLimits(lim)
	if st.Limits() != lim {
		t.Fatalf("Limits() = %+v after SetLimits", st.Limits())
	}
	clk.Advance(time.Second) // past the old timeout, far from the new one
	time.Sleep(50 * time.Millisecond)
	before := st.ReserveRounds()
	time.Sleep(200 * time.Millisecond)
	if n := st.ReserveRounds() - before; n > 3 {
		t.Fatalf("the blocked append decided %d times in 200ms: it spins", n)
	}
	storetest.AssertBlocked(t, blocked, time.Millisecond)
	if v := str.View(); v.State != policy.Live {
		t.Fatalf("failed under the raised timeout: %+v", v)
	}
}

// ---- eviction --------------------------------------------------------------

// The window is exact on the store's clock: delivered events go when it
// has passed since their delivery, to the nanosecond, and their bytes
// with them; undelivered ones stay, however long.
func TestWindowIsExact(t *testing.T) {
	lim := storetest.BigLimits()
	st, clk := newStore(t, buffer.Options{Limits: lim})
	str := newStream(t, st, "s1", 5)
	r, _ := str.Attach(1)
	storetest.ReadUntil(t, r, 5)
	r.Delivered(3) // only 1..3 were written and flushed
	r.Close()
	clk.Advance(lim.ResumeWindow - time.Nanosecond)
	st.Sweep()
	if v := str.View(); v.Floor != 1 {
		t.Fatalf("evicted inside the window: %+v", v)
	}
	clk.Advance(time.Nanosecond) // exactly the window
	st.Sweep()
	if v := str.View(); v.Floor != 4 || st.Stats().RetainedBytes != 2*evBytes {
		t.Fatalf("after the window: %+v, %d bytes; want floor 4 (4..5 undelivered)", v, st.Stats().RetainedBytes)
	}
	clk.Advance(1000 * time.Hour)
	st.Sweep()
	if v := str.View(); v.Floor != 4 || v.Head != 5 {
		t.Fatalf("undelivered evicted: %+v", v)
	}
}

// Under an attached reader exactly what it has passed may go, however
// long ago the rest was sent to an earlier connection.
func TestAttachedReaderHoldsExactlyTheRest(t *testing.T) {
	lim := storetest.BigLimits()
	st, clk := newStore(t, buffer.Options{Limits: lim})
	str := newStream(t, st, "s1", 6)
	storetest.DeliverAndClose(t, str, 6)
	r, _ := str.Attach(1) // without an acknowledgement (what a repeated request did)
	if evs, err := storetest.Read(context.Background(), r, 1); err != nil || len(evs) != 1 {
		t.Fatalf("read: %d events, %v", len(evs), err)
	}
	clk.Advance(2 * lim.ResumeWindow)
	st.Sweep()
	if v := str.View(); v.Floor != 2 {
		t.Fatalf("floor %d: exactly what the reader has passed may go", v.Floor)
	}
}

// Resume decides, acknowledges and attaches in one step: events delivered to
// a connection that died are not lost to the sweeper between the decision
// and the replay, because the acknowledgement un-delivers them first, even
// when the window passes while deciding.
func TestResumeIsAtomicWithEviction(t *testing.T) {
	st, clk := newStore(t, buffer.Options{Limits: storetest.BigLimits()})
	str := newStream(t, st, "s", 5)
	storetest.DeliverAndClose(t, str, 5)
	clk.Advance(59 * time.Second) // just inside the window

	_, r, err := str.Resume(2, func(policy.StreamView) policy.Resume {
		clk.Advance(2 * time.Second) // the window passes while deciding
		return policy.Resume{Kind: policy.Replay, From: 3}
	})
	if err != nil || r == nil {
		t.Fatalf("Resume: %v %v", r, err)
	}
	defer r.Close()
	st.Sweep() // events 3..5 were un-delivered by the ack: they must stay
	evs, err := storetest.Read(context.Background(), r, 1<<20)
	if err != nil || len(evs) != 3 || evs[0].Seq != 3 {
		t.Fatalf("replay after the sweep: %v %+v", err, evs)
	}
	if v := str.View(); v.Floor != 3 {
		t.Fatalf("acked events 1..2 should be gone, floor %d", v.Floor)
	}
}

// A reader that finds its position gone (a bug) is never silent: the
// counter moves and the hook fires.
func TestReaderBelowFloorIsCounted(t *testing.T) {
	var fired uint64
	st := buffer.NewMemoryStore(buffer.Options{Limits: storetest.BigLimits(), SweepInterval: time.Hour,
		Hooks: buffer.Hooks{EvictedBeforeAck: func(_ string, _ uint32, _, n uint64) { fired += n }}})
	defer st.Close()
	str := newStream(t, st, "s1", 4)
	r, _ := str.Attach(1)
	buffer.EvictUnder(str, 2)
	if _, err := storetest.Read(context.Background(), r, 1<<20); !errors.Is(err, buffer.ErrBelowFloor) {
		t.Fatalf("read below the floor: %v", err)
	}
	if n := st.Counters().EventsEvictedBeforeAck.Load(); n != 2 || fired != 2 {
		t.Fatalf("EventsEvictedBeforeAck = %d, hook %d; want 2", n, fired)
	}
}
