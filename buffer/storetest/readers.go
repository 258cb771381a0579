package storetest

import (
	"context"
	"errors"
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
}

func testTakeover(t *testing.T, e *env) {
	st := e.store(bigLimits())
	str := mustStream(t, mustSession(t, st, "s1"))
	appendN(t, str, 4, evSize)
	r1, _ := str.Attach(1)
	evs, _ := readUntil(t, r1, 4)
	checkSeqs(t, evs, 1, evSize)
	waiting := async(func() error { // read to the end: it now waits for more
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
	appendN(t, str, 2, evSize)
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
	evs, err = readUntil(t, r2, 4)
	if err != nil {
		t.Fatal(err)
	}
	checkSeqs(t, evs, 3, evSize)
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
	st := e.store(windowLimits())
	str := mustStream(t, mustSession(t, st, "s"))
	appendN(t, str, 5, evSize)
	rd, _ := str.Attach(1)
	deliver(t, rd, 5) // written to a connection that then died
	rd.Close()
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
	evs, err := readUntil(t, r, 3)
	if err != nil {
		t.Fatalf("replay after the window: %v", err)
	}
	checkSeqs(t, evs, 3, evSize)
}

// A repeated request re-reads its stream from the start: Resume(0, ...)
// undelivers everything, so nothing the reader still needs can go, however
// long the replay to a slow client takes.
func testResumeFromZero(t *testing.T, e *env) {
	st := e.store(windowLimits())
	str := mustStream(t, mustSession(t, st, "s"))
	appendN(t, str, 4, evSize)
	first, _ := str.Attach(1)
	deliver(t, first, 4)
	first.Close()
	_, r, err := str.Resume(0, func(v policy.StreamView) policy.Resume {
		return policy.Resume{Kind: policy.Replay, From: 1}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	for seq := uint64(1); seq <= 4; seq++ {
		time.Sleep(window / 2)
		evs, err := read(context.Background(), r, 1)
		if err != nil {
			t.Fatalf("seq %d: %v", seq, err)
		}
		checkSeqs(t, evs, seq, evSize)
		r.Delivered(seq)
	}
}

func testResumeReject(t *testing.T, e *env) {
	st := e.store(bigLimits())
	sess := mustSession(t, st, "s")
	str := mustStream(t, sess)
	appendN(t, str, 3, evSize)
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
	if info := sess.Info(); info.Connected != 0 || str.Connected() {
		t.Fatalf("connected %d", info.Connected)
	}
}

func testAttachFromUndelivered(t *testing.T, e *env) {
	st := e.store(bigLimits())
	str := mustStream(t, mustSession(t, st, "s1"))
	appendN(t, str, 5, evSize)
	r, _ := str.Attach(buffer.FromUndelivered)
	evs, _ := readUntil(t, r, 5)
	checkSeqs(t, evs, 1, evSize)
	r.Delivered(3)
	r2, _ := str.Attach(buffer.FromUndelivered) // a reconnect without Last-Event-ID
	r.Close()
	evs, _ = readUntil(t, r2, 2)
	checkSeqs(t, evs, 4, evSize)
	r2.Close()
	ack(t, str, 4)
	r3, _ := str.Attach(buffer.FromUndelivered)
	defer r3.Close()
	evs, _ = readUntil(t, r3, 1)
	checkSeqs(t, evs, 5, evSize)
}

// The standalone stream is one log for the session's life: a failure (a
// stall, an oversized event) puts its signal in and the stream goes on.
func testStandaloneGoesOn(t *testing.T, e *env) {
	st := e.store(bigLimits())
	s := mustSession(t, st, "s1")
	g := s.Standalone()
	if g.Num() != policy.StandaloneNum || g.Kind() != policy.StandaloneStream {
		t.Fatalf("standalone stream %d %v", g.Num(), g.Kind())
	}
	if !g.ClaimProducer() {
		t.Fatal("ClaimProducer")
	}
	appendN(t, g, 2, evSize)
	g.Fail(policy.ReasonStalled, buffer.Signal{Fields: fields(payload(3, evSize))})
	if v := g.View(); v.State != policy.Live || v.Head != 3 {
		t.Fatalf("after a failure: %+v", v)
	}
	appendN(t, g, 2, evSize)
	r, _ := g.Attach(1)
	defer r.Close()
	evs, _ := readUntil(t, r, 5)
	checkSeqs(t, evs, 1, evSize)
	if n := st.Counters().FailedStreams()[policy.ReasonStalled]; n != 1 {
		t.Fatalf("FailedStreams[stalled] = %d", n)
	}
	g.ReleaseProducer()
}

func testStandaloneProducerGone(t *testing.T, e *env) {
	st := e.store(bigLimits())
	g := mustSession(t, st, "s1").Standalone()
	if !g.ClaimProducer() || g.ClaimProducer() {
		t.Fatal("ClaimProducer must succeed once")
	}
	if st.Stats().Producing != 1 {
		t.Fatal("Producing gauge")
	}
	appendN(t, g, 2, evSize)
	r, _ := g.Attach(1)
	defer r.Close()
	evs, err := readUntil(t, r, 2)
	if err != nil {
		t.Fatal(err)
	}
	checkSeqs(t, evs, 1, evSize)
	ended := async(func() error { _, err := readAll(t, r); return err })
	time.Sleep(50 * time.Millisecond)
	g.ReleaseProducer() // the upstream GET ended: a caught-up reader ends too
	if err := <-ended; !errors.Is(err, buffer.ErrProducerGone) {
		t.Fatalf("caught-up standalone reader got %v, want ErrProducerGone", err)
	}
	// A reader behind the head still gets the retained events first.
	r2, _ := g.Attach(1)
	defer r2.Close()
	evs, err = readAll(t, r2)
	if len(evs) != 2 || !errors.Is(err, buffer.ErrProducerGone) {
		t.Fatalf("behind reader: %d events, %v", len(evs), err)
	}
	if !g.ClaimProducer() {
		t.Fatal("ClaimProducer after release")
	}
	g.ReleaseProducer()
}
