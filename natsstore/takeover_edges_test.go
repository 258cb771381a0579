package natsstore

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/buffer"
	"github.com/mcpresume/caddy-mcp-resume/internal/testnet"
	"github.com/mcpresume/caddy-mcp-resume/policy"
)

// The sweeper ends an orphan whose takeover_wait ran out (failOrphan: the
// failure signals, the record's end, the end marker) after it found the
// lease lapsed, without taking the lease itself; a client coming back at
// that moment makes its replica take the stream over (TakeOver: the lease,
// the record, the fence). "The lease decides" (DESIGN.md, Takeover): one of
// the two must win, whole. A takeover that succeeds must find the stream
// live and go on from the stored head; it must never produce into a
// stream the sweeper failed, or after failure signals that already told
// the client its request was lost (the client would get the -32010 error,
// then the result).
func TestTakeoverAndTheSweepersEndOfAnOrphanExcludeEachOther(t *testing.T) {
	urls := []string{testnet.NATS(t).ClientURL()}
	mod := func(o *Options) { o.LeaseTTL = time.Second; o.TakeoverWait = time.Hour }
	b, c := openAt(t, urls, mod), openAt(t, urls, mod)
	bad := 0
	const trials = 50 // the window is a few KV writes wide: about one trial in fifteen meets it
	for i := range trials {
		a := openAt(t, urls, mod)
		id := fmt.Sprintf("race-%d", i)
		sa, _ := a.CreateSession(id, buffer.SessionMeta{})
		str, err := sa.NewStream([]string{"1"}, [32]byte{1})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := str.TakeProducer(context.Background()); err != nil {
			t.Fatal(err)
		}
		produceWithCursor(t, str, 1, 3)
		key := str.(*stream).key
		crash(a)
		sessionOn(t, b, id)
		stC, _ := sessionOn(t, c, id).Stream(1)
		waitUntil(t, "the lease to lapse", 10*time.Second, func() bool { return !b.leased(context.Background(), key) })

		var wg sync.WaitGroup
		var p buffer.Producer
		var terr error
		wg.Add(2)
		go func() { defer wg.Done(); b.failOrphan(key) }() // the sweeper, its !leased check passed
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			p, _, terr = stC.(buffer.Takeover).TakeOver(ctx)
		}()
		wg.Wait()
		if terr != nil {
			continue // the sweeper won
		}
		time.Sleep(200 * time.Millisecond)
		v := stC.View()
		if v.State != policy.Live || v.Head != 3 {
			bad++
			t.Errorf("trial %d: the takeover succeeded, and the stream is %s with head %d (want live, head 3: no failure signal before the fence)",
				i, v.State, v.Head)
		}
		p.Done()
		if bad > 0 {
			break
		}
	}
}

// A producer dies between the parts of an event (its first part stored,
// the rest never), the upstream cursor stored with the event before; B
// takes the stream over and the upstream's replay brings that event again,
// whole. B's reader gets events 1..4 once each, event 4 as the takeover
// stored it, never the abandoned part, then the end.
func TestTakeoverAfterAProducerDeadMidEvent(t *testing.T) {
	url := testnet.StockNATS(t).ClientURL()
	mod := func(o *Options) { o.LeaseTTL = time.Second; o.TakeoverWait = time.Hour }
	a, b := openAt(t, []string{url}, mod), openAt(t, []string{url}, mod)
	sa, _ := a.CreateSession("sess", buffer.SessionMeta{})
	str, _ := sa.NewStream([]string{"1"}, [32]byte{1})
	claim(t, str)
	produceWithCursor(t, str, 1, 3)
	strandFirstPart(t, a, str)
	crash(a)

	_, stB, rb := caughtUpOn(t, b, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := rb.Read(ctx, nil, 1<<20, time.Hour); !errors.Is(err, buffer.ErrProducerGone) {
		t.Fatalf("B's reader after A died mid event: %v, want ErrProducerGone", err)
	}
	if got := stB.UpstreamCursor(); got != "up-3" {
		t.Errorf("upstream cursor %q, want up-3 (the last whole event's): a takeover cannot resume the upstream", got)
	}
	pb, _, err := stB.(buffer.Takeover).TakeOver(ctx)
	if err != nil {
		t.Fatalf("B's takeover: %v", err)
	}
	defer pb.Done()
	big := bytes.Repeat([]byte("q"), 2*b.partRoom+100)
	e := buffer.Entry{Fields: append(append([]byte("data: "), big...), '\n'), Upstream: "up-4"}
	if seq, err := stB.Append(ctx, e); err != nil || seq != 4 {
		t.Fatalf("B's append of event 4 again: %d %v", seq, err)
	}
	appendEvents(t, stB, 5, 5)
	stB.Complete()
	seqs, got := readToEnd(t, ctx, rb)
	if fmt.Sprint(seqs) != "[4 5]" || bytes.Contains(got, []byte("ppp")) || !bytes.Contains(got, big) {
		t.Fatalf("after the takeover: seqs %v, %d bytes, abandoned part in it: %v, event 4 whole: %v",
			seqs, len(got), bytes.Contains(got, []byte("ppp")), bytes.Contains(got, big))
	}
}

// A producer stores the answer of the stream's only request and dies
// before its end marker: B's takeover must see the request answered (its
// view says so, from what is stored), so the engine completes the stream
// instead of asking the upstream for an answer it already gave; a reader
// gets the answer once, then the end.
func TestTakeoverOfAStreamAnsweredButNotEnded(t *testing.T) {
	urls := []string{testnet.NATS(t).ClientURL()}
	mod := func(o *Options) { o.LeaseTTL = time.Second; o.TakeoverWait = time.Hour }
	a, b := openAt(t, urls, mod), openAt(t, urls, mod)
	sa, _ := a.CreateSession("sess", buffer.SessionMeta{})
	str, err := sa.NewStream([]string{"7"}, [32]byte{1})
	if err != nil {
		t.Fatal(err)
	}
	claim(t, str)
	produceWithCursor(t, str, 1, 2)
	e := buffer.Entry{Fields: []byte("data: the answer\n"), Answers: []string{"7"}, Upstream: "up-3"}
	if seq, err := str.Append(context.Background(), e); err != nil || seq != 3 {
		t.Fatalf("append the answer: %d %v", seq, err)
	}
	str.(*stream).currentWriter().waitStored(10 * time.Second)
	crash(a)

	_, stB, rb := caughtUpOn(t, b, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var seqs []uint64
	for {
		batch, err := rb.Read(ctx, nil, 1<<20, time.Hour)
		for seq := batch.First; len(batch.Data) > 0 && seq <= batch.Last; seq++ {
			seqs = append(seqs, seq)
		}
		if errors.Is(err, buffer.ErrProducerGone) {
			break
		}
		if err != nil {
			t.Fatalf("B's reader: %v", err)
		}
	}
	p, _, err := stB.(buffer.Takeover).TakeOver(ctx)
	if err != nil {
		t.Fatalf("B's takeover: %v", err)
	}
	defer p.Done()
	for _, q := range stB.View().Requests {
		if q.AnsweredAt != 3 {
			t.Fatalf("request %s after the takeover: answered at %d, want 3 (stored before the producer died)", q.ID, q.AnsweredAt)
		}
	}
	stB.Complete()
	rest, _ := readToEnd(t, ctx, rb)
	seqs = append(seqs, rest...)
	if fmt.Sprint(seqs) != "[3]" {
		t.Fatalf("after event 2: seqs %v, want [3]", seqs)
	}
}
