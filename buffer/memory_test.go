package buffer

import (
	"context"
	"errors"
	"io"
	"sync"
	"testing"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/internal/eventid"
	"github.com/mcpresume/caddy-mcp-resume/policy"
)

const evSize = 36 // payload bytes of the small events most tests append

func TestAppendReadComplete(t *testing.T) {
	st, _ := newStore(t, bigLimits())
	s := mustSession(t, st, "s1")
	str := mustStream(t, s, "1", `"b"`)
	if v := str.View(); v.Floor != 1 || v.Head != 0 || v.State != policy.Live || v.Kind != policy.RequestStream {
		t.Fatalf("fresh stream view %+v", v)
	}
	appendN(t, str, 3, evSize)
	seq, err := str.Append(context.Background(), fields(payload(4, evSize)), []string{"1"})
	if err != nil || seq != 4 {
		t.Fatalf("Append(answering 1) = %d, %v", seq, err)
	}
	mustAppend(t, str, payload(5, evSize))
	if _, err := str.Append(context.Background(), fields(payload(6, evSize)), []string{`"b"`, "1"}); err != nil {
		t.Fatal(err)
	}
	str.Complete()
	v := str.View()
	if v.State != policy.Complete || v.Head != 6 || len(v.Requests) != 2 ||
		v.Requests[0] != (policy.RequestView{ID: "1", AnsweredAt: 4}) || v.Requests[1] != (policy.RequestView{ID: `"b"`, AnsweredAt: 6}) {
		t.Fatalf("view after complete %+v (a later answer must not move an earlier one)", v)
	}
	if _, err := str.Append(context.Background(), fields(payload(7, evSize)), nil); !errors.Is(err, ErrStreamEnded) {
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
	if b, err := r.Read(context.Background(), nil, 1<<20, time.Second); len(b.Data) != 0 || err != io.EOF {
		t.Fatalf("second read at end: %d slices, %v", len(b.Data), err)
	}
	// Attaching at head+1 of a complete stream: EOF at once.
	r2, err := str.Attach(7)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r2.Read(context.Background(), nil, 1<<20, time.Second); err != io.EOF {
		t.Fatalf("read at head+1: %v", err)
	}
	if n := st.Counters().EventsEnqueued.Load(); n != 6 {
		t.Errorf("EventsEnqueued = %d, want 6", n)
	}
}

// The bytes a reader hands out are the event as the client gets it: the
// proxy's ID, then the upstream's fields, then the blank line.
func TestFraming(t *testing.T) {
	st, _ := newStore(t, bigLimits())
	s := mustSession(t, st, "s1")
	str := mustStream(t, s)
	if _, err := str.Append(context.Background(), []byte("event: message\ndata: {\"x\":1}\n"), nil); err != nil {
		t.Fatal(err)
	}
	r, _ := str.Attach(1)
	b, err := r.Read(context.Background(), nil, 1<<20, time.Second)
	if err != nil || len(b.Data) != 1 {
		t.Fatalf("read: %v %+v", err, b)
	}
	want := "id: " + eventid.ID{Epoch: s.Epoch(), Stream: str.Num(), Seq: 1}.String() + "\nevent: message\ndata: {\"x\":1}\n\n"
	if string(b.Data[0]) != want {
		t.Fatalf("framed %q, want %q", b.Data[0], want)
	}
	if !eventid.Minted([]byte("test key"), "s1", s.Epoch()) {
		t.Fatal("the session's epoch does not verify under the store's key")
	}
}

func TestReaderFollowsLive(t *testing.T) {
	st, _ := newStore(t, bigLimits())
	str := mustStream(t, mustSession(t, st, "s1"))
	r, err := str.Attach(1) // before the first event (priming position)
	if err != nil {
		t.Fatal(err)
	}
	got := async(func() []event { evs, _ := readUntil(t, r, 3); return evs })
	time.Sleep(20 * time.Millisecond)
	appendN(t, str, 3, evSize)
	select {
	case evs := <-got:
		checkSeqs(t, evs, 1, evSize)
	case <-time.After(10 * time.Second):
		t.Fatal("reader did not follow live")
	}
	// A blocked read returns when its context ends, and after its idle time.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if _, err := r.Read(ctx, nil, 1<<20, time.Hour); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("read with expired context: %v", err)
	}
	if _, err := r.Read(context.Background(), nil, 1<<20, 10*time.Millisecond); !errors.Is(err, ErrIdle) {
		t.Fatalf("read past its idle time: %v", err)
	}
}

// Read hands out at most about maxBytes, in runs of whole events.
func TestReadBatches(t *testing.T) {
	st, _ := newStore(t, bigLimits())
	str := mustStream(t, mustSession(t, st, "s1"))
	appendN(t, str, 9, evSize)
	r, _ := str.Attach(1)
	one := len("id: 12345678-1-1\n") + len("data: ") + evSize + 2
	evs, err := read(context.Background(), r, 3*one)
	if err != nil || len(evs) != 3 {
		t.Fatalf("read of 3 events' bytes: %d, %v", len(evs), err)
	}
	checkSeqs(t, evs, 1, evSize)
	evs, _ = read(context.Background(), r, 1) // less than one event: still one
	checkSeqs(t, evs, 4, evSize)
	if len(evs) != 1 {
		t.Fatalf("read with maxBytes 1: %d events", len(evs))
	}
	evs, _ = read(context.Background(), r, 1<<20)
	checkSeqs(t, evs, 5, evSize)
	if len(evs) != 5 {
		t.Fatalf("rest: %d events", len(evs))
	}
}

func TestReaderFailedStream(t *testing.T) {
	st, _ := newStore(t, bigLimits())
	str := mustStream(t, mustSession(t, st, "s1"), "1", "2")
	appendN(t, str, 2, evSize)
	str.Fail(policy.ReasonUpstreamFailed, Signal{Fields: fields(payload(3, evSize)), Answers: []string{"1", "2"}})
	str.Fail(policy.ReasonStalled) // the first reason sticks
	r, _ := str.Attach(1)
	evs, err := readAll(t, r)
	var fe *FailedError
	if !errors.As(err, &fe) || fe.Reason != policy.ReasonUpstreamFailed {
		t.Fatalf("end of failed stream: %v", err)
	}
	checkSeqs(t, evs, 1, evSize)
	if len(evs) != 3 {
		t.Fatalf("got %d events, want the 2 retained and the signal", len(evs))
	}
	if v := str.View(); v.Requests[0].AnsweredAt != 3 || v.Requests[1].AnsweredAt != 3 {
		t.Fatalf("the signal did not answer the requests: %+v", v.Requests)
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
	lim.MaxStreamBytes = 8 * evBytes
	st, clk := newStore(t, lim)
	str := mustStream(t, mustSession(t, st, "s1"))
	appendN(t, str, 8, evSize)

	blocked := asyncAppend(str, payload(9, evSize))
	assertBlocked(t, blocked, 100*time.Millisecond)
	if s := st.Stats(); s.StalledStreams != 1 || s.RetainedBytes != 8*evBytes {
		t.Fatalf("stats while blocked: %+v", s)
	}
	// Time passing and sweeping evict nothing undelivered, and the stall
	// timeout (an hour) is not reached.
	clk.Advance(30 * time.Minute)
	st.Sweep()
	assertBlocked(t, blocked, 50*time.Millisecond)
	if v := str.View(); v.Floor != 1 || v.Head != 8 {
		t.Fatalf("view while blocked: %+v", v)
	}
	if n := st.Counters().EventsEvicted.Load(); n != 0 {
		t.Fatalf("EventsEvicted = %d while blocked, want 0", n)
	}
	if n := st.Counters().Stalls.Load(); n != 1 {
		t.Fatalf("Stalls = %d, want 1", n)
	}

	ack(str, 2) // the client holds 1..2: they go, and room appears
	r := awaitAppend(t, blocked)
	if r.err != nil || r.seq != 9 {
		t.Fatalf("unblocked Append = %d, %v", r.seq, r.err)
	}
	if v := str.View(); v.Floor != 3 || v.Head != 9 {
		t.Fatalf("view after ack: %+v", v)
	}
	if n := st.Counters().EventsEvicted.Load(); n != 2 {
		t.Fatalf("EventsEvicted = %d, want 2", n)
	}
	if s := st.Stats(); s.StalledStreams != 0 || s.RetainedBytes != 7*evBytes {
		t.Fatalf("stats after: %+v", s)
	}
	if st.Counters().StallNanos.Load() == 0 {
		t.Error("StallNanos not counted")
	}
}

func TestBackpressureSessionBound(t *testing.T) {
	lim := bigLimits()
	lim.MaxSessionBytes = 9 * evBytes
	st, _ := newStore(t, lim)
	s := mustSession(t, st, "s1")
	a, b := mustStream(t, s), mustStream(t, s)
	appendN(t, a, 5, evSize)
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
	ack(a, 1) // room in the session, freed by the other stream
	if r := awaitAppend(t, blocked); r.err != nil || r.seq != 5 {
		t.Fatalf("unblocked Append = %d, %v", r.seq, r.err)
	}
}

// TestBackpressureTotalBound also shows the reserve: a quarter of the total
// is kept for streams a client is reading.
func TestBackpressureTotalBound(t *testing.T) {
	lim := bigLimits()
	lim.MaxTotalBytes = 8 * evBytes // reserve: 2 events
	st, _ := newStore(t, lim)
	x := mustStream(t, mustSession(t, st, "x"))
	y := mustStream(t, mustSession(t, st, "y"))
	appendN(t, x, 3, evSize)
	appendN(t, y, 3, evSize) // 6 events: all detached streams may hold
	blocked := asyncAppend(y, payload(4, evSize))
	assertBlocked(t, blocked, 100*time.Millisecond)

	// A client reading x may use the reserve.
	rx, _ := x.Attach(4)
	appendN(t, x, 2, evSize)
	assertBlocked(t, blocked, 10*time.Millisecond)
	rx.Close()

	// x lets go of everything: room for y outside the reserve again.
	ack(x, 5)
	if r := awaitAppend(t, blocked); r.err != nil || r.seq != 4 {
		t.Fatalf("unblocked Append = %d, %v", r.seq, r.err)
	}
	if s := st.Stats(); s.RetainedBytes != 4*evBytes {
		t.Fatalf("RetainedBytes = %d", s.RetainedBytes)
	}
}

// The review's scenario: sessions start chatty calls and hang up; an
// unrelated client that reads its call still gets every event.
func TestReserveServesConnectedClients(t *testing.T) {
	lim := bigLimits()
	lim.MaxTotalBytes = 32 * evBytes
	lim.MaxSessionBytes = 4 * evBytes
	lim.MaxStreamBytes = 4 * evBytes
	st, _ := newStore(t, lim)
	var blocked []<-chan appendResult
	for i := 0; i < 8; i++ { // 8 hung-up sessions want 32 events: they get 24
		str := mustStream(t, mustSession(t, st, "hungup-"+string(rune('a'+i))))
		for k := 0; k < 4; k++ {
			ch := asyncAppend(str, payload(uint64(k+1), evSize))
			select {
			case r := <-ch:
				if r.err != nil {
					t.Fatal(r.err)
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
	str := mustStream(t, mustSession(t, st, "connected"))
	r, _ := str.Attach(1)
	appendN(t, str, 4, evSize) // would block forever without the reserve
	evs, _ := readUntil(t, r, 4)
	checkSeqs(t, evs, 1, evSize)
	for _, ch := range blocked {
		assertBlocked(t, ch, time.Millisecond)
	}
	st.Close() // ends the blocked appends
	for _, ch := range blocked {
		<-ch
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
	ch := async(func() error { _, err := str.Append(ctx, fields(payload(2, evSize)), nil); return err })
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

// stallStore is a store whose hooks count stalls and failures.
func stallStore(t *testing.T, lim Limits) (*MemoryStore, *fakeClock, func() (started, ended, failed int)) {
	var mu sync.Mutex
	var started, ended, failed int
	clk := newClock()
	st := NewMemoryStore(Options{Limits: lim, Now: clk.Now, SweepInterval: time.Hour, chunkSize: 1, Hooks: Hooks{
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
	return st, clk, func() (int, int, int) { mu.Lock(); defer mu.Unlock(); return started, ended, failed }
}

// A client that does not read: the append stalls and fails after
// stall_timeout; the history stays for a resume.
func TestStall(t *testing.T) {
	lim := bigLimits()
	lim.MaxStreamBytes = 3 * evBytes
	lim.StallTimeout = 50 * time.Millisecond
	st, clk, hooks := stallStore(t, lim)
	str := mustStream(t, mustSession(t, st, "s1"))
	appendN(t, str, 3, evSize)

	blocked := asyncAppend(str, payload(4, evSize))
	waitFor(t, "the append to stall", func() bool { return st.Stats().StalledStreams == 1 })
	assertBlocked(t, blocked, 100*time.Millisecond) // the store's clock has not moved
	clk.Advance(lim.StallTimeout)
	r := awaitAppend(t, blocked)
	var fe *FailedError
	if !errors.As(r.err, &fe) || fe.Reason != policy.ReasonStalled {
		t.Fatalf("stalled Append = %d, %v; want FailedError(stalled)", r.seq, r.err)
	}
	str.Fail(fe.Reason, Signal{Fields: fields(payload(4, evSize))}) // what the tap does
	v := str.View()
	if v.State != policy.Failed || v.Head != 4 || v.Floor != 1 {
		t.Fatalf("view after stall: %+v (history must stay, then the signal)", v)
	}
	// A resuming reader gets the retained history, the signal, then the failure.
	r2, _ := str.Attach(1)
	evs, err := readAll(t, r2)
	checkSeqs(t, evs, 1, evSize)
	if len(evs) != 4 || !errors.As(err, &fe) {
		t.Fatalf("resume after stall: %d events, %v", len(evs), err)
	}
	if n := st.Counters().FailedStreams()[policy.ReasonStalled]; n != 1 {
		t.Errorf("FailedStreams[stalled] = %d", n)
	}
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
	lim := bigLimits()
	lim.MaxStreamBytes = 3 * evBytes
	lim.StallTimeout = time.Minute
	lim.ResumeWindow = time.Minute
	st, clk, hooks := stallStore(t, lim)
	str := mustStream(t, mustSession(t, st, "s1"))
	r, _ := str.Attach(1)
	waits := 0
	for seq := uint64(1); seq <= 12; seq++ {
		ch := asyncAppend(str, payload(seq%10, evSize))
		var res appendResult
		select {
		case res = <-ch:
		case <-time.After(50 * time.Millisecond):
			// Full of delivered events: waiting for the window, which is as
			// long as the stall timeout.
			waits++
			// The append wakes (its stall deadline, no sweep yet): it must
			// take the room the window released, not fail as stalled.
			clk.Advance(lim.ResumeWindow)
			st.budget.wake()
			res = awaitAppend(t, ch)
		}
		if res.err != nil || res.seq != seq {
			t.Fatalf("append %d: %d %v", seq, res.seq, res.err)
		}
		evs, _ := readUntil(t, r, 1)
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
	lim := bigLimits()
	lim.MaxStreamBytes = 3 * evBytes
	lim.StallTimeout = time.Minute
	lim.ResumeWindow = time.Hour
	st, clk, hooks := stallStore(t, lim)
	str := mustStream(t, mustSession(t, st, "s1"))
	appendN(t, str, 3, evSize)
	r, _ := str.Attach(1)
	readUntil(t, r, 3)
	r.Delivered(3)
	blocked := asyncAppend(str, payload(4, evSize))
	waitFor(t, "the append to wait", func() bool { return st.Stats().StalledStreams == 1 })
	for i := 0; i < 5; i++ {
		clk.Advance(lim.StallTimeout)
		st.budget.wake()
		assertBlocked(t, blocked, 20*time.Millisecond)
	}
	clk.Advance(lim.ResumeWindow)
	st.Sweep()
	if res := awaitAppend(t, blocked); res.err != nil || res.seq != 4 {
		t.Fatalf("append after the window: %d %v", res.seq, res.err)
	}
	if _, _, failed := hooks(); failed != 0 {
		t.Fatal("a caught-up reader was failed")
	}
}

// A slow reader that keeps making progress is never failed either: each
// delivery restarts the stall clock.
func TestSlowReaderProgressResetsStall(t *testing.T) {
	lim := bigLimits()
	lim.MaxStreamBytes = 3 * evBytes
	lim.StallTimeout = time.Minute
	lim.ResumeWindow = time.Hour // delivered events keep their room throughout
	st, clk, hooks := stallStore(t, lim)
	str := mustStream(t, mustSession(t, st, "s1"))
	appendN(t, str, 3, evSize)
	r, _ := str.Attach(1)
	blocked := asyncAppend(str, payload(4, evSize))
	waitFor(t, "the append to stall", func() bool { return st.Stats().StalledStreams == 1 })
	for i := 0; i < 3; i++ {
		clk.Advance(lim.StallTimeout * 3 / 4)
		evs, _ := read(context.Background(), r, 1)
		r.Delivered(evs[0].Seq) // progress, but no room: the window holds it
		st.budget.wake()
		assertBlocked(t, blocked, 20*time.Millisecond)
	}
	ack(str, 3) // the client resumes from 3: room
	if res := awaitAppend(t, blocked); res.err != nil {
		t.Fatalf("append: %v", res.err)
	}
	if _, _, failed := hooks(); failed != 0 {
		t.Fatal("a progressing reader was failed")
	}
}

// Raising stall_timeout on reload must not make stalled appends spin: the
// timer re-arms for the new deadline, not every millisecond.
func TestStallTimeoutRaiseDoesNotSpin(t *testing.T) {
	lim := bigLimits()
	lim.MaxStreamBytes = evBytes
	lim.StallTimeout = 20 * time.Millisecond
	clk := newClock()
	st := NewMemoryStore(Options{Limits: lim, Now: clk.Now, SweepInterval: time.Hour, chunkSize: 1})
	defer st.Close()
	str := mustStream(t, mustSession(t, st, "s1"))
	appendN(t, str, 1, evSize)
	blocked := asyncAppend(str, payload(2, evSize))
	waitFor(t, "the append to stall", func() bool { return st.Stats().StalledStreams == 1 })
	lim.StallTimeout = time.Hour
	st.SetLimits(lim)
	clk.Advance(time.Second) // past the old timeout, far from the new one
	time.Sleep(50 * time.Millisecond)
	before := st.reserveRounds.Load()
	time.Sleep(200 * time.Millisecond)
	if n := st.reserveRounds.Load() - before; n > 3 {
		t.Fatalf("the blocked append decided %d times in 200ms: it spins", n)
	}
	assertBlocked(t, blocked, time.Millisecond)
	if v := str.View(); v.State != policy.Live {
		t.Fatalf("failed under the raised timeout: %+v", v)
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
			_, err := str.Append(context.Background(), make([]byte, 2*evBytes), nil)
			var fe *FailedError
			if !errors.As(err, &fe) || fe.Reason != policy.ReasonTooLarge {
				t.Fatalf("oversized Append: %v", err)
			}
			if str.View().State != policy.Live {
				t.Fatal("the store fails nothing itself: the tap decides")
			}
		})
	}
}

// ---- eviction --------------------------------------------------------------

func TestEvictAcked(t *testing.T) {
	st, _ := newStore(t, bigLimits())
	str := mustStream(t, mustSession(t, st, "s1"))
	appendN(t, str, 5, evSize)
	ack(str, 3) // at once, no sweep needed
	if v := str.View(); v.Floor != 4 || v.Head != 5 {
		t.Fatalf("view after ack(3): %+v", v)
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
	r.Close()
	ack(str, 1)    // lower ack: nothing changes
	ack(str, 1000) // beyond head: clamps
	if v := str.View(); v.Floor != 6 || v.Head != 5 {
		t.Fatalf("view after ack(1000): %+v", v)
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
	r.Close()
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
	r2, _ := str.Attach(4)
	readUntil(t, r2, 2)
	r2.Delivered(5)
	r2.Close()
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

// An attached reader protects what it has yet to read, whatever the
// window says: the review's repeated-request loss (a reader attached at 1
// over events an earlier connection had been sent) cannot happen.
func TestAttachedReaderIsNeverEvictedUnder(t *testing.T) {
	lim := bigLimits()
	st, clk := newStore(t, lim)
	str := mustStream(t, mustSession(t, st, "s1"))
	appendN(t, str, 6, evSize)
	first, _ := str.Attach(1)
	readUntil(t, first, 6)
	first.Delivered(6)
	first.Close()
	// A second reader from 1 without an acknowledgement (what a repeated
	// request did), then the window passes.
	r, _ := str.Attach(1)
	evs, _ := read(context.Background(), r, 1)
	checkSeqs(t, evs, 1, evSize)
	clk.Advance(2 * lim.ResumeWindow)
	st.Sweep()
	if v := str.View(); v.Floor != 2 {
		t.Fatalf("floor %d: only what the reader has passed may go", v.Floor)
	}
	evs, err := readUntil(t, r, 5)
	if err != nil {
		t.Fatal(err)
	}
	checkSeqs(t, evs, 2, evSize)
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
	r.Close()
	clk.Advance(lim.ResumeWindow / 2)
	// The client resumes from 2: 3..5 were written to it but never arrived.
	ack(str, 2)
	if v := str.View(); v.Floor != 3 {
		t.Fatalf("after ack(2): %+v", v)
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
	r2.Close()
	clk.Advance(lim.ResumeWindow)
	st.Sweep()
	if v := str.View(); v.Floor != 6 {
		t.Fatalf("after redelivery and window: %+v", v)
	}
}

// A reader that finds its position gone (a bug) is never silent: the
// counter moves and the hook fires.
func TestReaderBelowFloorIsCounted(t *testing.T) {
	clk := newClock()
	var fired uint64
	st := NewMemoryStore(Options{Limits: bigLimits(), Now: clk.Now, SweepInterval: time.Hour,
		Hooks: Hooks{EvictedBeforeAck: func(_ string, _ uint32, _, n uint64) { fired += n }}})
	defer st.Close()
	str := mustStream(t, mustSession(t, st, "s1"))
	appendN(t, str, 4, evSize)
	r, _ := str.Attach(1)
	s := str.(*memStream)
	s.mu.Lock()
	s.log.evict(2) // what no path may do: evict under an attached reader
	s.mu.Unlock()
	if _, err := read(context.Background(), r, 1<<20); !errors.Is(err, ErrBelowFloor) {
		t.Fatalf("read below the floor: %v", err)
	}
	if n := st.Counters().EventsEvictedBeforeAck.Load(); n != 2 || fired != 2 {
		t.Fatalf("EventsEvictedBeforeAck = %d, hook %d; want 2", n, fired)
	}
}
