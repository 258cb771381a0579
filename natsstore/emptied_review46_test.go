package natsstore

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/buffer"
	"github.com/mcpresume/caddy-mcp-resume/internal/testnet"
)

// Review 46 (mended: emptied() now also asks that the record name no other
// producer; older than this work, 44c4ca8 made it certain). A call's producer
// on A is cut off from NATS with events 3..6 appended and not stored: 3
// in flight alone (message ID <key>.3), 4..6 the next batch (<key>.4). Its
// lease lapses; the call's client comes back on B, which takes the call
// over (fence: a takeover marker after A's message of 1..2) and stores 3
// and 4 from the upstream's replay in one message (<key>.3). The client
// acknowledges 4: B's floor moves to 5 and the subject is purged whole, the
// fence with it. A comes back: its publish of 3 is answered by JetStream
// as a duplicate of B's <key>.3 (see the next test) with that message's
// sequence; its publish of 4..6 (expecting that message, purged) finds the
// wrong last sequence and no message at all; emptied() reads the record
// from KV, finds the floor (5, moved by B's eviction of B's events) past
// what A stored (3), and A stores 4..6 "from nothing" into the stream B
// produces. B's next event (5) meets A's message: "another writer", B's
// writer fails, the event is counted evicted before acknowledgement (the
// BUG log) and the call fails; B's reader is handed A's events 5 and 6,
// which B's upstream never sent. The floor past what a writer stored does
// not say its own events were evicted: here the record names B as the
// producer (and before 44c4ca8 the same happened once A's mirror caught up).
func TestReview46FencedProducerPublishesFromNothingAfterTakeover(t *testing.T) {
	fencedProducerBack(t, true)
}

// Review 46 (mended: a takeover's writer names its messages after its
// marker, the sweeper's signals theirs ".f"; older than this work): the same cut, without
// the eviction. A writer's message IDs are the stream key and the batch's
// first seq, whoever writes: B's first message after its marker is
// <key>.3, as A's in-flight one. Back, A's publish of 3 is answered by
// JetStream as a duplicate (its 2-minute window is consulted before the
// expectation) with the sequence of B's message, so A's writer takes its
// event 3 for stored and expects B's message next: its publish of 4..6
// passes, and A's events follow B's in the stream though B took the call
// over: the fence is crossed. B's next publish fails ("another writer"),
// its event is lost (counted evicted before acknowledgement), the call
// fails, and B's reader gets B's 3..4 and then A's 5..6, which B's
// upstream never sent; A's answer (its event 6) is written into the
// record (request answered at 6, head 6), though B stored no answer.
func TestReview46FencedProducersPublishTakenForADuplicate(t *testing.T) {
	fencedProducerBack(t, false)
}

func fencedProducerBack(t *testing.T, evict bool) {
	var faults faultNotes
	note := faults.note
	ns := testnet.NATS(t)
	link := newCutter(t, strings.TrimPrefix(ns.ClientURL(), "nats://"))
	mod := func(o *Options) {
		o.LeaseTTL = 2 * time.Second
		o.TakeoverWait = time.Hour
	}
	a := openAt(t, []string{"nats://" + link.addr()}, mod, func(o *Options) {
		o.OnError = func(op string, err error) { note(fmt.Sprintf("A %s: %v", op, err)) }
	})
	b := openAt(t, []string{ns.ClientURL()}, mod, func(o *Options) {
		o.OnError = func(op string, err error) { note(fmt.Sprintf("B %s: %v", op, err)) }
		o.Hooks.EvictedBeforeAck = func(_ string, _ uint32, seq, n uint64) { note(fmt.Sprintf("B EVICTED BEFORE ACK %d+%d", seq, n)) }
	})
	sa, err := a.CreateSession("sess", buffer.SessionMeta{})
	if err != nil {
		t.Fatal(err)
	}
	str, err := sa.NewStream([]string{"1"}, [32]byte{1})
	if err != nil {
		t.Fatal(err)
	}
	claim(t, str)
	produceWithCursor(t, str, 1, 2)
	_, stB, rb := caughtUpOn(t, b, 2)
	rb.Close()

	link.cut()
	// Appended into the cut, before A's fence (2/3 of the TTL) could stop
	// its producer: published once NATS is back.
	for seq := uint64(3); seq <= 6; seq++ {
		e := buffer.Entry{Fields: []byte(fmt.Sprintf("data: A's event %d\n", seq)), Upstream: fmt.Sprintf("a-%d", seq)}
		if seq == 6 {
			e.Answers = []string{"1"} // A's answer to the call's request
		}
		if got, err := str.Append(context.Background(), e); err != nil || got != seq {
			t.Fatalf("A's append %d into the cut: %d %v", seq, got, err)
		}
		if seq == 3 {
			time.Sleep(200 * time.Millisecond) // 3 in flight alone; 4..6 the next batch
		}
	}

	// B takes the call over once A's lease lapsed, and stores 3..4.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for {
		_, _, err := stB.(buffer.Takeover).TakeOver(ctx)
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("B's takeover: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	subject := stB.(*stream).subject
	es := []buffer.Entry{{Fields: []byte("data: event 3\n"), Upstream: "b-3"}, {Fields: []byte("data: event 4\n"), Upstream: "b-4"}}
	if _, n, err := buffer.AppendBatch(context.Background(), stB, es); err != nil || n != 2 {
		t.Fatalf("B's batch 3..4: %d %v", n, err)
	}
	stB.(*stream).currentWriter().waitStored(10 * time.Second)
	var rd buffer.Reader
	if evict {
		rd = edgeAck(t, stB, 4, 0) // the client acknowledges 4: floor 5, the subject purged whole
		waitUntil(t, "the subject purged", 10*time.Second, func() bool {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			last, err := b.lastMsg(ctx, subject)
			return err == nil && last == nil
		})
	} else {
		var err error
		if rd, err = stB.Attach(3); err != nil {
			t.Fatal(err)
		}
		defer rd.Close()
	}

	link.mend()
	wa := str.(*stream).currentWriter()
	wa.waitStored(15 * time.Second)
	stored, _ := wa.storedHead()
	time.Sleep(300 * time.Millisecond) // A's answer synced, if it thinks it stored it
	t.Logf("A's writer once back: %v", writerErr(str))
	t.Logf("the events stream holds: %v", subjectMsgs(b, subject))

	// B produces on: its event 5.
	_, berr := stB.Append(context.Background(), buffer.Entry{Fields: []byte("data: event 5\n"), Upstream: "b-5"})
	stB.(*stream).currentWriter().waitStored(10 * time.Second)
	var read []string
	for {
		rctx, rcancel := context.WithTimeout(context.Background(), 2*time.Second)
		got, rerr := rd.Read(rctx, nil, 1<<20, time.Hour)
		rcancel()
		for _, d := range got.Data {
			read = append(read, string(d))
		}
		if rerr != nil {
			read = append(read, "<"+rerr.Error()+">")
			break
		}
	}
	fctx, fcancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer fcancel()
	b.streams.fetch(fctx, stB.(*stream).key)
	rec, _ := stB.(*stream).record()
	if stored > 3 || berr != nil || b.counters.EventsEvictedBeforeAck.Load() != 0 || strings.Contains(strings.Join(read, ""), "A's") {
		what := "B's client acknowledged everything B stored, and A published its events from nothing into B's stream"
		if !evict {
			what = "A's publish of 3 was answered as a duplicate of B's message, and A's 4..6 were stored after B's 3..4"
		}
		t.Fatalf("FAULT: A cut off while B took its call over; %s once A was back: A stored up to %d (want at most 3); "+
			"B's append 5: %v; B's writer: %v; B counted %d events evicted before acknowledgement; "+
			"B's reader read %q; the record's request answered at %d, head %d; faults: %q",
			what, stored, berr, writerErr(stB), b.counters.EventsEvictedBeforeAck.Load(), read,
			rec.Requests[0].AnsweredAt, rec.Head, faults.list())
	}
}
