package storetest

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/buffer"
	"github.com/mcpresume/caddy-mcp-resume/policy"
)

var readerContracts = []contract{
	{"Takeover", testTakeover},
	{"ResumeIsDecideAckAttach", testResumeAtomic},
	{"ResumeFromZeroProtectsAReplay", testResumeFromZero},
	{"ResumeDoesNotAckOrAttachOnReject", testResumeReject},
	{"AttachFromUndelivered", testAttachFromUndelivered},
	{"StandaloneGoesOnAfterFailure", testStandaloneGoesOn},
	{"StandaloneReaderEndsWithoutProducer", testStandaloneProducerGone},
	{"ProducerHandover", testProducerHandover},
	{"StandaloneProducerSpansIncarnations", testStandaloneProducerSpansIncarnations},
}

func testTakeover(t *testing.T, e *env) {
	st, str := e.stream(BigLimits(), 4)
	r1, _ := str.Attach(1)
	evs, _ := ReadUntil(t, r1, 4)
	CheckSeqs(t, evs, 1, EvSize)
	waiting := Async(func() error { // read to the end: it now waits for more
		_, err := ReadUntil(t, r1, 100)
		return err
	})
	time.Sleep(20 * time.Millisecond)

	r2, err := str.Attach(3)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-r1.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("old reader's Done not closed")
	}
	select {
	case err := <-waiting:
		if !errors.Is(err, buffer.ErrTakenOver) {
			t.Fatalf("old reader got %v, want ErrTakenOver", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("old reader still blocked after takeover")
	}
	// Even with events available, the old reader gets nothing more.
	AppendN(t, str, 2, EvSize)
	if b, err := r1.Read(context.Background(), nil, 1<<20, time.Second); len(b.Data) != 0 || !errors.Is(err, buffer.ErrTakenOver) {
		t.Fatalf("old reader read %d, %v", len(b.Data), err)
	}
	select {
	case <-r2.Done():
		t.Fatal("new reader done")
	default:
	}
	if c := st.Stats().Connected; c != 1 {
		t.Fatalf("Connected = %d, want 1", c)
	}
	evs, err = ReadUntil(t, r2, 4)
	if err != nil {
		t.Fatal(err)
	}
	CheckSeqs(t, evs, 3, EvSize)
	r1.Close() // closing a taken-over reader must not detach the new one
	if c := st.Stats().Connected; c != 1 || !str.Connected() {
		t.Fatalf("Connected = %d after closing the old reader", c)
	}
	if info := st.Sessions()[0]; len(info.Streams) == 0 || !info.Streams[0].Connected || info.Connected != 1 {
		t.Fatalf("session info shows no connection: %+v", info)
	}
	r2.Close()
	if c := st.Stats().Connected; c != 0 || str.Connected() {
		t.Fatalf("Connected = %d after closing both", c)
	}
}

// Resume decides, acknowledges and attaches in one step: events written
// to a connection that died are undelivered by the acknowledgement before
// the sweeper can take them, and the new reader holds the rest.
func testResumeAtomic(t *testing.T, e *env) {
	_, str := e.stream(windowLimits(), 5)
	DeliverAndClose(t, str, 5) // written to a connection that then died
	time.Sleep(window * 2 / 3)

	var seen policy.StreamView
	d, r, err := str.Resume(2, func(v policy.StreamView) policy.Resume {
		seen = v
		return policy.Resume{Kind: policy.Replay, From: 3}
	})
	if err != nil || r == nil || d.Kind != policy.Replay {
		t.Fatalf("Resume: %v %v %+v", r, err, d)
	}
	defer r.Close()
	if seen.Floor != 1 || seen.Head != 5 {
		t.Fatalf("decide saw %+v", seen)
	}
	if f := floorOf(str); f != 3 {
		t.Fatalf("acknowledged events 1..2 should be gone, floor %d", f)
	}
	time.Sleep(2 * window) // 3..5 were undelivered by the ack: they stay
	evs, err := ReadUntil(t, r, 3)
	if err != nil {
		t.Fatalf("replay after the window: %v", err)
	}
	CheckSeqs(t, evs, 3, EvSize)
}

// A repeated request re-reads its stream from the start: Resume(0, ...)
// undelivers everything, so nothing the reader still needs can go, however
// long the replay to a slow client takes.
func testResumeFromZero(t *testing.T, e *env) {
	_, str := e.stream(windowLimits(), 4)
	DeliverAndClose(t, str, 4)
	_, r, err := str.Resume(0, func(v policy.StreamView) policy.Resume {
		return policy.Resume{Kind: policy.Replay, From: 1}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	for seq := uint64(1); seq <= 4; seq++ {
		time.Sleep(window / 2)
		evs, err := Read(context.Background(), r, 1)
		if err != nil {
			t.Fatalf("seq %d: %v", seq, err)
		}
		CheckSeqs(t, evs, seq, EvSize)
		r.Delivered(seq)
	}
}

func testResumeReject(t *testing.T, e *env) {
	st := e.store(BigLimits())
	sess := MustSession(t, st, "s")
	str := MustStream(t, sess)
	AppendN(t, str, 3, EvSize)
	for _, tc := range []struct {
		d     policy.Resume
		floor uint64 // a rejected cursor acknowledges nothing; a gap's or an end's does
	}{
		{policy.Resume{Kind: policy.Reject, Status: 400}, 1},
		{policy.Resume{Kind: policy.PassThrough}, 1},
		{policy.Resume{Kind: policy.Gap, From: 1, Then: policy.ThenHold}, 2},
		{policy.Resume{Kind: policy.Gap, From: 1, Then: policy.ThenEnd}, 3},
		{policy.Resume{Kind: policy.Ended}, 4},
	} {
		_, r, err := str.Resume(tc.floor-1, func(policy.StreamView) policy.Resume { return tc.d })
		if r != nil || err != nil {
			t.Fatalf("%v: got a reader %v / %v", tc.d.Kind, r, err)
		}
		if f := floorOf(str); f != tc.floor {
			t.Fatalf("%v: floor %d, want %d", tc.d.Kind, f, tc.floor)
		}
	}
	if info := infoOf(t, st, sess); info.Connected != 0 || str.Connected() {
		t.Fatalf("connected %d", info.Connected)
	}
}

func testAttachFromUndelivered(t *testing.T, e *env) {
	_, str := e.stream(BigLimits(), 5)
	r, _ := str.Attach(buffer.FromUndelivered)
	evs, _ := ReadUntil(t, r, 5)
	CheckSeqs(t, evs, 1, EvSize)
	r.Delivered(3)
	r2, _ := str.Attach(buffer.FromUndelivered) // a reconnect without Last-Event-ID
	r.Close()
	evs, _ = ReadUntil(t, r2, 2)
	CheckSeqs(t, evs, 4, EvSize)
	r2.Close()
	ack(t, str, 4)
	r3, _ := str.Attach(buffer.FromUndelivered)
	defer r3.Close()
	evs, _ = ReadUntil(t, r3, 1)
	CheckSeqs(t, evs, 5, EvSize)
}

// The standalone stream is one log for the session's life: a failure (a
// stall, an oversized event) puts its signal in and the stream goes on.
func testStandaloneGoesOn(t *testing.T, e *env) {
	st := e.store(BigLimits())
	s := MustSession(t, st, "s1")
	g := s.Standalone()
	if g.Num() != policy.StandaloneNum || g.Kind() != policy.StandaloneStream {
		t.Fatalf("standalone stream %d %v", g.Num(), g.Kind())
	}
	p := MustProduce(t, g)
	AppendN(t, g, 2, EvSize)
	g.Fail(policy.ReasonStalled, buffer.Signal{Fields: Fields(Payload(3, EvSize))})
	if v := g.View(); v.State != policy.Live || v.Head != 3 {
		t.Fatalf("after a failure: %+v", v)
	}
	AppendN(t, g, 2, EvSize)
	r, _ := g.Attach(1)
	defer r.Close()
	evs, _ := ReadUntil(t, r, 5)
	CheckSeqs(t, evs, 1, EvSize)
	if n := st.Counters().FailedStreams()[policy.ReasonStalled]; n != 1 {
		t.Fatalf("FailedStreams[stalled] = %d", n)
	}
	p.Done()
}

func testStandaloneProducerGone(t *testing.T, e *env) {
	st := e.store(BigLimits())
	g := MustSession(t, st, "s1").Standalone()
	p := MustProduce(t, g)
	if _, err := g.TakeProducer(t.Context()); !errors.Is(err, buffer.ErrProducing) {
		t.Fatalf("a second TakeProducer got %v, want ErrProducing", err)
	}
	if st.Stats().Producing != 1 {
		t.Fatal("Producing gauge")
	}
	AppendN(t, g, 2, EvSize)
	r, _ := g.Attach(1)
	defer r.Close()
	evs, err := ReadUntil(t, r, 2)
	if err != nil {
		t.Fatal(err)
	}
	CheckSeqs(t, evs, 1, EvSize)
	ended := Async(func() error { _, err := ReadAll(t, r); return err })
	time.Sleep(50 * time.Millisecond)
	p.Done() // the upstream GET ended: a caught-up reader ends too
	if err := <-ended; !errors.Is(err, buffer.ErrProducerGone) {
		t.Fatalf("caught-up standalone reader got %v, want ErrProducerGone", err)
	}
	// A reader behind the head still gets the retained events first.
	r2, _ := g.Attach(1)
	defer r2.Close()
	evs, err = ReadAll(t, r2)
	if len(evs) != 2 || !errors.Is(err, buffer.ErrProducerGone) {
		t.Fatalf("behind reader: %d events, %v", len(evs), err)
	}
	MustProduce(t, g).Done()
}

// The producer role is handed over, never shared: a running producer keeps
// it; one asked to stop is waited for until Done, and only then is the
// role the next one's; the wait is bounded by the taker's context.
func testProducerHandover(t *testing.T, e *env) {
	st := e.store(BigLimits())
	s := MustSession(t, st, "s1")
	for _, str := range []buffer.Stream{s.Standalone(), MustStream(t, s)} {
		p := MustProduce(t, str)
		if _, err := str.TakeProducer(t.Context()); !errors.Is(err, buffer.ErrProducing) {
			t.Fatalf("stream %d: TakeProducer while one runs: %v, want ErrProducing", str.Num(), err)
		}
		p.Stop()
		if p.Context().Err() == nil {
			t.Fatalf("stream %d: Stop did not end the producer's context", str.Num())
		}
		short, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
		if _, err := str.TakeProducer(short); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("stream %d: TakeProducer before the stopping producer is done: %v, want the deadline", str.Num(), err)
		}
		cancel()
		var done atomic.Bool
		next := make(chan buffer.Producer, 1)
		taken := Async(func() error {
			q, err := str.TakeProducer(t.Context())
			if err == nil && !done.Load() {
				err = errors.New("the role was handed over before the producer was done")
			}
			next <- q
			return err
		})
		time.Sleep(50 * time.Millisecond)
		done.Store(true)
		p.Done()
		p.Done() // again: nothing
		if err := <-taken; err != nil {
			t.Fatalf("stream %d: %v", str.Num(), err)
		}
		q := <-next
		if q.Context().Err() != nil {
			t.Fatalf("stream %d: the new producer is stopped already", str.Num())
		}
		q.Done()
	}
}

// The standalone stream's role is the session ID's: after the session
// ended and came back (adopted), the new incarnation's producer waits for
// the old one's Done (its upstream GET still closing), and
// StandaloneClosed tells an adopter the same before any session exists.
func testStandaloneProducerSpansIncarnations(t *testing.T, e *env) {
	st := e.store(BigLimits())
	old := MustProduce(t, MustSession(t, st, "s1").Standalone())
	st.Delete("s1", policy.ReasonPurged)
	select {
	case <-old.Context().Done(): // the session's end stops its producer
	case <-time.After(10 * time.Second):
		t.Fatal("the ended session's producer was not asked to stop")
	}
	short, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	defer cancel()
	if err := st.StandaloneClosed(short, "s1"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("StandaloneClosed while the old GET closes: %v", err)
	}
	var done atomic.Bool
	closed := Async(func() error {
		if err := st.StandaloneClosed(t.Context(), "s1"); err != nil || !done.Load() {
			return fmt.Errorf("StandaloneClosed returned %v before the old producer was done", err)
		}
		return nil
	})
	s := MustSession(t, st, "s1") // adopted again
	taken := Async(func() error {
		p, err := s.Standalone().TakeProducer(t.Context())
		if err == nil {
			if !done.Load() {
				err = errors.New("the new incarnation's role was given before the old producer was done")
			}
			p.Done()
		}
		return err
	})
	time.Sleep(50 * time.Millisecond)
	done.Store(true)
	old.Done()
	for _, c := range []<-chan error{closed, taken} {
		if err := <-c; err != nil {
			t.Fatal(err)
		}
	}
	if err := st.StandaloneClosed(t.Context(), "never-was"); err != nil {
		t.Fatalf("StandaloneClosed of an unknown session: %v", err)
	}
}
