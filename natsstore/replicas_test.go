package natsstore

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"testing"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/buffer"
	"github.com/mcpresume/caddy-mcp-resume/internal/eventid"
	"github.com/mcpresume/caddy-mcp-resume/internal/testnet"
	"github.com/mcpresume/caddy-mcp-resume/policy"
)

// Two Stores on one server are two replicas of a zone.

func testLimits() buffer.Limits {
	return buffer.Limits{
		MaxStreamBytes: 16 << 20, MaxSessionBytes: 64 << 20, MaxTotalBytes: 256 << 20,
		MaxSessions: 1000, MaxStreamsPerSession: 100,
		ResumeWindow: time.Minute, StallTimeout: time.Minute,
	}
}

// openAt opens a replica connected to urls.
func openAt(t testing.TB, urls []string, mod ...func(*Options)) *Store {
	t.Helper()
	return openStore(t, Options{URLs: urls, Limits: testLimits()}, mod...)
}

// replicas opens two replicas of a zone, A and B, on a server of their own.
func replicas(t testing.TB, mod ...func(*Options)) (a, b *Store) {
	t.Helper()
	urls := []string{testnet.NATS(t).ClientURL()}
	return openAt(t, urls, mod...), openAt(t, urls, mod...)
}

// sessionOn waits until st knows session id, and returns it.
func sessionOn(t testing.TB, st *Store, id string) buffer.Session {
	t.Helper()
	var s buffer.Session
	waitUntil(t, "the replica to know session "+id, 10*time.Second, func() bool { s, _ = st.Session(id); return s != nil })
	return s
}

// crash stops a replica as a killed process would: nothing is flushed,
// released or ended.
func crash(st *Store) { st.closeOnce.Do(st.shutdown) }

// scanNow waits until a scan begun after the call has finished on st,
// the sweeping replica.
func (st *Store) scanNow(t testing.TB) {
	t.Helper()
	n := st.scans.Load()
	waitUntil(t, "a scan", 30*time.Second, func() bool { return st.scans.Load() >= n+2 })
}

func waitUntil(t testing.TB, what string, d time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// callOn opens session "sess" on st and a call in it, and takes its
// producer role.
func callOn(t testing.TB, st *Store) (buffer.Session, buffer.Stream, buffer.Producer) {
	t.Helper()
	return callIn(t, st, "sess")
}

// callIn is callOn for session id.
func callIn(t testing.TB, st *Store, id string) (buffer.Session, buffer.Stream, buffer.Producer) {
	t.Helper()
	s, err := st.CreateSession(id, buffer.SessionMeta{})
	if err != nil {
		t.Fatal(err)
	}
	str, err := s.NewStream([]string{"1"}, [32]byte{1})
	if err != nil {
		t.Fatal(err)
	}
	return s, str, claim(t, str)
}

// claim takes the producer role of str.
func claim(t testing.TB, str buffer.Stream) buffer.Producer {
	t.Helper()
	p := tryClaim(str)
	if p == nil {
		t.Fatal("no producer role")
	}
	return p
}

// tryClaim takes the producer role of str; nil if another holds it.
func tryClaim(str buffer.Stream) buffer.Producer {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	p, err := str.TakeProducer(ctx)
	if err != nil {
		return nil
	}
	return p
}

func appendEvents(t testing.TB, str buffer.Stream, from, to uint64) {
	t.Helper()
	for seq := from; seq <= to; seq++ {
		got, err := str.Append(context.Background(), buffer.Entry{Fields: []byte(fmt.Sprintf("data: event %d\n", seq))})
		if err != nil || got != seq {
			t.Fatalf("append %d: %d %v", seq, got, err)
		}
	}
}

// readSeqs reads until n events or the end, checking each event's bytes.
func readSeqs(t testing.TB, r buffer.Reader, epoch string, num uint32, from uint64, n int) ([]uint64, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var seqs []uint64
	for len(seqs) < n {
		b, err := r.Read(ctx, nil, 1<<20, time.Hour)
		var all []byte
		for _, d := range b.Data {
			all = append(all, d...)
		}
		for seq := b.First; len(b.Data) > 0 && seq <= b.Last; seq++ {
			want := "id: " + eventid.ID{Epoch: epoch, Stream: num, Seq: seq}.String() + "\n" + fmt.Sprintf("data: event %d\n\n", seq)
			if !bytes.HasPrefix(all, []byte(want)) {
				t.Fatalf("event %d: got %q, want %q", seq, all[:min(len(all), len(want))], want)
			}
			all = all[len(want):]
			seqs = append(seqs, seq)
		}
		if err != nil {
			return seqs, err
		}
	}
	return seqs, nil
}

func checkRun(t testing.TB, seqs []uint64, from, to uint64) {
	t.Helper()
	if len(seqs) != int(to-from+1) {
		t.Fatalf("read %d events, want %d..%d", len(seqs), from, to)
	}
	for i, s := range seqs {
		if s != from+uint64(i) {
			t.Fatalf("event %d is seq %d, want %d", i, s, from+uint64(i))
		}
	}
}

// A stream appended on A is resumed on B: exactly the rest, then live as
// A appends, then its end.
func TestResumeOnAnotherReplica(t *testing.T) {
	t.Parallel()
	a, b := replicas(t)
	if !bytes.Equal(a.Key(), b.Key()) {
		t.Fatal("replicas have different zone secrets")
	}
	sa, err := a.CreateSession("sess", buffer.SessionMeta{Version: "2025-06-18"})
	if err != nil {
		t.Fatal(err)
	}
	str, _ := sa.NewStream([]string{"1"}, [32]byte{1})
	appendEvents(t, str, 1, 10)
	sb := sessionOn(t, b, "sess")
	if sb.Epoch() != sa.Epoch() || !eventid.Minted(b.Key(), "sess", sb.Epoch()) {
		t.Fatal("B sees another epoch")
	}
	stB, ok := sb.Stream(str.Num())
	if !ok {
		t.Fatal("B does not know the stream")
	}
	// The client saw 1..4 on A, then reconnected to B.
	waitUntil(t, "B to see the head", 10*time.Second, func() bool { return stB.View().Head == 10 })
	in := policy.ResumeInput{SessionHeader: true,
		Session: policy.SessionView{Known: true, Epoch: sb.Epoch(), NextStream: sb.NextStream()},
		Cursor:  policy.Cursor{Valid: true, Minted: true, Epoch: sb.Epoch(), Stream: str.Num(), Seq: 4}}
	d, r, err := stB.Resume(4, func(v policy.StreamView) policy.Resume { in.Stream = &v; return policy.DecideResume(in) })
	if err != nil || d.Kind != policy.Replay || d.From != 5 || r == nil {
		t.Fatalf("resume on B: %+v %v", d, err)
	}
	defer r.Close()
	seqs, err := readSeqs(t, r, sb.Epoch(), str.Num(), 5, 6)
	if err != nil {
		t.Fatal(err)
	}
	checkRun(t, seqs, 5, 10)
	go func() {
		appendEvents(t, str, 11, 30)
		str.Complete()
	}()
	seqs, err = readSeqs(t, r, sb.Epoch(), str.Num(), 11, 100)
	if err != io.EOF {
		t.Fatalf("end of the stream on B: %v", err)
	}
	checkRun(t, seqs, 11, 30)
	if v := stB.View(); v.State != policy.Complete || v.Floor != 5 {
		t.Fatalf("B's view at the end: %+v", v)
	}
}

// A client that moves to B takes the stream over from its connection on A.
func TestTakeoverAcrossReplicas(t *testing.T) {
	t.Parallel()
	a, b := replicas(t)
	sa, _ := a.CreateSession("sess", buffer.SessionMeta{})
	str, _ := sa.NewStream([]string{"1"}, [32]byte{1})
	appendEvents(t, str, 1, 3)
	ra, err := str.Attach(1)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := readSeqs(t, ra, sa.Epoch(), 1, 1, 3); err != nil {
		t.Fatal(err)
	}
	waiting := make(chan error, 1)
	go func() {
		_, err := ra.Read(context.Background(), nil, 1<<20, time.Minute)
		waiting <- err
	}()
	sb := sessionOn(t, b, "sess")
	stB, _ := sb.Stream(1)
	rb, err := stB.Attach(2)
	if err != nil {
		t.Fatal(err)
	}
	defer rb.Close()
	select {
	case err := <-waiting:
		if !errors.Is(err, buffer.ErrTakenOver) {
			t.Fatalf("A's reader ended with %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("A's reader goes on after the takeover on B")
	}
	ra.Close()
	if !stB.Connected() || !str.Connected() {
		t.Fatal("closing A's reader detached B's")
	}
	seqs, err := readSeqs(t, rb, sb.Epoch(), 1, 2, 2)
	if err != nil {
		t.Fatal(err)
	}
	checkRun(t, seqs, 2, 3)
}

// Deleting on A ends the session on B: its context, its readers.
//
// Not parallel: under load B's handle was seen still live (head 0) once
// B's session context and reader had ended.
func TestDeleteAcrossReplicas(t *testing.T) {
	a, b := replicas(t)
	sa, _ := a.CreateSession("sess", buffer.SessionMeta{})
	str, _ := sa.NewStream([]string{"1"}, [32]byte{1})
	appendEvents(t, str, 1, 3)
	sb := sessionOn(t, b, "sess")
	stB, _ := sb.Stream(1)
	rb, _ := stB.Attach(1)
	defer rb.Close()
	if _, err := readSeqs(t, rb, sb.Epoch(), 1, 1, 3); err != nil {
		t.Fatal(err)
	}
	if !a.Delete("sess", policy.ReasonDeleted) {
		t.Fatal("Delete")
	}
	select {
	case <-sb.Context().Done():
	case <-time.After(10 * time.Second):
		t.Fatal("B's session context goes on")
	}
	select {
	case <-rb.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("B's reader goes on")
	}
	if _, err := rb.Read(context.Background(), nil, 1<<20, time.Second); !errors.Is(err, buffer.ErrSessionGone) {
		t.Fatalf("B's reader: %v", err)
	}
	if _, ok := b.Session("sess"); ok {
		t.Fatal("B still holds the session")
	}
	if tomb, ok := b.Tombstone("sess"); !ok || tomb.Reason != policy.ReasonDeleted {
		t.Fatalf("B's tombstone %+v %v", tomb, ok)
	}
	if _, err := str.Append(context.Background(), buffer.Entry{Fields: []byte("data: late\n")}); !errors.Is(err, buffer.ErrStreamEnded) {
		t.Fatalf("append on A after the delete: %v", err)
	}
	// B's handle still tells the requests the stream had (its relay fails
	// the ones its client was owed), though the record is gone.
	if v := stB.View(); v.State != policy.Failed || len(v.Requests) != 1 || v.Requests[0].ID != "1" || v.Floor != v.Head+1 {
		t.Fatalf("B's view of the deleted stream: %+v", v)
	}
}

// A resume on one replica while another deletes the session, caught
// between the purge of the events and the removal of the stream records:
// the cursor then reads as ahead of its stream, yet the answer is that the
// session ended, never a refusal of the cursor (a client re-initializes on
// neither, but a 400 tells it nothing of its lost call).
func TestResumeDuringADeletionElsewhere(t *testing.T) {
	t.Parallel()
	a, b := replicas(t)
	sa, _ := a.CreateSession("sess", buffer.SessionMeta{})
	str, _ := sa.NewStream([]string{"1"}, [32]byte{1})
	appendEvents(t, str, 1, 3) // small events: the record's head lags what is stored
	str.(*stream).currentWriter().waitStored(10 * time.Second)
	sb := sessionOn(t, b, "sess")
	stB, _ := sb.Stream(1)

	// A's deletion, halfway.
	ctx := context.Background()
	sh := sessionToken("sess")
	if err := a.sessions.remove(ctx, sh, 0); err != nil {
		t.Fatal(err)
	}
	if err := a.purge(ctx, a.names.evPrefix+sh+"."+sa.Epoch()+".>", 0); err != nil {
		t.Fatal(err)
	}
	if v := stB.View(); v.Head >= 2 {
		t.Fatalf("the record's head is %d already: this test needs it behind the cursor", v.Head)
	}
	cursor := policy.Cursor{Valid: true, Minted: true, Epoch: sb.Epoch(), Stream: 1, Seq: 2}
	d, rd, err := stB.Resume(2, func(v policy.StreamView) policy.Resume {
		return policy.DecideResume(policy.ResumeInput{SessionHeader: true, Cursor: cursor, Stream: &v,
			Session: policy.SessionView{Known: true, Epoch: sb.Epoch(), NextStream: 2}})
	})
	if !errors.Is(err, buffer.ErrSessionGone) || rd != nil {
		t.Fatalf("resume during the deletion: %v %v %+v", err, rd, d)
	}
}

// The standalone stream is one log for the session's life, fed by
// successive upstream GETs on whichever replica: each producer goes on
// from what the last one stored.
func TestStandaloneProducerMoves(t *testing.T) {
	t.Parallel()
	a, b := replicas(t)
	sa, _ := a.CreateSession("sess", buffer.SessionMeta{})
	sb := sessionOn(t, b, "sess")
	ga, gb := sa.Standalone(), sb.Standalone()
	produce := func(g buffer.Stream, from, to uint64) {
		t.Helper()
		var p buffer.Producer
		waitUntil(t, "the producer lease", 10*time.Second, func() bool { p = tryClaim(g); return p != nil })
		appendEvents(t, g, from, to)
		p.Done()
	}
	produce(ga, 1, 3)
	produce(gb, 4, 6)
	produce(ga, 7, 8)
	r, _ := gb.Attach(1)
	defer r.Close()
	seqs, err := readSeqs(t, r, sb.Epoch(), 0, 1, 100)
	if !errors.Is(err, buffer.ErrProducerGone) {
		t.Fatalf("end: %v", err)
	}
	checkRun(t, seqs, 1, 8)
	if n := a.Counters().EventsEvictedBeforeAck.Load() + b.Counters().EventsEvictedBeforeAck.Load(); n != 0 {
		t.Fatalf("EventsEvictedBeforeAck = %d", n)
	}
}

// Backpressure across replicas: a producer on A whose stream is full
// waits while its client reads on B at full speed (not a stall, though the
// window is longer than the stall timeout), and goes on as the window
// releases what B delivered; a resume on B acknowledging frees it at once.
//
// Not parallel: B's deliveries must reach A within the stall timeout
// (200ms).
func TestBackpressureAcrossReplicas(t *testing.T) {
	lim := testLimits()
	lim.MaxStreamBytes = 4 << 10
	lim.ResumeWindow = 500 * time.Millisecond
	lim.StallTimeout = 200 * time.Millisecond
	withLim := func(o *Options) { o.Limits = lim }
	a, b := replicas(t, withLim)
	sa, _ := a.CreateSession("sess", buffer.SessionMeta{})
	str, _ := sa.NewStream([]string{"1"}, [32]byte{1})
	sb := sessionOn(t, b, "sess")
	stB, _ := sb.Stream(1)
	rb, _ := stB.Attach(1)
	defer rb.Close()
	big := bytes.Repeat([]byte("x"), 1000)
	const n = 12
	done := make(chan error, 1)
	go func() {
		for seq := uint64(1); seq <= n; seq++ {
			if _, err := str.Append(context.Background(), buffer.Entry{Fields: append(append([]byte("data: "), big...), '\n')}); err != nil {
				done <- fmt.Errorf("append %d: %w", seq, err)
				return
			}
		}
		done <- nil
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for got := uint64(0); got < n; {
		batch, err := rb.Read(ctx, nil, 1<<20, time.Hour)
		if err != nil {
			t.Fatalf("read after %d: %v", got, err)
		}
		got = batch.Last
		rb.Delivered(got)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if a.Counters().Stalls.Load() == 0 {
		t.Fatal("no append waited: the bound was not exercised")
	}
	if n := a.Counters().FailedStreams()[policy.ReasonStalled]; n != 0 {
		t.Fatalf("a client reading at full speed on B was failed as stalled %d times", n)
	}

	// Full again, of events no one reads: a resume on B that acknowledges
	// frees A.
	rb.Close()
	lim.StallTimeout = time.Minute
	a.SetLimits(lim)
	waitUntil(t, "the window to release what B read", 10*time.Second, func() bool { return stB.View().Floor == n+1 })
	var blocked chan error
	for seq := uint64(n + 1); blocked == nil; seq++ {
		ch := make(chan error, 1)
		go func() {
			_, err := str.Append(context.Background(), buffer.Entry{Fields: append(append([]byte("data: "), big...), '\n')})
			ch <- err
		}()
		select {
		case err := <-ch:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(300 * time.Millisecond):
			blocked = ch
		}
	}
	head := str.View().Head
	waitUntil(t, "B to see the head", 10*time.Second, func() bool { return stB.View().Head == head })
	if _, r, err := stB.Resume(head, func(policy.StreamView) policy.Resume {
		return policy.Resume{Kind: policy.Gap, Then: policy.ThenEnd}
	}); err != nil || r != nil {
		t.Fatalf("resume on B: %v %v", r, err)
	}
	select {
	case err := <-blocked:
		if err != nil {
			t.Fatalf("append after the ack on B: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("A's append still blocked after the ack on B")
	}
}
