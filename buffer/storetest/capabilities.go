package storetest

import (
	"context"
	"errors"
	"io"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/buffer"
	"github.com/mcpresume/caddy-mcp-resume/policy"
)

// The optional capabilities (buffer/capabilities.go): each contract runs
// where the store under test has the capability and is skipped, saying
// so, where it has not. buffer.AppendBatch's fallback and the Inspector
// are every store's, so theirs run always.
var capabilityContracts = []contract{
	{"BatchAppender", testBatchAppender},
	{"BatchAppenderFallback", testBatchFallback},
	{"BatchAppenderStopsAtABlockedEntry", testBatchStops},
	{"Availability", testAvailability},
	{"TakeoverOnOneReplica", testTakeoverCapability},
	{"UpstreamTail", testUpstreamTail},
	{"CallOpener", testCallOpener},
	{"ReadyReader", testReadyReader},
	{"Inspector", testInspector},
}

// OpenCall is NewStream, TakeProducer and Attach(1) in one step: the
// stream is the session's next request stream, found by its request key,
// its producer's role is held (a second TakeProducer is refused), and its
// reader is the attached one: it reads what the producer appends to the
// end, and an Attach elsewhere takes over from it.
func testCallOpener(t *testing.T, e *env) {
	st := e.store(BigLimits())
	sess := MustSession(t, st, "s1")
	o, ok := sess.(buffer.CallOpener)
	if !ok {
		t.Skip("the store's sessions are no CallOpener")
	}
	MustStream(t, sess, "0") // stream 1
	str, p, rd, err := o.OpenCall(context.Background(), []string{"1"}, [32]byte{7})
	if err != nil {
		t.Fatal(err)
	}
	defer rd.Close()
	if str.Num() != 2 || str.Kind() != policy.RequestStream || sess.NextStream() != 3 {
		t.Fatalf("OpenCall made stream %d (%v), next %d; want 2, a request stream, 3", str.Num(), str.Kind(), sess.NextStream())
	}
	if found, ok := sess.StreamByKey([32]byte{7}); !ok || found.Num() != 2 {
		t.Fatalf("StreamByKey: %v", ok)
	}
	if !str.Connected() {
		t.Fatal("its reader is not connected")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	if _, err := str.TakeProducer(ctx); err == nil {
		t.Fatal("a second TakeProducer succeeded")
	}
	cancel()
	first, second := entry(1, "u1"), entry(2, "u2")
	second.Answers = []string{"1"}
	if _, n, err := buffer.AppendBatch(context.Background(), str, []buffer.Entry{first, second}); err != nil || n != 2 {
		t.Fatalf("append: %d, %v", n, err)
	}
	evs, err := ReadUntil(t, rd, 2)
	if err != nil {
		t.Fatal(err)
	}
	CheckSeqs(t, evs, 1, EvSize)
	rd.Delivered(2)
	str.Complete()
	p.Done()
	if evs, err := ReadAll(t, rd); len(evs) != 0 || !errors.Is(err, io.EOF) {
		t.Fatalf("after the end: %d events, %v; want none, EOF", len(evs), err)
	}
	if v := str.View(); v.State != policy.Complete || v.Head != 2 || len(v.Requests) != 1 || v.Requests[0].AnsweredAt != 2 {
		t.Fatalf("view after the end: %+v", v)
	}

	// Another call's reader is taken over by an Attach.
	str2, p2, rd2, err := o.OpenCall(context.Background(), []string{"2"}, [32]byte{8})
	if err != nil {
		t.Fatal(err)
	}
	defer p2.Done()
	defer rd2.Close()
	rd3, err := str2.Attach(1)
	if err != nil {
		t.Fatal(err)
	}
	defer rd3.Close()
	ctx, cancel = context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := rd2.Read(ctx, nil, 1<<20, 5*time.Second); !errors.Is(err, buffer.ErrTakenOver) {
		t.Fatalf("the OpenCall reader after another attached: %v, want ErrTakenOver", err)
	}
}

// A request stream's producer goes without ending it (its upstream read
// stopped: the replica was cut off): once its role has lapsed (at once, or
// a lease TTL later), exactly one TakeOver succeeds, from the stored
// upstream cursor, and what the new producer appends follows the stored
// head for the reader already attached; a running producer, a second
// taker and an ended stream are refused. What two replicas race for is
// natsstore's takeover_test.go.
func testTakeoverCapability(t *testing.T, e *env) {
	st := e.store(BigLimits())
	str := MustStream(t, MustSession(t, st, "s1"), "1")
	to, ok := str.(buffer.Takeover)
	if !ok {
		t.Skip("the store's streams are no Takeover")
	}
	p := MustProduce(t, str)
	for seq := uint64(1); seq <= 2; seq++ {
		if _, err := str.Append(context.Background(), entry(seq, "u"+strconv.FormatUint(seq, 10))); err != nil {
			t.Fatal(err)
		}
	}
	rd, err := str.Attach(1)
	if err != nil {
		t.Fatal(err)
	}
	defer rd.Close()
	evs, err := ReadUntil(t, rd, 2)
	if err != nil {
		t.Fatal(err)
	}
	CheckSeqs(t, evs, 1, EvSize)
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	if _, _, err := to.TakeOver(ctx); err == nil {
		t.Fatal("TakeOver succeeded while the producer runs")
	}
	cancel()

	p.Done() // gone, the stream unended
	var taken buffer.Producer
	gone := time.Now()
	for taken == nil {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		p, who, err := to.TakeOver(ctx)
		cancel()
		switch {
		case err == nil:
			if who.Current == "" {
				t.Errorf("succession %+v names no current producer", who)
			}
			taken = p
		case time.Since(gone) > time.Minute: // a lease TTL (15s by default) and its expiry
			t.Fatalf("the lapsed role not taken over after %v: %v", time.Since(gone), err)
		default:
			time.Sleep(50 * time.Millisecond)
		}
	}
	t.Logf("taken over %v after its producer went", time.Since(gone).Round(time.Millisecond))
	ctx, cancel = context.WithTimeout(context.Background(), time.Second)
	if _, _, err := to.TakeOver(ctx); err == nil {
		t.Fatal("a second TakeOver succeeded")
	}
	cancel()
	if got := str.UpstreamCursor(); got != "u2" {
		t.Fatalf("the taker resumes the upstream from %q, want u2", got)
	}
	if seq, err := str.Append(context.Background(), entry(3, "u3")); err != nil || seq != 3 {
		t.Fatalf("the taker's append: seq %d, %v; want 3", seq, err)
	}
	evs, err = ReadUntil(t, rd, 1)
	if err != nil {
		t.Fatal(err)
	}
	CheckSeqs(t, evs, 3, EvSize)
	str.Complete()
	taken.Done()
	ctx, cancel = context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if _, _, err := to.TakeOver(ctx); !errors.Is(err, buffer.ErrStreamEnded) {
		t.Fatalf("TakeOver of an ended stream: %v, want ErrStreamEnded", err)
	}
}

// plainStream hides every capability of the stream it wraps.
type plainStream struct{ buffer.Stream }

// batchEntries are n events from payload seq from carrying the upstream
// IDs u<seq>, the first of them answering answers, one each.
func batchEntries(from uint64, n int, answers ...string) []buffer.Entry {
	out := make([]buffer.Entry, n)
	for i := range out {
		seq := from + uint64(i)
		out[i] = entry(seq, "u"+strconv.FormatUint(seq, 10))
		if i < len(answers) {
			out[i].Answers = []string{answers[i]}
		}
	}
	return out
}

// batchStream is a request stream for the requests "a" and "b" holding two
// events, and str as a BatchAppender if it is one.
func batchStream(t *testing.T, e *env) (buffer.Backend, buffer.Stream, buffer.BatchAppender) {
	st := e.store(BigLimits())
	str := MustStream(t, MustSession(t, st, "s1"), `"a"`, `"b"`)
	MustProduce(t, str)
	AppendN(t, str, 2, EvSize)
	ba, _ := str.(buffer.BatchAppender)
	return st, str, ba
}

func testBatchAppender(t *testing.T, e *env) {
	_, str, ba := batchStream(t, e)
	if ba == nil {
		t.Skip("the store's streams are no BatchAppender")
	}
	checkBatch(t, str, func(es []buffer.Entry) (uint64, int, error) {
		return ba.AppendBatch(context.Background(), es)
	})
}

// buffer.AppendBatch gives a stream without the capability the same
// outcome, one Append each.
func testBatchFallback(t *testing.T, e *env) {
	_, str, _ := batchStream(t, e)
	checkBatch(t, str, func(es []buffer.Entry) (uint64, int, error) {
		return buffer.AppendBatch(context.Background(), plainStream{str}, es)
	})
}

// checkBatch appends a batch of five after the stream's two events: they
// get seqs 3..7 in order, their answers are recorded, the upstream cursor
// is the last one's, and a reader gets them framed as Append frames them.
func checkBatch(t *testing.T, str buffer.Stream, appendBatch func([]buffer.Entry) (uint64, int, error)) {
	t.Helper()
	last, n, err := appendBatch(batchEntries(3, 5, `"b"`))
	if err != nil || n != 5 || last != 7 {
		t.Fatalf("AppendBatch = %d, %d, %v; want 7, 5, nil", last, n, err)
	}
	if last, n, err := appendBatch(nil); err != nil || n != 0 || last != 0 {
		t.Fatalf("an empty batch = %d, %d, %v", last, n, err)
	}
	v := str.View()
	if v.Head != 7 {
		t.Fatalf("head %d, want 7", v.Head)
	}
	for _, q := range v.Requests {
		if want := map[string]uint64{`"a"`: 0, `"b"`: 3}[q.ID]; q.AnsweredAt != want {
			t.Fatalf("request %s answered at %d, want %d", q.ID, q.AnsweredAt, want)
		}
	}
	r, err := str.Attach(1)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	evs, err := ReadUntil(t, r, 7)
	if err != nil {
		t.Fatal(err)
	}
	for i, ev := range evs {
		if seq := uint64(i + 1); ev.Seq != seq || string(ev.Data) != string(Payload(seq, EvSize)) {
			t.Fatalf("event %d: seq %d %q", i, ev.Seq, ev.Data)
		}
	}
	if c := str.UpstreamCursor(); c != "u7" { // read, so stored
		t.Fatalf("upstream cursor %q, want u7", c)
	}
}

// An entry the log has no room for blocks the batch there; when the
// append gives up, what went before it is in, it and what follows are not,
// and the cursor is that of the last entry in. Through the capability (if
// the store has it) and the fallback alike.
func testBatchStops(t *testing.T, e *env) {
	for _, direct := range []bool{true, false} {
		lim := BigLimits()
		lim.MaxStreamBytes = 4 << 10
		st := e.store(lim)
		g := MustSession(t, st, "s1").Standalone()
		p := MustProduce(t, g)
		var str buffer.Stream = plainStream{g}
		if direct {
			if _, ok := g.(buffer.BatchAppender); !ok {
				continue
			}
			str = g
		}
		es := batchEntries(1, 40)
		for i := range es {
			es[i].Fields = Fields(Payload(uint64(i+1), bigSize)) // a few fit the bound
		}
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		last, n, err := buffer.AppendBatch(ctx, str, es)
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) || n == 0 || n == len(es) || last != uint64(n) {
			t.Fatalf("direct %v: a batch past the bound = %d, %d, %v", direct, last, n, err)
		}
		if h := g.View().Head; h != uint64(n) {
			t.Fatalf("direct %v: head %d after %d of the batch", direct, h, n)
		}
		p.Done()
		if c, want := g.UpstreamCursor(), "u"+strconv.Itoa(n); c != want {
			t.Fatalf("direct %v: cursor %q, want %q", direct, c, want)
		}
	}
}

// A store that can be out of reach says it is reachable while it is open,
// and not once it is closed.
func testAvailability(t *testing.T, e *env) {
	st := e.store(BigLimits())
	a, ok := st.(buffer.Availability)
	if !ok {
		if err := buffer.Available(st); err != nil {
			t.Fatalf("a store without Availability is unavailable: %v", err)
		}
		t.Skip("the store has no Availability")
	}
	if err := a.Available(); err != nil {
		t.Fatalf("an open store: %v", err)
	}
	if err := buffer.Available(st); err != nil {
		t.Fatalf("buffer.Available of an open store: %v", err)
	}
	st.Close()
	if a.Available() == nil {
		t.Fatal("a closed store is available")
	}
}

// The Inspector describes what the data path holds: every session, each
// one by ID, nothing of a deleted one.
func testInspector(t *testing.T, e *env) {
	st := e.store(BigLimits())
	a := MustSession(t, st, "a")
	MustSession(t, st, "b")
	AppendN(t, MustStream(t, a), 3, EvSize)
	if got := st.Sessions(); len(got) != 2 {
		t.Fatalf("Sessions: %d", len(got))
	}
	info := infoOf(t, st, a)
	if info.ID != "a" || info.Epoch != a.Epoch() || len(info.Streams) != 1 || info.Streams[0].Head != 3 {
		t.Fatalf("SessionInfo(a) = %+v", info)
	}
	if _, ok := st.SessionInfo("nobody"); ok {
		t.Fatal("SessionInfo of an unknown session")
	}
	st.Delete("a", policy.ReasonPurged)
	if _, ok := st.SessionInfo("a"); ok {
		t.Fatal("SessionInfo of a deleted session")
	}
	WaitFor(t, "Stats to count one session", func() bool { return st.Stats().Sessions == 1 })
}

// The last events come back with the upstream ID each came with (not the
// cursor as of it: an event without an ID keeps the one before, a note
// moves it past an event) and the sum of its fields, whether the events
// were appended one at a time or in batches, an event stored in parts (a
// large one) too; those among the last n, oldest first; IDs of any bytes
// an SSE id line can carry. What a client acknowledged of a live stream
// is evicted, and still comes back: the upstream's replay to a takeover
// resends just that.
func testUpstreamTail(t *testing.T, e *env) {
	st := e.store(BigLimits())
	s := MustSession(t, st, "s1")
	str := MustStream(t, s, "1")
	tl, ok := str.(buffer.UpstreamTail)
	if !ok {
		t.Skip("the store's streams are no UpstreamTail")
	}
	tail := func(n int) (got []buffer.TailEvent) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := tl.UpstreamTail(ctx, n, func(e buffer.TailEvent) { got = append(got, e) }); err != nil {
			t.Fatalf("UpstreamTail(%d): %v", n, err)
		}
		return got
	}
	if got := tail(8); len(got) != 0 {
		t.Fatalf("a fresh stream's tail: %d events", len(got))
	}
	p := MustProduce(t, str)
	var all []buffer.Entry
	add := func(es ...buffer.Entry) {
		t.Helper()
		if _, n, err := buffer.AppendBatch(context.Background(), str, es); err != nil || n != len(es) {
			t.Fatalf("AppendBatch: %d of %d: %v", n, len(es), err)
		}
		all = append(all, es...)
	}
	ev := func(seq uint64, size int, up string) buffer.Entry {
		return buffer.Entry{Fields: Fields(Payload(seq, size)), Upstream: up}
	}
	add(ev(1, EvSize, "u1"))                                             // alone: its own ID is the cursor
	add(ev(2, EvSize, ""))                                               // alone, without an ID: the cursor is u1's
	add(ev(3, EvSize, "u3"), ev(4, EvSize, ""), ev(5, EvSize, "u 5,%x")) // a batch
	str.NoteUpstream("p5")                                               // a priming event's ID after u5
	add(ev(6, EvSize, "u6"), ev(7, EvSize, "u6"))                        // an ID used twice
	str.NoteUpstream("p7")
	add(ev(8, 3<<20+5, "u8")) // larger than a message: in parts
	add(buffer.Entry{Fields: []byte("event: t\ndata: a\ndata: b\n"), Upstream: "u9"}, ev(10, EvSize, "é10"))
	str.NoteUpstream("p10")
	rd, err := str.Attach(1)
	if err != nil {
		t.Fatal(err)
	}
	defer rd.Close()
	if _, err := ReadUntil(t, rd, len(all)); err != nil { // stored, as a reader gets nothing before
		t.Fatal(err)
	}

	check := func(n int) {
		t.Helper()
		var want []buffer.TailEvent
		for i, e := range all {
			if seq := uint64(i + 1); e.Upstream != "" && seq+uint64(n) > uint64(len(all)) {
				want = append(want, buffer.TailEvent{Seq: seq, ID: e.Upstream, Sum: buffer.FieldsSum(e.Fields)})
			}
		}
		if got := tail(n); !slices.Equal(got, want) {
			t.Fatalf("UpstreamTail(%d) = %+v, want %+v", n, got, want)
		}
	}
	for _, n := range []int{1, 2, 3, 5, 10, 32} {
		check(n)
	}

	// The client acknowledges all but the last two: evicted, and still
	// in the tail (up to buffer.TailKeep of them).
	rd.Close()
	if _, rd, err = str.Resume(uint64(len(all)-2), func(v policy.StreamView) policy.Resume {
		return policy.Resume{Kind: policy.Replay, From: uint64(len(all) - 1)}
	}); err != nil {
		t.Fatal(err)
	}
	defer rd.Close()
	WaitFor(t, "the acknowledged events evicted", func() bool { return floorOf(str) == uint64(len(all)-1) })
	for _, n := range []int{1, 3, 10} {
		check(n)
	}
	p.Done()
}

// ReadReady takes what is ready without waiting: ErrIdle with nothing
// ready; events in order, at most maxBytes of them, more saying what was
// left; an event alone over maxBytes is not taken (more, ErrIdle); the
// stream's end as Read reports it, once everything before it was taken.
func testReadyReader(t *testing.T, e *env) {
	st := e.store(BigLimits())
	str := MustStream(t, MustSession(t, st, "s1"), `"a"`)
	p := MustProduce(t, str)
	r, err := str.Attach(1)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	ready, ok := r.(buffer.ReadyReader)
	if !ok {
		t.Skip("the store's readers are no ReadyReader")
	}
	dst := make([][]byte, 0, 8)
	if b, more, err := ready.ReadReady(dst, 1<<20); len(b.Data) != 0 || more || !errors.Is(err, buffer.ErrIdle) {
		t.Fatalf("nothing appended: %d events, more %v, %v; want none, ErrIdle", len(b.Data), more, err)
	}
	AppendN(t, str, 3, EvSize)
	// What an event takes of maxBytes, as another stream of the same events shows.
	twin := MustStream(t, MustSession(t, st, "s2"), `"a"`)
	MustProduce(t, twin)
	AppendN(t, twin, 1, EvSize)
	tr, err := twin.Attach(1)
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	tb, _, err := tr.(buffer.ReadyReader).ReadReady(nil, 1<<20)
	if err != nil || len(tb.Data) != 1 {
		t.Fatalf("the twin's event: %d, %v", len(tb.Data), err)
	}
	one := len(tb.Data[0])
	b, more, err := ready.ReadReady(dst, 2*one)
	if err != nil || !more || b.First != 1 || b.Last != 2 {
		t.Fatalf("3 ready, room for 2: %d..%d, more %v, %v", b.First, b.Last, more, err)
	}
	evs, err := Decode(b)
	if err != nil {
		t.Fatal(err)
	}
	CheckSeqs(t, evs, 1, EvSize)
	if b, more, err := ready.ReadReady(dst, one-1); len(b.Data) != 0 || !more || !errors.Is(err, buffer.ErrIdle) {
		t.Fatalf("the next event over maxBytes: %d events, more %v, %v; want none, more, ErrIdle", len(b.Data), more, err)
	}
	if b, more, err := ready.ReadReady(dst, 1<<20); err != nil || more || b.First != 3 || b.Last != 3 {
		t.Fatalf("the last one: %d..%d, more %v, %v", b.First, b.Last, more, err)
	}
	r.Delivered(3)
	str.Complete()
	p.Done()
	if _, _, err := ready.ReadReady(dst, 1<<20); err != io.EOF {
		t.Fatalf("complete and all taken: %v, want io.EOF", err)
	}
}
