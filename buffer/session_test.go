package buffer

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/internal/eventid"
	"github.com/mcpresume/caddy-mcp-resume/policy"
)

func TestDeleteSession(t *testing.T) {
	st, _ := newStore(t, bigLimits())
	meta := SessionMeta{Version: "2025-11-25", Fingerprint: [32]byte{9, 9}, BindHeaders: []string{"Authorization"}}
	s, err := st.CreateSession("s1", meta)
	if err != nil {
		t.Fatal(err)
	}
	if s.ID() != "s1" || !reflect.DeepEqual(s.Meta(), meta) || len(s.Epoch()) != 8 {
		t.Fatalf("session %q %+v %q", s.ID(), s.Meta(), s.Epoch())
	}
	a, b := mustStream(t, s, "1"), mustStream(t, s, "2")
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
	if _, err := r.Read(context.Background(), nil, 1<<20, time.Second); !errors.Is(err, ErrSessionGone) {
		t.Fatalf("read after delete: %v", err)
	}
	if s.Context().Err() == nil {
		t.Fatal("session context not cancelled")
	}
	if _, ok := st.Session("s1"); ok {
		t.Fatal("session still there")
	}
	tomb, ok := st.Tombstone("s1")
	if !ok || tomb.Reason != policy.ReasonDeleted || tomb.Epoch != s.Epoch() || tomb.Fingerprint != meta.Fingerprint ||
		tomb.Version != "2025-11-25" || !reflect.DeepEqual(tomb.BindHeaders, meta.BindHeaders) {
		t.Fatalf("tombstone %+v, %v", tomb, ok)
	}
	// It remembers the requests whose answers the client may lack.
	if len(tomb.Streams) != 2 || tomb.Streams[a.Num()].Requests[0].ID != "1" || tomb.Streams[a.Num()].Floor != 5 {
		t.Fatalf("tombstone streams %+v", tomb.Streams)
	}
	if _, err := s.NewStream([]string{"3"}, [32]byte{3}); !errors.Is(err, ErrSessionGone) {
		t.Fatalf("NewStream on deleted session: %v", err)
	}
	if _, err := a.Attach(5); !errors.Is(err, ErrSessionGone) {
		t.Fatalf("Attach on deleted session: %v", err)
	}
	if st.Counters().EventsEvicted.Load() != 7 {
		t.Fatalf("EventsEvicted = %d", st.Counters().EventsEvicted.Load())
	}
	// A new session under the same id consumes the tombstone: what it knew
	// becomes the new incarnation's past, under a new epoch minted for the
	// same session ID.
	s1b := mustSession(t, st, "s1")
	if _, ok := st.Tombstone("s1"); ok {
		t.Fatal("tombstone survived re-creation")
	}
	if s1b.Epoch() == s.Epoch() || !eventid.Minted(st.Key(), "s1", s.Epoch()) || !eventid.Minted(st.Key(), "s1", s1b.Epoch()) {
		t.Fatalf("epochs %q then %q", s.Epoch(), s1b.Epoch())
	}
	past, ok := s1b.Past(s.Epoch())
	if !ok || past.Reason != policy.ReasonDeleted || len(past.Streams) != 2 {
		t.Fatalf("past %+v %v", past, ok)
	}
	st.Delete("s2", policy.ReasonDeleted)
	st.Delete("s1", policy.ReasonPurged)
	if s := st.Stats(); s.RetainedBytes != 0 || s.Sessions != 0 {
		t.Fatalf("stats after deleting all: %+v", s)
	}
	// The second tombstone remembers the first incarnation too.
	tomb, _ = st.Tombstone("s1")
	if tomb.Reason != policy.ReasonPurged || len(tomb.Earlier) != 1 || tomb.Earlier[0].Epoch != s.Epoch() {
		t.Fatalf("second tombstone %+v", tomb)
	}
}

// Tombstones are exact: every ended session is remembered for the TTL, up
// to the documented bound, and forgetting one early is counted.
func TestTombstonesAreExactAndBounded(t *testing.T) {
	clk := newClock()
	var dropped sync.WaitGroup
	st := NewMemoryStore(Options{Limits: bigLimits(), Now: clk.Now, SweepInterval: time.Hour, MaxTombstones: 500,
		Hooks: Hooks{TombstoneDropped: func(string) { dropped.Done() }}})
	defer st.Close()
	for i := 0; i < 500; i++ {
		id := fmt.Sprintf("s%d", i)
		mustSession(t, st, id)
		st.Delete(id, policy.ReasonExpired)
	}
	for i := 0; i < 500; i++ {
		if _, ok := st.Tombstone(fmt.Sprintf("s%d", i)); !ok {
			t.Fatalf("tombstone %d of 500 forgotten", i)
		}
	}
	dropped.Add(10)
	for i := 500; i < 510; i++ {
		id := fmt.Sprintf("s%d", i)
		mustSession(t, st, id)
		st.Delete(id, policy.ReasonExpired)
	}
	dropped.Wait()
	if _, ok := st.Tombstone("s9"); ok {
		t.Fatal("the oldest tombstones should go first")
	}
	if _, ok := st.Tombstone("s10"); !ok {
		t.Fatal("too many tombstones went")
	}
	if n := st.Counters().TombstonesDropped.Load(); n != 10 {
		t.Fatalf("TombstonesDropped = %d, want 10", n)
	}
	if n := st.Stats().Tombstones; n != 500 {
		t.Fatalf("Tombstones = %d", n)
	}
	clk.Advance(time.Hour)
	st.Sweep()
	if n := st.Stats().Tombstones; n != 0 {
		t.Fatalf("Tombstones after the TTL = %d", n)
	}
	if n := st.Counters().TombstonesDropped.Load(); n != 10 {
		t.Fatal("expiry counted as an early drop")
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
	r1.(*memReader).next = 5 // read to the end; it now waits for more
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
	if b, err := r1.Read(context.Background(), nil, 1<<20, time.Second); len(b.Data) != 0 || !errors.Is(err, ErrTakenOver) {
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
	if info := st.Sessions()[0].Streams[0]; !info.Connected {
		t.Fatalf("stream shows no connection: %+v", info)
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
	if _, err := st.CreateSession("s1", SessionMeta{}); !errors.Is(err, ErrSessionExists) {
		t.Fatalf("duplicate session: %v", err)
	}
	mustSession(t, st, "s2")
	if _, err := st.CreateSession("s3", SessionMeta{}); !errors.Is(err, ErrTooManySessions) {
		t.Fatalf("third session: %v", err)
	}

	g := s.Standalone()
	if g != s.Standalone() || g.Kind() != policy.StandaloneStream || g.Num() != policy.StandaloneNum {
		t.Fatalf("Standalone: %v", g)
	}
	if got, ok := s.Stream(policy.StandaloneNum); !ok || got != g {
		t.Fatal("Stream(0) does not find the standalone stream")
	}
	if len(s.Info().Streams) != 0 {
		t.Fatal("a standalone stream no one used is not shown")
	}
	p := mustStream(t, s)
	mustStream(t, s)
	if p.Num() != 1 || s.NextStream() != 3 {
		t.Fatalf("request streams number from 1: %d, next %d", p.Num(), s.NextStream())
	}
	if _, err := s.NewStream([]string{"x"}, [32]byte{7}); !errors.Is(err, ErrTooManyStreams) {
		t.Fatalf("third live stream: %v", err)
	}
	// Only live request streams count: a complete one frees its slot at
	// once, even while it still holds events (the byte bounds cover those).
	appendN(t, p, 1, evSize)
	p.Complete()
	q, err := s.NewStream([]string{"q"}, [32]byte{8})
	if err != nil {
		t.Fatalf("stream after the old one completed: %v", err)
	}
	if q.Num() != 3 {
		t.Fatalf("stream number %d, want 3", q.Num())
	}
	if got, ok := s.StreamByKey([32]byte{8}); !ok || got != q {
		t.Fatal("StreamByKey")
	}
	if _, ok := s.Stream(99); ok {
		t.Fatal("Stream(99) found")
	}
	if !g.ClaimProducer() || g.ClaimProducer() {
		t.Fatal("ClaimProducer must succeed once")
	}
	if st.Stats().Producing != 1 {
		t.Fatal("Producing gauge")
	}
	g.ReleaseProducer()
	if !g.ClaimProducer() {
		t.Fatal("ClaimProducer after release")
	}
	info := s.Info()
	if len(info.Streams) != 4 || info.Streams[0].Kind != "standalone" || info.Streams[1].State != "complete" {
		t.Fatalf("info %+v", info)
	}
}

// Sessions adopted on a POST alone have their own quarter of max_sessions:
// made-up session IDs can neither lock initialize out nor take more.
func TestAdoptedSessionsCannotCrowdOut(t *testing.T) {
	lim := bigLimits()
	lim.MaxSessions = 8
	st, _ := newStore(t, lim)
	for i := 0; i < 2; i++ {
		if _, err := st.CreateSession(fmt.Sprintf("made-up-%d", i), SessionMeta{Origin: policy.Adopted}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := st.CreateSession("made-up-2", SessionMeta{Origin: policy.Adopted}); !errors.Is(err, ErrTooManySessions) {
		t.Fatalf("third adopted session: %v", err)
	}
	for i := 0; i < 8; i++ {
		if _, err := st.CreateSession(fmt.Sprintf("real-%d", i), SessionMeta{}); err != nil {
			t.Fatalf("initialized session %d refused: %v", i, err)
		}
	}
	if _, err := st.CreateSession("real-8", SessionMeta{}); !errors.Is(err, ErrTooManySessions) {
		t.Fatalf("beyond max_sessions: %v", err)
	}
	// A confirmed adopted session moves to the others' share.
	st.Delete("real-0", policy.ReasonDeleted)
	a, _ := st.Session("made-up-0")
	a.Confirm()
	if a.Meta().Origin != policy.Resumed {
		t.Fatalf("origin after Confirm: %v", a.Meta().Origin)
	}
	if _, err := st.CreateSession("made-up-3", SessionMeta{Origin: policy.Adopted}); err != nil {
		t.Fatalf("adopted share not freed by Confirm: %v", err)
	}
	if _, err := st.CreateSession("real-9", SessionMeta{}); !errors.Is(err, ErrTooManySessions) {
		t.Fatalf("the confirmed session must count among the others: %v", err)
	}
}

// Ended request streams leave the session once they hold nothing and more
// than EndedStreamsKept others ended after them: a session that makes many
// short calls keeps a bounded number of records.
func TestEndedStreamsRetire(t *testing.T) {
	st, clk := newStore(t, bigLimits())
	s := mustSession(t, st, "s1")
	const calls = 1000
	for i := 0; i < calls; i++ {
		str := mustStream(t, s, fmt.Sprint(i))
		if _, err := str.Append(context.Background(), fields(payload(1, evSize)), []string{fmt.Sprint(i)}); err != nil {
			t.Fatal(err)
		}
		str.Complete()
		r, _ := str.Attach(1)
		readUntil(t, r, 1)
		r.Delivered(1)
		r.Close()
	}
	clk.Advance(time.Minute)
	st.Sweep()
	held := len(s.(*memSession).streams)
	if held != EndedStreamsKept {
		t.Fatalf("%d stream records held after %d calls, want %d", held, calls, EndedStreamsKept)
	}
	if _, ok := s.Stream(calls); !ok {
		t.Fatal("the newest stream was retired")
	}
	if _, ok := s.Stream(1); ok {
		t.Fatal("the oldest stream was not retired")
	}
	if s.NextStream() != calls+1 {
		t.Fatal("retiring must not reuse stream numbers")
	}
	if st.Stats().RetainedBytes != 0 {
		t.Fatalf("RetainedBytes = %d", st.Stats().RetainedBytes)
	}
}

func TestCloseStore(t *testing.T) {
	st := NewMemoryStore(Options{Limits: bigLimits()})
	str := mustStream(t, mustSession(t, st, "s1"))
	appendN(t, str, 2, evSize)
	r, _ := str.Attach(3)
	done := async(func() error { _, err := readAll(t, r); return err })
	st.Close()
	var fe *FailedError
	if err := <-done; !errors.Is(err, ErrSessionGone) && !(errors.As(err, &fe) && fe.Reason == policy.ReasonDeleted) {
		t.Fatalf("reader after Close: %v", err)
	}
	if s := st.Stats(); s.Sessions != 0 || s.RetainedBytes != 0 {
		t.Fatalf("stats after close %+v", s)
	}
	assertNoEarlyEviction(t, st)
}

// The standalone stream is one log for the session's life: a failure (a
// stall, an oversized event) puts its signal in and the stream goes on.
func TestStandaloneGoesOnAfterFailure(t *testing.T) {
	st, _ := newStore(t, bigLimits())
	s := mustSession(t, st, "s1")
	g := s.Standalone()
	g.ClaimProducer()
	appendN(t, g, 2, evSize)
	g.Fail(policy.ReasonStalled, Signal{Fields: fields(payload(3, evSize))})
	if v := g.View(); v.State != policy.Live || v.Head != 3 {
		t.Fatalf("after a failure: %+v", v)
	}
	appendN(t, g, 2, evSize)
	r, _ := g.Attach(1)
	evs, _ := readUntil(t, r, 5)
	checkSeqs(t, evs, 1, evSize)
	if n := st.Counters().FailedStreams()[policy.ReasonStalled]; n != 1 {
		t.Fatalf("FailedStreams[stalled] = %d", n)
	}
}

func TestStandaloneReaderEndsWithoutProducer(t *testing.T) {
	st, _ := newStore(t, bigLimits())
	g := mustSession(t, st, "s1").Standalone()
	if !g.ClaimProducer() {
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
	r2.Close()
	ack(str, 4)
	r3, _ := str.Attach(FromUndelivered)
	evs, _ = readUntil(t, r3, 1)
	checkSeqs(t, evs, 5, evSize)
}
