package natsstore

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/buffer"
	"github.com/mcpresume/caddy-mcp-resume/internal/eventid"
	"github.com/mcpresume/caddy-mcp-resume/internal/testnet"
	"github.com/mcpresume/caddy-mcp-resume/policy"
)

// Events around the part size (one message's room) on a stock
// server: exactly the room, one byte either side, twice the room and one
// more, between small events. Each is read back whole and byte for byte,
// from the start, by a reader attached at it, with a byte budget of one
// (never a piece of one), and the floor moved event by event keeps the
// byte count exact and the next event whole.
func TestEventsAroundThePartSize(t *testing.T) {
	lim := testLimits()
	lim.MaxStreamBytes, lim.MaxSessionBytes = 64<<20, 64<<20
	lim.ResumeWindow = time.Millisecond
	st := openStore(t, Options{URLs: []string{testnet.StockNATS(t).ClientURL()}, Limits: lim})
	room := st.partRoom
	if room >= 2<<20 {
		t.Fatalf("part room %d: not a stock server", room)
	}
	s, err := st.CreateSession("sizes", buffer.SessionMeta{})
	if err != nil {
		t.Fatal(err)
	}
	str, err := s.NewStream([]string{"1"}, [32]byte{1})
	if err != nil {
		t.Fatal(err)
	}
	sizes := []int{60, room - 1, room, room + 1, 70, 2 * room, 2*room + 1, 3*room - 1, 80}
	var want [][]byte
	var offs []int64 // framed bytes before each event
	var off int64
	for i, n := range sizes {
		seq := uint64(i + 1)
		idLen := eventid.Len(eventid.EpochLen, str.Num(), seq)
		k := n - (len("id: ") + idLen + 1 + len("data: ") + 1 + 1)
		fields := append(append([]byte("data: "), bytes.Repeat([]byte{byte('a' + i)}, k)...), '\n')
		framed := append([]byte("id: "+eventid.ID{Epoch: s.Epoch(), Stream: str.Num(), Seq: seq}.String()+"\n"), fields...)
		framed = append(framed, '\n')
		if len(framed) != n {
			t.Fatalf("framed %d, want %d", len(framed), n)
		}
		got, err := str.Append(context.Background(), buffer.Entry{Fields: fields})
		if err != nil || got != seq {
			t.Fatalf("append %d (%d bytes): %d %v", seq, n, got, err)
		}
		want, offs = append(want, framed), append(offs, off)
		off += int64(n)
	}
	readOne := func(r buffer.Reader, maxBytes int) buffer.Batch {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		b, err := r.Read(ctx, nil, maxBytes, 10*time.Second)
		if err != nil {
			t.Fatalf("read at %d: %v", r.Next(), err)
		}
		return b
	}
	check := func(b buffer.Batch, what string) {
		t.Helper()
		var all []byte
		for _, d := range b.Data {
			all = append(all, d...)
		}
		var exp []byte
		for seq := b.First; seq <= b.Last; seq++ {
			exp = append(exp, want[seq-1]...)
		}
		if !bytes.Equal(all, exp) {
			t.Fatalf("%s: events %d..%d: got %d bytes, want %d (whole events)", what, b.First, b.Last, len(all), len(exp))
		}
	}

	// From the start, one event at a time (a byte budget of 1).
	r, err := str.Attach(1)
	if err != nil {
		t.Fatal(err)
	}
	for seq := uint64(1); seq <= uint64(len(sizes)); seq++ {
		b := readOne(r, 1)
		if b.First != seq || b.Last != seq {
			t.Fatalf("from the start: got %d..%d, want %d", b.First, b.Last, seq)
		}
		check(b, "from the start")
	}
	r.Close()

	// Attached at each event.
	for seq := uint64(1); seq <= uint64(len(sizes)); seq++ {
		r, err := str.Attach(seq)
		if err != nil {
			t.Fatal(err)
		}
		b := readOne(r, 1<<30)
		if b.First != seq {
			t.Fatalf("attached at %d: got %d..%d", seq, b.First, b.Last)
		}
		check(b, fmt.Sprintf("attached at %d", seq))
		r.Close()
	}

	// The floor moved event by event: exact byte count, the next event whole.
	key := str.(*stream).key
	for seq := uint64(1); seq < uint64(len(sizes)); seq++ {
		r, err := str.Attach(seq)
		if err != nil {
			t.Fatal(err)
		}
		readOne(r, 1)
		r.Delivered(seq)
		r.Close()
		if _, _, err := str.Resume(seq, func(policy.StreamView) policy.Resume {
			return policy.Resume{Kind: policy.Gap, Then: policy.ThenEnd}
		}); err != nil {
			t.Fatal(err)
		}
		waitUntil(t, fmt.Sprintf("the floor past %d", seq), 10*time.Second, func() bool {
			st.evict(key, time.Now().Add(time.Second))
			return str.View().Floor > seq
		})
		rec, _ := str.(*stream).record()
		if rec.Floor != seq+1 || rec.FloorOff != offs[seq] {
			t.Fatalf("floor %d at byte %d, want %d at byte %d", rec.Floor, rec.FloorOff, seq+1, offs[seq])
		}
		r, err = str.Attach(seq + 1)
		if err != nil {
			t.Fatal(err)
		}
		b := readOne(r, 1)
		if b.First != seq+1 {
			t.Fatalf("after the floor moved to %d: got %d..%d", seq+1, b.First, b.Last)
		}
		check(b, fmt.Sprintf("after the floor moved to %d", seq+1))
		r.Close()
	}
}

// A producer that dies between the parts of an event (its first part
// stored, the rest never): the other replica's sweeper fails the stream
// after the last whole event, and a reader there gets events 1..3 whole,
// then the gap (at 4, lastEventId 3) and the failure, never the part.
func TestAProducerDeadMidEventIsFailedAfterItsLastWholeEvent(t *testing.T) {
	url := testnet.StockNATS(t).ClientURL()
	mod := func(o *Options) { o.LeaseTTL = time.Second }
	a, b := openAt(t, []string{url}, mod), openAt(t, []string{url}, mod)
	sa, _ := a.CreateSession("sess", buffer.SessionMeta{})
	str, _ := sa.NewStream([]string{"1"}, [32]byte{1})
	claim(t, str)
	appendEvents(t, str, 1, 3)
	str.(*stream).currentWriter().waitStored(10 * time.Second)
	strandFirstPart(t, a, str)
	crash(a)

	sb, _, rb := caughtUpOn(t, b, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var rest []byte
	var first uint64
	for {
		batch, err := rb.Read(ctx, nil, 1<<20, time.Hour)
		if first == 0 && len(batch.Data) > 0 {
			first = batch.First
		}
		for _, d := range batch.Data {
			rest = append(rest, d...)
		}
		if errors.Is(err, buffer.ErrProducerGone) {
			continue // told once: no upstream cursor here, so the sweeper ends it
		}
		if err != nil {
			var fe *buffer.FailedError
			if !errors.As(err, &fe) || fe.Reason != policy.ReasonUpstreamFailed {
				t.Fatalf("B's reader ended with %v after %q", err, rest[:min(len(rest), 200)])
			}
			break
		}
	}
	gapID := eventid.ID{Epoch: sb.Epoch(), Stream: 1, Seq: 4}.String()
	lastID := eventid.ID{Epoch: sb.Epoch(), Stream: 1, Seq: 3}.String()
	if first != 4 || !bytes.HasPrefix(rest, []byte("id: "+gapID+"\nevent: gap\ndata: {\"lastEventId\":\""+lastID+"\"")) || bytes.Contains(rest, []byte("ppp")) {
		t.Fatalf("after event 3 (from %d): %q", first, rest[:min(len(rest), 300)])
	}
}

// strandFirstPart stores the first of the three parts of an event 4 of
// str, as a's writer would publish it first, and nothing after: what a
// producer that dies between the parts of an event leaves.
func strandFirstPart(t *testing.T, a *Store, str buffer.Stream) {
	t.Helper()
	w := str.(*stream).currentWriter()
	w.mu.Lock()
	off, last := w.headOff, w.lastMsg
	w.mu.Unlock()
	p1 := part(str.(*stream).subject, 4, 1, 3, 3*a.partRoom, string(bytes.Repeat([]byte("p"), a.partRoom)))
	p1.Header.Set(hdrOff, fmt.Sprint(off))
	if _, err := a.storeMsgs([]outMsg{{msg: p1, id: str.(*stream).key + ".4.p1", part: 1, partial: true, last: 3, endOff: off}},
		last, func() error { return nil }, nil, nil); err != nil {
		t.Fatal(err)
	}
}

// A reader on B attached at an event A is still publishing in parts gets
// it whole once its last part is in.
func TestAReaderOnAnotherReplicaWaitsForTheLastPart(t *testing.T) {
	url := testnet.StockNATS(t).ClientURL()
	a, b := openAt(t, []string{url}), openAt(t, []string{url})
	sa, _ := a.CreateSession("sess", buffer.SessionMeta{})
	str, _ := sa.NewStream([]string{"1"}, [32]byte{1})
	appendEvents(t, str, 1, 1)
	sb := sessionOn(t, b, "sess")
	stB, _ := sb.Stream(1)
	rb, err := stB.Attach(2)
	if err != nil {
		t.Fatal(err)
	}
	defer rb.Close()
	for round := uint64(2); round <= 6; round++ {
		fields := append(append([]byte("data: "), bytes.Repeat([]byte{byte('a' + round)}, 2*a.partRoom+int(round))...), '\n')
		got := make(chan buffer.Batch, 1)
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			bt, err := rb.Read(ctx, nil, 1, time.Minute)
			if err != nil {
				t.Error(err)
			}
			got <- bt
		}()
		if _, err := str.Append(context.Background(), buffer.Entry{Fields: fields}); err != nil {
			t.Fatal(err)
		}
		bt := <-got
		want := "id: " + eventid.ID{Epoch: sb.Epoch(), Stream: 1, Seq: round}.String() + "\n" + string(fields) + "\n"
		if bt.First != round || bt.Last != round || len(bt.Data) != 1 || string(bt.Data[0]) != want {
			t.Fatalf("event %d: got %d..%d, %d bytes", round, bt.First, bt.Last, len(bytes.Join(bt.Data, nil)))
		}
	}
}

// NATS back without its data twice in a row: after each, both replicas
// take new sessions again, the session of before the second loss is a
// tombstone on both, and each loss is told once per replica.
func TestNATSBackWithoutItsDataTwice(t *testing.T) {
	t.Parallel()
	srv, err := testnet.StartNATS(t.TempDir(), 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { testnet.ShutdownNATS(srv) })
	url, port := srv.ClientURL(), srv.Addr().(*net.TCPAddr).Port
	var mu sync.Mutex
	losses := 0
	mod := func(o *Options) { o.OnDataLost = func(DataLoss) { mu.Lock(); losses++; mu.Unlock() } }
	a, b := openAt(t, []string{url}, mod), openAt(t, []string{url}, mod)
	for round := 1; round <= 2; round++ {
		id := fmt.Sprint("round", round)
		sa, err := a.CreateSession(id, buffer.SessionMeta{})
		if err != nil {
			t.Fatalf("round %d: CreateSession: %v", round, err)
		}
		str, err := sa.NewStream([]string{"7"}, [32]byte{7})
		if err != nil {
			t.Fatal(err)
		}
		appendEvents(t, str, 1, 3)
		sessionOn(t, b, id)
		testnet.ShutdownNATS(srv)
		if srv, err = testnet.StartNATS(t.TempDir(), port); err != nil {
			t.Fatal(err)
		}
		for _, st := range []*Store{a, b} {
			waitUntil(t, "the store to be available again", 30*time.Second, func() bool { return st.Available() == nil })
			waitUntil(t, "the lost session to be forgotten", 10*time.Second, func() bool { _, ok := st.Session(id); return !ok })
			waitUntil(t, "its tombstone", 10*time.Second, func() bool { _, ok := st.Tombstone(id); return ok })
		}
		waitUntil(t, "both replicas to tell the loss", 10*time.Second, func() bool {
			mu.Lock()
			defer mu.Unlock()
			return losses == 2*round
		})
	}
	s, err := b.CreateSession("after", buffer.SessionMeta{})
	if err != nil {
		t.Fatal(err)
	}
	str, _ := s.NewStream([]string{"1"}, [32]byte{1})
	appendEvents(t, str, 1, 2)
	stA, _ := sessionOn(t, a, "after").Stream(str.Num())
	r, err := stA.Attach(1)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if _, err := readSeqs(t, r, s.Epoch(), str.Num(), 1, 2); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if losses != 4 {
		t.Fatalf("%d losses told, want 4", losses)
	}
}
