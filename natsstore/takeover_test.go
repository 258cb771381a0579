package natsstore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/buffer"
	"github.com/mcpresume/caddy-mcp-resume/internal/testnet"
	"github.com/mcpresume/caddy-mcp-resume/policy"
)

// produceWithCursor appends events from..to to str, each under upstream
// event ID up-<seq>, and waits until they are stored.
func produceWithCursor(t *testing.T, str buffer.Stream, from, to uint64) {
	t.Helper()
	for seq := from; seq <= to; seq++ {
		e := buffer.Entry{Fields: []byte(fmt.Sprintf("data: event %d\n", seq)), Upstream: fmt.Sprintf("up-%d", seq)}
		if got, err := str.Append(context.Background(), e); err != nil || got != seq {
			t.Fatalf("append %d: %d %v", seq, got, err)
		}
	}
	str.(*stream).currentWriter().waitStored(10 * time.Second)
}

// caughtUpOn is a reader of stream 1 of session "sess" on st, a replica
// that did not produce it, attached at 1 and past events 1..n (the ones
// produceWithCursor or appendEvents stored), with the session; the reader
// is closed when the test ends.
func caughtUpOn(t *testing.T, st *Store, n int) (buffer.Session, buffer.Stream, buffer.Reader) {
	t.Helper()
	s := sessionOn(t, st, "sess")
	str, _ := s.Stream(1)
	r, err := str.Attach(1)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	if _, err := readSeqs(t, r, s.Epoch(), 1, 1, n); err != nil {
		t.Fatal(err)
	}
	return s, str, r
}

// readToEnd reads r until the end of its stream, riding out
// ErrProducerGone (a takeover's producer comes), and returns the
// sequence numbers and the bytes it read.
func readToEnd(t *testing.T, ctx context.Context, r buffer.Reader) (seqs []uint64, data []byte) {
	t.Helper()
	for {
		batch, err := r.Read(ctx, nil, 8<<20, time.Hour)
		for seq := batch.First; len(batch.Data) > 0 && seq <= batch.Last; seq++ {
			seqs = append(seqs, seq)
		}
		for _, d := range batch.Data {
			data = append(data, d...)
		}
		if errors.Is(err, io.EOF) {
			return seqs, data
		}
		if err != nil && !errors.Is(err, buffer.ErrProducerGone) {
			t.Fatalf("the reader: %v (seqs %v)", err, seqs)
		}
	}
}

// A request stream's producer (A) dies with the upstream cursor stored.
// B's reader, caught up, is told its producer is gone; B takes the stream
// over (the lease decides: C cannot); A's batch still in flight (what the
// NATS client would send once A is back) is refused by B's fence, and not
// counted lost on A's behalf; B's appends go on from the stored head, and
// the sweeper, with an upstream cursor to resume from, left the stream live.
func TestTakeOverAStreamWhoseProducerDied(t *testing.T) {
	urls := []string{testnet.NATS(t).ClientURL()}
	mod := func(o *Options) { o.LeaseTTL = time.Second; o.TakeoverWait = time.Hour }
	a, b, c := openAt(t, urls, mod), openAt(t, urls, mod), openAt(t, urls, mod)
	sa, _ := a.CreateSession("sess", buffer.SessionMeta{})
	str, err := sa.NewStream([]string{"1"}, [32]byte{1})
	if err != nil {
		t.Fatalf("NewStream: %v", err)
	}
	if _, err := str.TakeProducer(context.Background()); err != nil {
		t.Fatalf("TakeProducer: %v", err)
	}
	produceWithCursor(t, str, 1, 3)
	w := str.(*stream).currentWriter()
	w.mu.Lock()
	staleExpect, staleOff := w.lastMsg, w.headOff
	w.mu.Unlock()
	crash(a)

	sb, stB, rb := caughtUpOn(t, b, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := rb.Read(ctx, nil, 1<<20, time.Hour); !errors.Is(err, buffer.ErrProducerGone) {
		t.Fatalf("B's reader, caught up after A died: %v, want ErrProducerGone", err)
	}
	if got := stB.UpstreamCursor(); got != "up-3" {
		t.Fatalf("upstream cursor %q, want up-3", got)
	}

	pb, who, err := stB.(buffer.Takeover).TakeOver(ctx)
	if err != nil {
		t.Fatalf("B's takeover: %v", err)
	}
	defer pb.Done()
	if who.Previous != a.opts.ReplicaID || who.Current != b.opts.ReplicaID {
		t.Fatalf("succession %+v, want %s -> %s", who, a.opts.ReplicaID, b.opts.ReplicaID)
	}
	sc := sessionOn(t, c, "sess")
	stC, _ := sc.Stream(1)
	if _, _, err := stC.(buffer.Takeover).TakeOver(ctx); err == nil {
		t.Fatal("C took the stream over too")
	}

	// A's batch of event 4, expecting A's last message: refused.
	s := str.(*stream)
	stale := batch{first: 4, off: staleOff, upstream: "up-4"}
	stale.buf = appendFramed(nil, sa.Epoch(), 1, 4, []byte("data: stale event 4\n"))
	stale.lens = []int{len(stale.buf)}
	if _, err := b.storeMsgs(stale.msgs(s.subject, s.key, b.partRoom), staleExpect, func() error { return nil }, nil, nil); !errors.Is(err, errConflict) {
		t.Fatalf("the old producer's batch after the fence: %v, want errConflict", err)
	}

	appendEvents(t, stB, 4, 5)
	if _, err := readSeqs(t, rb, sb.Epoch(), 1, 4, 2); err != nil {
		t.Fatal(err)
	}
	if v := stB.View(); v.State != policy.Live || v.Head != 5 {
		t.Fatalf("view after the takeover: %+v", v)
	}
	stB.Complete()
	if _, err := rb.Read(ctx, nil, 1<<20, time.Hour); !errors.Is(err, io.EOF) {
		t.Fatalf("after Complete: %v, want EOF", err)
	}
	if n := b.Counters().EventsEvictedBeforeAck.Load(); n != 0 {
		t.Fatalf("B counted %d events evicted before ack", n)
	}
}

// An orphan with an upstream cursor waits TakeoverWait for a takeover,
// then the sweeper fails it; one without a cursor is failed at LeaseTTL.
func TestOrphanWithACursorWaitsForATakeover(t *testing.T) {
	mod := func(o *Options) { o.LeaseTTL = time.Second; o.TakeoverWait = 3 * time.Second }
	a, b := replicas(t, mod)
	sa, _ := a.CreateSession("sess", buffer.SessionMeta{})
	withCursor, _ := sa.NewStream([]string{"1"}, [32]byte{1})
	without, _ := sa.NewStream([]string{"2"}, [32]byte{2})
	for _, str := range []buffer.Stream{withCursor, without} {
		if _, err := str.TakeProducer(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	produceWithCursor(t, withCursor, 1, 2)
	appendEvents(t, without, 1, 2)
	without.(*stream).currentWriter().waitStored(10 * time.Second)
	crash(a)
	died := time.Now()

	sb := sessionOn(t, b, "sess")
	state := func(num uint32) policy.StreamState {
		st, _ := sb.Stream(num)
		return st.View().State
	}
	waitUntil(t, "the orphan without a cursor to fail", 10*time.Second, func() bool { return state(2) == policy.Failed })
	if state(1) != policy.Live {
		t.Fatal("the orphan with a cursor failed with the one without")
	}
	waitUntil(t, "the orphan with a cursor to fail", 15*time.Second, func() bool { return state(1) == policy.Failed })
	if took := time.Since(died); took < 3*time.Second {
		t.Fatalf("the orphan with a cursor failed %v after its producer died: before TakeoverWait", took)
	}
}

// A client that comes back at the head of a call whose producer died
// acknowledges every event, and its resume evicts them all: their messages
// go, and the cursor the last one carried moves into the stream record. A
// sweep that read the record just before (no cursor in it) and looks for
// the message just after (none left) must still find the cursor, and leave
// the orphan to a takeover. (It failed the call: a restarted only replica
// did so, once, as its client came back.)
func TestOrphanEvictedWholeStillWaitsForATakeover(t *testing.T) {
	t.Parallel()
	a, b := replicas(t, func(o *Options) { o.LeaseTTL = time.Second })
	sa, _ := a.CreateSession("sess", buffer.SessionMeta{})
	str, _ := sa.NewStream([]string{"1"}, [32]byte{1})
	if _, err := str.TakeProducer(context.Background()); err != nil {
		t.Fatal(err)
	}
	produceWithCursor(t, str, 1, 3)
	key, strB := orphanOn(t, a, b, str)
	before, _, _ := b.streams.get(key)
	_, r, err := strB.Resume(3, func(policy.StreamView) policy.Resume { return policy.Resume{Kind: policy.Noop, From: 4} })
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if v := strB.View(); v.Floor != 4 {
		t.Fatalf("after the resume: floor %d, want every event evicted (floor 4)", v.Floor)
	}
	if !b.hasCursor(key, before) {
		t.Fatal("the sweep's look at the orphan, on the record read before the eviction, found no cursor: it fails the call")
	}
	b.scanNow(t)
	if v := strB.View(); v.State != policy.Live {
		t.Fatalf("after a scan: state %s, want the stream live for a takeover", v.State)
	}
	if got := strB.UpstreamCursor(); got != "up-3" {
		t.Fatalf("the cursor after the eviction: %q, want up-3", got)
	}
	p, _, err := strB.(buffer.Takeover).TakeOver(context.Background())
	if err != nil {
		t.Fatalf("takeover after the eviction: %v", err)
	}
	p.Done()
}

// A request stream's producer on A, cut off from NATS. With an upstream
// cursor stored, it stops itself before its lease can lapse (so B, taking
// the call over once it lapsed, finds the upstream's response closed); once
// NATS is back, A's late batch is refused by B's fence, and A does not take
// the lease back. Without a cursor (no one could take over) it reads on.
func TestARequestProducerCutOffStopsIfItCanBeTakenOver(t *testing.T) {
	ns := testnet.NATS(t)
	link := newCutter(t, strings.TrimPrefix(ns.ClientURL(), "nats://"))
	mod := func(o *Options) { o.LeaseTTL = 3 * time.Second; o.TakeoverWait = time.Hour }
	a := openAt(t, []string{"nats://" + link.addr()}, mod)
	b := openAt(t, []string{ns.ClientURL()}, mod)
	sa, err := a.CreateSession("fenced", buffer.SessionMeta{})
	if err != nil {
		t.Fatal(err)
	}
	withCursor, _ := sa.NewStream([]string{"1"}, [32]byte{1})
	without, _ := sa.NewStream([]string{"2"}, [32]byte{2})
	pa := claim(t, withCursor)
	pn := claim(t, without)
	defer pn.Done()
	produceWithCursor(t, withCursor, 1, 2)
	appendEvents(t, without, 1, 1)
	without.(*stream).currentWriter().waitStored(10 * time.Second)

	link.cut()
	cutAt := time.Now()
	select {
	case <-pa.Context().Done():
	case <-time.After(3 * time.Second):
		t.Fatal("A's producer of a stream with an upstream cursor did not stop before its lease TTL")
	}
	stoppedAfter := time.Since(cutAt)
	// What A accepted after the cut: never stored (B takes over).
	if _, err := withCursor.Append(context.Background(), buffer.Entry{Fields: []byte("data: event 3\n"), Upstream: "up-3"}); err != nil {
		t.Fatal(err)
	}
	pa.Done()

	stB, _ := sessionOn(t, b, "fenced").Stream(1)
	var pb buffer.Producer
	waitUntil(t, "B to take the stream over", 20*time.Second, func() bool {
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		defer cancel()
		if p, _, err := stB.(buffer.Takeover).TakeOver(ctx); err == nil {
			pb = p
		}
		return pb != nil
	})
	defer pb.Done()
	tookAfter := time.Since(cutAt)
	if got := stB.UpstreamCursor(); got != "up-2" {
		t.Fatalf("B resumes from %q, want up-2 (the last stored)", got)
	}
	appendEvents(t, stB, 3, 3)
	link.mend()
	waitUntil(t, "A to reach NATS again", 20*time.Second, func() bool { return a.Available() == nil })
	time.Sleep(2 * time.Second) // A's writer has tried its batch, and its lease renewals ran
	if pn.Context().Err() != nil {
		t.Fatal("the producer of the stream without a cursor stopped")
	}
	if a.holds(withCursor.(*stream).key) {
		t.Fatal("A holds the lease of the stream B took over")
	}
	if v := stB.View(); v.Head != 3 {
		t.Fatalf("head %d after A is back, want 3 (B's event 3 only)", v.Head)
	}
	if n := a.Counters().EventsEvictedBeforeAck.Load(); n != 0 {
		t.Fatalf("A counted %d events evicted before ack: they were B's to get again", n)
	}
	t.Logf("A stopped %v after the cut, B took over %v after it", stoppedAfter, tookAfter)
}

// The only replica is cut off while it produces a stream with an upstream
// cursor and its client's reader is fed here: its producer stops, no one
// takes over, and once NATS is back the same replica takes the stream back
// for that reader. Its writer must learn from JetStream where the stream
// stands (the stream was opened here, but its own fence and the old batches
// are stored since); it went on expecting its own last message and every
// takeover of its own stream conflicted.
func TestTheReplicaCutOffTakesItsOwnStreamBack(t *testing.T) {
	ns := testnet.NATS(t)
	link := newCutter(t, strings.TrimPrefix(ns.ClientURL(), "nats://"))
	a := openAt(t, []string{"nats://" + link.addr()}, func(o *Options) { o.LeaseTTL = 2 * time.Second; o.TakeoverWait = time.Hour })
	sa, err := a.CreateSession("own", buffer.SessionMeta{})
	if err != nil {
		t.Fatal(err)
	}
	str, _ := sa.NewStream([]string{"1"}, [32]byte{1})
	p := claim(t, str)
	rd, err := str.Attach(1)
	if err != nil {
		t.Fatal(err)
	}
	defer rd.Close()
	produceWithCursor(t, str, 1, 2)
	if _, err := readSeqs(t, rd, sa.Epoch(), 1, 1, 2); err != nil {
		t.Fatal(err)
	}

	link.cut()
	select {
	case <-p.Context().Done():
	case <-time.After(5 * time.Second):
		t.Fatal("the producer cut off did not stop")
	}
	p.Done()
	link.mend()
	waitUntil(t, "the replica to reach NATS again", 20*time.Second, func() bool { return a.Available() == nil })

	var taken buffer.Producer
	waitUntil(t, "the replica to take its own stream back", 20*time.Second, func() bool {
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		defer cancel()
		if p, _, err := str.(buffer.Takeover).TakeOver(ctx); err == nil {
			taken = p
		} else if errors.Is(err, errConflict) {
			t.Fatalf("takeover of its own stream: %v", err)
		}
		return taken != nil
	})
	defer taken.Done()
	if got := str.UpstreamCursor(); got != "up-2" {
		t.Fatalf("resumes the upstream from %q, want up-2", got)
	}
	appendEvents(t, str, 3, 4)
	if _, err := readSeqs(t, rd, sa.Epoch(), 1, 3, 2); err != nil {
		t.Fatalf("the reader after the takeover: %v", err)
	}
	str.Complete()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if _, err := rd.Read(ctx, nil, 1<<20, time.Hour); !errors.Is(err, io.EOF) {
		t.Fatalf("after Complete: %v, want EOF", err)
	}
}

// orphanOn crashes replica a, the producer of str (stream 1 of session
// "sess"), and waits until b sees the producer's lease lapse: str is an
// orphan there, for a takeover or the sweeper. It returns str's key and
// b's handle of it.
func orphanOn(t *testing.T, a, b *Store, str buffer.Stream) (string, buffer.Stream) {
	t.Helper()
	key := str.(*stream).key
	crash(a)
	strB, _ := sessionOn(t, b, "sess").Stream(1)
	waitUntil(t, "the producer's lease to lapse", 10*time.Second, func() bool { return !b.leased(context.Background(), key) })
	return key, strB
}
