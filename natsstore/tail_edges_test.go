package natsstore

// Review 24: adversarial checks of the takeover's repeat filter as the
// JetStream store keeps it (buffer.UpstreamTail: Mcpr-Ids, the record's
// tail kept past eviction).

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/buffer"
	"github.com/mcpresume/caddy-mcp-resume/internal/testnet"
	"github.com/mcpresume/caddy-mcp-resume/policy"
)

// edgeTail is str's UpstreamTail(n).
func edgeTail(t *testing.T, str buffer.Stream, n int) []buffer.TailEvent {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var got []buffer.TailEvent
	if err := str.(buffer.UpstreamTail).UpstreamTail(ctx, n, func(e buffer.TailEvent) { got = append(got, e) }); err != nil {
		t.Fatalf("UpstreamTail(%d): %v", n, err)
	}
	return got
}

// edgeWant is the tail events of entries (seq 1 on), those among the last n.
func edgeWant(entries []buffer.Entry, n int) []buffer.TailEvent {
	var want []buffer.TailEvent
	for i, e := range entries {
		if seq := uint64(i + 1); e.Upstream != "" && seq+uint64(n) > uint64(len(entries)) {
			want = append(want, buffer.TailEvent{Seq: seq, ID: e.Upstream, Sum: buffer.FieldsSum(e.Fields)})
		}
	}
	return want
}

// edgeAck resumes str acknowledging all but the last keep of its n events,
// and waits until they are evicted.
func edgeAck(t *testing.T, str buffer.Stream, n, keep int) buffer.Reader {
	t.Helper()
	from := uint64(n - keep + 1)
	_, rd, err := str.Resume(from-1, func(policy.StreamView) policy.Resume {
		return policy.Resume{Kind: policy.Replay, From: from}
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rd.Close() })
	waitUntil(t, "the acknowledged events evicted", 20*time.Second, func() bool { return str.View().Floor == from })
	return rd
}

// Upstream IDs an SSE id line may carry that are not valid UTF-8 (the
// proxy's parser keeps an ID's bytes as they came): Mcpr-Ids keeps them,
// and so must the record's tail once they are evicted, or the replay's
// repeat of such an event reaches the client twice after a takeover.
func TestTailEdgeTailKeepsNonUTF8IDsPastEviction(t *testing.T) {
	st, other := replicas(t)
	s, _ := st.CreateSession("s", buffer.SessionMeta{})
	str, _ := s.NewStream([]string{"1"}, [32]byte{1})
	claim(t, str)
	var all []buffer.Entry
	for i := 1; i <= 6; i++ {
		e := buffer.Entry{Fields: []byte(fmt.Sprintf("data: e%d\n", i)), Upstream: fmt.Sprintf("\xff\xfe-%d", i)}
		if _, err := str.Append(context.Background(), e); err != nil {
			t.Fatal(err)
		}
		all = append(all, e)
	}
	str.(*stream).currentWriter().waitStored(10 * time.Second)
	if got, want := edgeTail(t, str, 16), edgeWant(all, 16); !slices.Equal(got, want) {
		t.Fatalf("stored: %+v, want %+v", got, want)
	}
	edgeAck(t, str, len(all), 1)
	// Read on the replica that would take the call over, which decoded
	// the record from what was stored.
	so, _ := sessionOn(t, other, "s").Stream(1)
	waitUntil(t, "the other replica to see the floor move", 10*time.Second, func() bool { return so.View().Floor == uint64(len(all)) })
	if got, want := edgeTail(t, so, 16), edgeWant(all, 16); !slices.Equal(got, want) {
		t.Fatalf("evicted, read on another replica: %q, want %q", ids(got), ids(want))
	}
	if got, want := edgeTail(t, str, 16), edgeWant(all, 16); !slices.Equal(got, want) {
		t.Fatalf("evicted: %q, want %q", ids(got), ids(want))
	}
}

func ids(es []buffer.TailEvent) []string {
	var out []string
	for _, e := range es {
		out = append(out, e.ID)
	}
	return out
}

// The tail across evictions in steps and TailKeep's edge: 40 events,
// acknowledged in three resumes (one far from the head, one into the last
// 16, one of all but the last), then 5 more appended: the last 16 come
// back, each once, in order, whatever was evicted when.
func TestTailEdgeTailAcrossStepwiseEvictions(t *testing.T) {
	st := openEmbedded(t, testLimits())
	s, _ := st.CreateSession("s", buffer.SessionMeta{})
	str, _ := s.NewStream([]string{"1"}, [32]byte{1})
	claim(t, str)
	var all []buffer.Entry
	add := func(from, to int) {
		var es []buffer.Entry
		for i := from; i <= to; i++ {
			up := fmt.Sprintf("u%d", i)
			if i%7 == 0 {
				up = "" // some without an ID
			}
			es = append(es, buffer.Entry{Fields: []byte(fmt.Sprintf("data: e%d\n", i)), Upstream: up})
		}
		if _, n, err := buffer.AppendBatch(context.Background(), str, es); err != nil || n != len(es) {
			t.Fatal(err)
		}
		all = append(all, es...)
		str.(*stream).currentWriter().waitStored(10 * time.Second)
	}
	add(1, 40)
	for _, keep := range []int{30, 10, 1} {
		edgeAck(t, str, 40, keep).Close()
		for _, n := range []int{1, 16} {
			if got, want := edgeTail(t, str, n), edgeWant(all, n); !slices.Equal(got, want) {
				t.Fatalf("after acknowledging all but %d, tail(%d) = %v, want %v", keep, n, ids(got), ids(want))
			}
		}
	}
	add(41, 45)
	if got, want := edgeTail(t, str, 16), edgeWant(all, 16); !slices.Equal(got, want) {
		t.Fatalf("after 5 more, tail = %v, want %v", ids(got), ids(want))
	}
	rec, _, _ := st.streams.get(str.(*stream).key)
	for _, e := range rec.Tail {
		if e.Seq+buffer.TailKeep <= 40 {
			t.Fatalf("the record keeps %d, not among the last %d of 40: %+v", e.Seq, buffer.TailKeep, rec.Tail)
		}
	}
}

// A takeover of a takeover: A stores 1..4 and dies; B takes over (its
// fence), stores 5..8 under its IDs (one batch of two, a note after one),
// its client acknowledges 1..7, and B dies; C takes over: its tail is
// A's and B's events, each under its own ID, across the two fences.
func TestTailEdgeTailOfATakeoverOfATakeover(t *testing.T) {
	urls := []string{testnet.NATS(t).ClientURL()}
	mod := func(o *Options) { o.LeaseTTL = time.Second; o.TakeoverWait = time.Hour }
	a, b, c := openAt(t, urls, mod), openAt(t, urls, mod), openAt(t, urls, mod)
	sa, _ := a.CreateSession("sess", buffer.SessionMeta{})
	str, _ := sa.NewStream([]string{"1"}, [32]byte{1})
	claim(t, str)
	produceWithCursor(t, str, 1, 4)
	var all []buffer.Entry
	for i := 1; i <= 4; i++ {
		all = append(all, buffer.Entry{Fields: []byte(fmt.Sprintf("data: event %d\n", i)), Upstream: fmt.Sprintf("up-%d", i)})
	}
	crash(a)

	take := func(st *Store) buffer.Stream {
		t.Helper()
		_, s, r := caughtUpOn(t, st, 4)
		r.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		var err error
		for {
			if _, _, err = s.(buffer.Takeover).TakeOver(ctx); err == nil {
				return s
			}
			if ctx.Err() != nil {
				t.Fatalf("takeover: %v", err)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	stB := take(b)
	es := []buffer.Entry{
		{Fields: []byte("data: b5\n"), Upstream: "b-5"},
		{Fields: []byte("data: b6\n"), Upstream: "b-6"},
	}
	if _, n, err := buffer.AppendBatch(context.Background(), stB, es); err != nil || n != 2 {
		t.Fatal(err)
	}
	stB.NoteUpstream("prime-6")
	for i := 7; i <= 8; i++ {
		e := buffer.Entry{Fields: []byte(fmt.Sprintf("data: b%d\n", i)), Upstream: fmt.Sprintf("b-%d", i)}
		if _, err := stB.Append(context.Background(), e); err != nil {
			t.Fatal(err)
		}
		es = append(es, e)
	}
	all = append(all, es...)
	stB.(*stream).currentWriter().waitStored(10 * time.Second)
	if got, want := edgeTail(t, stB, 16), edgeWant(all, 16); !slices.Equal(got, want) {
		t.Fatalf("B's tail: %v, want %v", ids(got), ids(want))
	}
	edgeAck(t, stB, 8, 1).Close()
	crash(b)

	sc := sessionOn(t, c, "sess")
	stC, _ := sc.Stream(1)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for {
		_, _, err := stC.(buffer.Takeover).TakeOver(ctx)
		if err == nil {
			break
		}
		if ctx.Err() != nil || !errors.Is(err, buffer.ErrProducing) && !strings.Contains(err.Error(), "lease") {
			t.Fatalf("C's takeover: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if got, want := edgeTail(t, stC, 16), edgeWant(all, 16); !slices.Equal(got, want) {
		t.Fatalf("C's tail: %v, want %v", ids(got), ids(want))
	}
	if got := stC.UpstreamCursor(); got != "b-8" {
		t.Fatalf("C's cursor %q", got)
	}
}

// The record's tail is written into every later write of the record, and
// every replica's mirror holds it, for the call's life: its size with the
// longest IDs Mcpr-Ids records (maxTailID bytes of what JSON escapes six
// times over) stays small.
func TestTailEdgeTailRecordSize(t *testing.T) {
	for _, tc := range []struct {
		name string
		id   func(i int) string
		max  int
	}{
		{"SDK-like IDs", func(i int) string { return fmt.Sprintf("0_%d", i) }, 3 << 9},
		{"the longest IDs, escaped", func(i int) string { return strings.Repeat("\x01", maxTailID-3) + fmt.Sprintf("%03d", i) }, 16 << 10},
	} {
		t.Run(tc.name, func(t *testing.T) { edgeRecordSize(t, tc.id, tc.max) })
	}
}

func edgeRecordSize(t *testing.T, id func(int) string, limit int) {
	st := openEmbedded(t, testLimits())
	s, _ := st.CreateSession("s", buffer.SessionMeta{})
	str, _ := s.NewStream([]string{"1"}, [32]byte{1})
	claim(t, str)
	size := func() int {
		rec, _, _ := st.streams.get(str.(*stream).key)
		data, _ := json.Marshal(rec)
		return len(data)
	}
	var es []buffer.Entry
	for i := 1; i <= 20; i++ {
		es = append(es, buffer.Entry{Fields: []byte(fmt.Sprintf("data: e%d\n", i)), Upstream: id(i)})
	}
	if _, n, err := buffer.AppendBatch(context.Background(), str, es); err != nil || n != len(es) {
		t.Fatal(err)
	}
	str.(*stream).currentWriter().waitStored(10 * time.Second)
	before := size()
	edgeAck(t, str, 20, 1)
	after := size()
	t.Logf("the stream record: %d bytes before, %d with a tail of %d events of %d-byte IDs", before, after, buffer.TailKeep-1, len(id(1)))
	if got, want := edgeTail(t, str, 16), edgeWant(es, 16); !slices.Equal(got, want) {
		t.Fatalf("tail: %d events, want %d", len(got), len(want))
	}
	if after > limit {
		t.Fatalf("the record is %d bytes with the tail", after)
	}
}

// What a resume that acknowledges all a live call's client got (40
// events, one message each) costs the evicting replica, counted on the
// wire: logged for comparison with the commit before the tail.
func TestTailEdgeWhatAnEvictionAtTheHeadCosts(t *testing.T) {
	st := openEmbedded(t, testLimits())
	w := newWiretap(t, st)
	s, _ := st.CreateSession("s", buffer.SessionMeta{})
	str, _ := s.NewStream([]string{"1"}, [32]byte{1})
	claim(t, str)
	for seq := uint64(1); seq <= 40; seq++ {
		produceWithCursor(t, str, seq, seq) // a message each
	}
	time.Sleep(200 * time.Millisecond)
	w.since()
	edgeAck(t, str, 40, 1).Close()
	c := w.since()
	t.Logf("a resume acknowledging 39 of 40 events: %s", describe(c, 1))
	// 14 gets on the commit before the tail (d8334c9^), 49 with it read
	// back; the producer's replica takes it from its writer (tailRing).
	g := total(c, is("direct get")) + total(c, is("msg get"))
	t.Logf("%d gets", g)
	if g > 16 {
		t.Fatalf("%d gets: the producer's replica read the tail back", g)
	}
}

// How many writes of a live call's record carry the tail once a resume
// evicted at the head: 20 more events relayed to the client, one at a time.
func TestTailEdgeRecordWritesAfterATail(t *testing.T) {
	st := openEmbedded(t, testLimits())
	w := newWiretap(t, st)
	s, _ := st.CreateSession("s", buffer.SessionMeta{})
	str, _ := s.NewStream([]string{"1"}, [32]byte{1})
	claim(t, str)
	produceWithCursor(t, str, 1, 20)
	rd := edgeAck(t, str, 20, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := rd.Read(ctx, nil, 1<<20, time.Hour); err != nil {
		t.Fatal(err)
	}
	rec, _, _ := st.streams.get(str.(*stream).key)
	data, _ := json.Marshal(rec)
	w.since()
	for seq := uint64(21); seq <= 40; seq++ {
		produceWithCursor(t, str, seq, seq)
		if _, err := rd.Read(ctx, nil, 1<<20, time.Hour); err != nil {
			t.Fatal(err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	c := w.since()
	t.Logf("20 events relayed after the tail (record %d bytes, tail %d entries): %s", len(data), len(rec.Tail), describe(c, 20))
	if n := total(c, is("kv write streams")); n > 2 {
		t.Fatalf("%d writes of the record, each with the tail", n)
	}
}

// A client's resume evicts what it acknowledges before it returns (Resume
// calls evict): with the tail, an eviction at the head of a live call
// first reads back its last events, large ones whole. Timed: 7 events of
// 2 MiB (in parts), the client acknowledging all but the last.
func TestTailEdgeResumeLatencyWithLargeEventsAtTheHead(t *testing.T) {
	st := openEmbedded(t, testLimits())
	w := newWiretap(t, st)
	s, _ := st.CreateSession("s", buffer.SessionMeta{})
	str, _ := s.NewStream([]string{"1"}, [32]byte{1})
	claim(t, str)
	big := strings.Repeat("x", 2<<20)
	for i := 1; i <= 7; i++ {
		e := buffer.Entry{Fields: []byte(fmt.Sprintf("data: %d %s\n", i, big)), Upstream: fmt.Sprintf("u%d", i)}
		if _, err := str.Append(context.Background(), e); err != nil {
			t.Fatal(err)
		}
	}
	str.(*stream).currentWriter().waitStored(10 * time.Second)
	time.Sleep(200 * time.Millisecond)
	w.since()
	start := time.Now()
	_, rd, err := str.Resume(6, func(policy.StreamView) policy.Resume { return policy.Resume{Kind: policy.Replay, From: 7} })
	took := time.Since(start)
	if err != nil {
		t.Fatal(err)
	}
	defer rd.Close()
	c := w.since()
	t.Logf("Resume acknowledging 6 events of 2 MiB took %v: %s", took, describe(c, 1))
	// 8 direct gets on the commit before the tail (about 40 ms without
	// -race), 26 with it (about 145 ms: the eviction reads the 12 MiB
	// back before Resume returns).
	if g := total(c, is("direct get")); g > 40 {
		t.Fatalf("%d direct gets", g)
	}
}

// A producer died between the parts of event 4; B takes over, stores
// event 4 again whole (in parts) and 5; its client acknowledges 1..4 (the
// eviction reads the torn part, B's fence and B's parts) and B dies; C's
// tail: 1..5, event 4 with the sum of what B stored, once.
func TestTailEdgeTailAcrossATornEventAndTwoTakeovers(t *testing.T) {
	url := testnet.StockNATS(t).ClientURL()
	mod := func(o *Options) { o.LeaseTTL = time.Second; o.TakeoverWait = time.Hour }
	a, b, c := openAt(t, []string{url}, mod), openAt(t, []string{url}, mod), openAt(t, []string{url}, mod)
	sa, _ := a.CreateSession("sess", buffer.SessionMeta{})
	str, _ := sa.NewStream([]string{"1"}, [32]byte{1})
	claim(t, str)
	produceWithCursor(t, str, 1, 3)
	strandFirstPart(t, a, str)
	crash(a)
	var all []buffer.Entry
	for i := 1; i <= 3; i++ {
		all = append(all, buffer.Entry{Fields: []byte(fmt.Sprintf("data: event %d\n", i)), Upstream: fmt.Sprintf("up-%d", i)})
	}

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	takeOver := func(s buffer.Stream) {
		t.Helper()
		for {
			_, _, err := s.(buffer.Takeover).TakeOver(ctx)
			if err == nil {
				return
			}
			if ctx.Err() != nil {
				t.Fatalf("takeover: %v", err)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	_, stB, rb := caughtUpOn(t, b, 3)
	rb.Close()
	takeOver(stB)
	big := append(append([]byte("data: "), strings.Repeat("q", 2*b.partRoom+100)...), '\n')
	es := []buffer.Entry{{Fields: big, Upstream: "up-4"}, {Fields: []byte("data: event 5\n"), Upstream: "up-5"}}
	for _, e := range es {
		if _, err := stB.Append(ctx, e); err != nil {
			t.Fatal(err)
		}
	}
	all = append(all, es...)
	stB.(*stream).currentWriter().waitStored(10 * time.Second)
	if got, want := edgeTail(t, stB, 16), edgeWant(all, 16); !slices.Equal(got, want) {
		t.Fatalf("B's tail: %v, want %v", got, want)
	}
	edgeAck(t, stB, 5, 1).Close()
	crash(b)
	sc := sessionOn(t, c, "sess")
	stC, _ := sc.Stream(1)
	takeOver(stC)
	if got, want := edgeTail(t, stC, 16), edgeWant(all, 16); !slices.Equal(got, want) {
		t.Fatalf("C's tail: %v, want %v", got, want)
	}
}

// Messages stored before Mcpr-Ids existed (a batch of two, as an older
// replica published it): a takeover's tail reads them without an error,
// knows the events of one-event messages by their cursor, and takes a
// batch's events for ones without an ID (their repeats get through, as
// before), never for another event's ID.
func TestTailEdgeTailOfMessagesStoredBeforeMcprIds(t *testing.T) {
	urls := []string{testnet.NATS(t).ClientURL()}
	mod := func(o *Options) { o.LeaseTTL = time.Second; o.TakeoverWait = time.Hour }
	a, b := openAt(t, urls, mod), openAt(t, urls, mod)
	sa, _ := a.CreateSession("sess", buffer.SessionMeta{})
	str, _ := sa.NewStream([]string{"1"}, [32]byte{1})
	claim(t, str)
	produceWithCursor(t, str, 1, 3)
	w := str.(*stream).currentWriter()
	w.mu.Lock()
	expect, off := w.lastMsg, w.headOff
	w.mu.Unlock()
	old := batch{first: 4, off: off, upstream: "up-5", ups: []string{"up-4", "up-5"}}
	for seq := uint64(4); seq <= 5; seq++ {
		n := len(old.buf)
		old.buf = appendFramed(old.buf, sa.Epoch(), 1, seq, []byte(fmt.Sprintf("data: event %d\n", seq)))
		old.lens = append(old.lens, len(old.buf)-n)
	}
	s := str.(*stream)
	msgs := old.msgs(s.subject, s.key, a.partRoom)
	if len(msgs) != 1 || msgs[0].msg.Header.Get(hdrIDs) != "" {
		t.Fatalf("the old batch's messages: %d, %s %q", len(msgs), hdrIDs, msgs[0].msg.Header.Get(hdrIDs))
	}
	if _, err := a.storeMsgs(msgs, expect, func() error { return nil }, nil, nil); err != nil {
		t.Fatal(err)
	}
	crash(a)
	_, stB, rb := caughtUpOn(t, b, 5)
	rb.Close()
	got := edgeTail(t, stB, 16)
	var want []buffer.TailEvent
	for seq := uint64(1); seq <= 3; seq++ {
		want = append(want, buffer.TailEvent{Seq: seq, ID: fmt.Sprintf("up-%d", seq), Sum: buffer.FieldsSum([]byte(fmt.Sprintf("data: event %d\n", seq)))})
	}
	if !slices.Equal(got, want) {
		t.Fatalf("tail: %+v, want %+v", got, want)
	}
}

// A long call with sparse progress (one event every 150 ms, a resume
// window of 300 ms) relayed to its attached client: the sweeper evicts
// what was delivered past the window, always among the last 16, so every
// such eviction reads back what it purges. Counted for 20 events.
func TestTailEdgeSlowLiveCallEvictionCost(t *testing.T) {
	lim := testLimits()
	lim.ResumeWindow = 300 * time.Millisecond
	st := openEmbedded(t, lim)
	w := newWiretap(t, st)
	s, _ := st.CreateSession("s", buffer.SessionMeta{})
	str, _ := s.NewStream([]string{"1"}, [32]byte{1})
	claim(t, str)
	rd, err := str.Attach(1)
	if err != nil {
		t.Fatal(err)
	}
	defer rd.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	w.since()
	for seq := uint64(1); seq <= 20; seq++ {
		produceWithCursor(t, str, seq, seq)
		b, err := rd.Read(ctx, nil, 1<<20, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		rd.Delivered(b.Last)
		time.Sleep(150 * time.Millisecond)
	}
	time.Sleep(500 * time.Millisecond)
	c := w.since()
	t.Logf("floor %d after 20 sparse events: %s", str.View().Floor, describe(c, 20))
	// 2.75 direct gets an event on the commit before the tail, 6.9 with it.
	if g := float64(total(c, is("direct get"))) / 20; g > 8 {
		t.Fatalf("%.2f direct gets an event", g)
	}
}
