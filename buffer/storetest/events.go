package storetest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/buffer"
	"github.com/mcpresume/caddy-mcp-resume/internal/eventid"
	"github.com/mcpresume/caddy-mcp-resume/policy"
)

var eventContracts = []contract{
	{"AppendReadComplete", testAppendReadComplete},
	{"Framing", testFraming},
	{"ReaderFollowsLive", testReaderFollowsLive},
	{"ReadBatches", testReadBatches},
	{"FailedStream", testFailedStream},
	{"TooLarge", testTooLarge},
	{"ConcurrentAppendersAndReaders", testConcurrent},
	{"LargeEvents", testLargeEvents},
}

// Events of several MiB (a file, an image in base64: ordinary MCP tool
// results) are retained, read whole and in order from any position, live
// or stored, and evicted whole, among small ones; the byte accounting is
// their framed size, as for any event. (The JetStream store runs this
// against a server with NATS's default max_payload, 1 MiB: it stores
// them in parts.)
func testLargeEvents(t *testing.T, e *env) {
	st := e.store(BigLimits())
	s := MustSession(t, st, "s1")
	str := MustStream(t, s)
	sizes := []int{EvSize, 4 << 20, EvSize, 3<<20 + 17, 1 << 20, EvSize, 2 << 20}
	framed := make([]int64, len(sizes))
	for i, n := range sizes {
		seq := uint64(i + 1)
		if got := MustAppend(t, str, Payload(seq, n)); got != seq {
			t.Fatalf("Append gave seq %d, want %d", got, seq)
		}
		framed[i] = int64(len("id: ")+len(eventid.ID{Epoch: s.Epoch(), Stream: str.Num(), Seq: seq}.String())+1) +
			int64(len(Fields(Payload(seq, n)))) + 1
	}
	check := func(evs []Event, from uint64) {
		t.Helper()
		for i, ev := range evs {
			seq := from + uint64(i)
			if ev.Seq != seq || !bytes.Equal(ev.Data, Payload(seq, sizes[seq-1])) {
				t.Fatalf("event #%d: seq %d, %d bytes; want seq %d, %d bytes", i, ev.Seq, len(ev.Data), seq, sizes[seq-1])
			}
		}
	}
	for from := uint64(1); from <= uint64(len(sizes)); from++ {
		r, err := str.Attach(from)
		if err != nil {
			t.Fatal(err)
		}
		evs, err := ReadUntil(t, r, len(sizes)-int(from)+1)
		if err != nil {
			t.Fatalf("read from %d: %v", from, err)
		}
		check(evs, from)
		r.Close()
	}
	// Live: a reader waiting at the head gets the next large event whole.
	r, _ := str.Attach(uint64(len(sizes)) + 1)
	sizes = append(sizes, 5<<20)
	n := uint64(len(sizes))
	got := Async(func() []Event { evs, _ := ReadUntil(t, r, 1); return evs })
	MustAppend(t, str, Payload(n, sizes[n-1]))
	check(<-got, n)
	r.Close()
	framed = append(framed, int64(len("id: ")+len(eventid.ID{Epoch: s.Epoch(), Stream: str.Num(), Seq: n}.String())+1)+
		int64(len(Fields(Payload(n, sizes[n-1]))))+1)
	retained := func(from int) (b int64) {
		for _, f := range framed[from:] {
			b += f
		}
		return b
	}
	// What a store counts is the events' framed bytes (the memory store
	// adds its chunks' overhead, well below 1/16).
	about := func(b, want int64) bool { return b >= want && b <= want+want/16 }
	if b := st.Stats().RetainedBytes; !about(b, retained(0)) {
		t.Fatalf("RetainedBytes = %d, want about %d (the events' framed bytes)", b, retained(0))
	}
	// Evicted whole: the floor moves past a large event and onto another.
	ack(t, str, 3)
	if v := str.View(); v.Floor != 4 {
		t.Fatalf("floor %d after ack(3)", v.Floor)
	}
	WaitFor(t, "RetainedBytes to drop the acknowledged events", func() bool { return about(st.Stats().RetainedBytes, retained(3)) })
	str.Complete()
	r2, err := str.Attach(4)
	if err != nil {
		t.Fatal(err)
	}
	evs, err := ReadAll(t, r2)
	if err != io.EOF {
		t.Fatalf("end: %v, want io.EOF", err)
	}
	check(evs, 4)
	if len(evs) != len(sizes)-3 {
		t.Fatalf("read %d events from 4, want %d", len(evs), len(sizes)-3)
	}
	r2.Close()
	noEarlyEviction(t, st)
}

func testAppendReadComplete(t *testing.T, e *env) {
	st := e.store(BigLimits())
	s := MustSession(t, st, "s1")
	str := MustStream(t, s, "1", `"b"`)
	if v := str.View(); v.Floor != 1 || v.Head != 0 || v.State != policy.Live || v.Kind != policy.RequestStream {
		t.Fatalf("fresh stream view %+v", v)
	}
	AppendN(t, str, 3, EvSize)
	seq, err := str.Append(context.Background(), buffer.Entry{Fields: Fields(Payload(4, EvSize)), Answers: []string{"1"}})
	if err != nil || seq != 4 {
		t.Fatalf("Append(answering 1) = %d, %v", seq, err)
	}
	MustAppend(t, str, Payload(5, EvSize))
	if _, err := str.Append(context.Background(), buffer.Entry{Fields: Fields(Payload(6, EvSize)), Answers: []string{`"b"`, "1"}}); err != nil {
		t.Fatal(err)
	}
	str.Complete()
	v := str.View()
	if v.State != policy.Complete || v.Head != 6 || len(v.Requests) != 2 ||
		v.Requests[0] != (policy.RequestView{ID: "1", AnsweredAt: 4}) || v.Requests[1] != (policy.RequestView{ID: `"b"`, AnsweredAt: 6}) {
		t.Fatalf("view after complete %+v (a later answer must not move an earlier one)", v)
	}
	if _, err := str.Append(context.Background(), buffer.Entry{Fields: Fields(Payload(7, EvSize))}); !errors.Is(err, buffer.ErrStreamEnded) {
		t.Fatalf("Append after Complete: %v, want ErrStreamEnded", err)
	}
	r, err := str.Attach(1)
	if err != nil {
		t.Fatal(err)
	}
	evs, err := ReadAll(t, r)
	if err != io.EOF {
		t.Fatalf("end of complete stream: %v, want io.EOF", err)
	}
	CheckSeqs(t, evs, 1, EvSize)
	if len(evs) != 6 {
		t.Fatalf("got %d events", len(evs))
	}
	// At the end, again: still EOF, nothing more.
	if b, err := r.Read(context.Background(), nil, 1<<20, time.Second); len(b.Data) != 0 || err != io.EOF {
		t.Fatalf("second read at end: %d slices, %v", len(b.Data), err)
	}
	r.Close()
	// Attaching at head+1 of a complete stream: EOF at once.
	r2, err := str.Attach(7)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r2.Read(context.Background(), nil, 1<<20, time.Second); err != io.EOF {
		t.Fatalf("read at head+1: %v", err)
	}
	r2.Close()
	if n := st.Counters().EventsEnqueued.Load(); n != 6 {
		t.Errorf("EventsEnqueued = %d, want 6", n)
	}
}

// The bytes a reader hands out are the event as the client gets it: the
// proxy's ID, then the upstream's fields, then the blank line; the epoch
// verifies under the store's key.
func testFraming(t *testing.T, e *env) {
	st := e.store(BigLimits())
	s := MustSession(t, st, "s.1*>") // IDs may hold what NATS subjects cannot
	str := MustStream(t, s)
	if _, err := str.Append(context.Background(), buffer.Entry{Fields: []byte("event: message\ndata: {\"x\":1}\n")}); err != nil {
		t.Fatal(err)
	}
	r, _ := str.Attach(1)
	defer r.Close()
	b, err := r.Read(context.Background(), nil, 1<<20, 10*time.Second)
	if err != nil || len(b.Data) != 1 {
		t.Fatalf("read: %v %+v", err, b)
	}
	want := "id: " + eventid.ID{Epoch: s.Epoch(), Stream: str.Num(), Seq: 1}.String() + "\nevent: message\ndata: {\"x\":1}\n\n"
	if string(b.Data[0]) != want {
		t.Fatalf("framed %q, want %q", b.Data[0], want)
	}
	if len(st.Key()) == 0 || !eventid.Minted(st.Key(), "s.1*>", s.Epoch()) {
		t.Fatal("the session's epoch does not verify under the store's key")
	}
}

func testReaderFollowsLive(t *testing.T, e *env) {
	_, str := e.stream(BigLimits(), 0)
	r, err := str.Attach(1) // before the first event (priming position)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	got := Async(func() []Event { evs, _ := ReadUntil(t, r, 3); return evs })
	time.Sleep(20 * time.Millisecond)
	AppendN(t, str, 3, EvSize)
	select {
	case evs := <-got:
		CheckSeqs(t, evs, 1, EvSize)
		if len(evs) != 3 {
			t.Fatalf("got %d events", len(evs))
		}
	case <-time.After(20 * time.Second):
		t.Fatal("reader did not follow live")
	}
	// A blocked read returns when its context ends, and after its idle time.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if _, err := r.Read(ctx, nil, 1<<20, time.Hour); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("read with expired context: %v", err)
	}
	if _, err := r.Read(context.Background(), nil, 1<<20, 20*time.Millisecond); !errors.Is(err, buffer.ErrIdle) {
		t.Fatalf("read past its idle time: %v", err)
	}
	if r.Next() != 4 {
		t.Fatalf("Next = %d, want 4", r.Next())
	}
}

// Read hands out at most about maxBytes, in runs of whole events, and at
// least one event however small maxBytes is.
func testReadBatches(t *testing.T, e *env) {
	_, str := e.stream(BigLimits(), 9)
	r, _ := str.Attach(1)
	defer r.Close()
	one := len("id: 12345678-1-1\n") + len("data: ") + EvSize + 2
	ctx := context.Background()
	evs, err := Read(ctx, r, 3*one)
	if err != nil || len(evs) < 1 || len(evs) > 3 {
		t.Fatalf("read of 3 events' bytes: %d, %v", len(evs), err)
	}
	CheckSeqs(t, evs, 1, EvSize)
	next := uint64(len(evs)) + 1
	evs, _ = Read(ctx, r, 1) // less than one event: still one
	if len(evs) != 1 {
		t.Fatalf("read with maxBytes 1: %d events", len(evs))
	}
	CheckSeqs(t, evs, next, EvSize)
	rest, err := ReadUntil(t, r, int(9-next))
	if err != nil {
		t.Fatal(err)
	}
	CheckSeqs(t, rest, next+1, EvSize)
}

func testFailedStream(t *testing.T, e *env) {
	st := e.store(BigLimits())
	str := MustStream(t, MustSession(t, st, "s1"), "1", "2")
	AppendN(t, str, 2, EvSize)
	str.Fail(policy.ReasonUpstreamFailed, buffer.Signal{Fields: Fields(Payload(3, EvSize)), Answers: []string{"1", "2"}})
	str.Fail(policy.ReasonStalled) // the first reason sticks
	r, _ := str.Attach(1)
	defer r.Close()
	evs, err := ReadAll(t, r)
	var fe *buffer.FailedError
	if !errors.As(err, &fe) || fe.Reason != policy.ReasonUpstreamFailed || fe.Error() == "" {
		t.Fatalf("end of failed stream: %v", err)
	}
	CheckSeqs(t, evs, 1, EvSize)
	if len(evs) != 3 {
		t.Fatalf("got %d events, want the 2 retained and the signal", len(evs))
	}
	if v := str.View(); v.State != policy.Failed || v.Requests[0].AnsweredAt != 3 || v.Requests[1].AnsweredAt != 3 {
		t.Fatalf("the signal did not answer the requests: %+v", v)
	}
	if n := st.Counters().FailedStreams()[policy.ReasonUpstreamFailed]; n != 1 {
		t.Errorf("FailedStreams[upstream_failed] = %d", n)
	}
	if n := st.Counters().FailedStreams()[policy.ReasonStalled]; n != 0 {
		t.Errorf("FailedStreams[stalled] = %d: a second Fail must do nothing", n)
	}
	if n := st.Counters().EventsEnqueued.Load(); n != 3 {
		t.Errorf("EventsEnqueued = %d, want 3 (signals count)", n)
	}
}

// An event that can never fit fails at once; the store fails nothing
// itself (the tap decides).
func testTooLarge(t *testing.T, e *env) {
	for _, bound := range []string{"stream", "session", "total"} {
		lim := BigLimits()
		switch bound {
		case "stream":
			lim.MaxStreamBytes = 4 << 10
		case "session":
			lim.MaxSessionBytes = 4 << 10
		case "total":
			lim.MaxTotalBytes = 4 << 10
		}
		st := e.store(lim)
		str := MustStream(t, MustSession(t, st, "s1"))
		_, err := str.Append(context.Background(), buffer.Entry{Fields: Fields(make([]byte, 8<<10))})
		var fe *buffer.FailedError
		if !errors.As(err, &fe) || fe.Reason != policy.ReasonTooLarge {
			t.Fatalf("%s: oversized Append: %v", bound, err)
		}
		if str.View().State != policy.Live {
			t.Fatalf("%s: the store fails nothing itself", bound)
		}
		AppendN(t, str, 1, EvSize) // smaller events go on
	}
}

// Many appenders on many streams while readers join at random positions,
// get taken over and rejoin: every reader sees exactly the contiguous
// events from where it attached.
func testConcurrent(t *testing.T, e *env) {
	st := e.store(BigLimits())
	const streams, events = 4, 120
	var wg sync.WaitGroup
	for i := 0; i < streams; i++ {
		s, ok := st.Session(fmt.Sprintf("s%d", i/2))
		if !ok {
			s = MustSession(t, st, fmt.Sprintf("s%d", i/2))
		}
		str := MustStream(t, s)
		name := fmt.Sprintf("stream%d", i)
		wg.Add(2)
		go func() {
			defer wg.Done()
			for seq := uint64(1); seq <= events; seq++ {
				got, err := str.Append(context.Background(), buffer.Entry{Fields: Fields([]byte(fmt.Sprintf("%s#%d", name, seq)))})
				if err != nil || got != seq {
					t.Errorf("%s: append %d = %d, %v", name, seq, got, err)
					return
				}
				if seq%16 == 0 {
					time.Sleep(time.Millisecond)
				}
			}
			str.Complete()
		}()
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(i), 7))
			for round := 0; ; round++ {
				head := str.View().Head
				from := uint64(1)
				if head > 0 {
					from = 1 + rng.Uint64N(head)
				}
				r, err := str.Attach(from)
				if err != nil {
					t.Errorf("%s: attach %d: %v", name, from, err)
					return
				}
				want := from
				n := 1 + rng.IntN(40)
				for got := 0; got < n; {
					evs, err := Read(context.Background(), r, 1<<10)
					for _, ev := range evs {
						if ev.Seq != want || string(ev.Data) != fmt.Sprintf("%s#%d", name, want) {
							t.Errorf("%s: reader from %d got seq %d %q, want %d", name, from, ev.Seq, ev.Data, want)
							r.Close()
							return
						}
						want++
						got++
					}
					if err == io.EOF {
						r.Close()
						if want != events+1 {
							t.Errorf("%s: EOF at %d", name, want)
						}
						return
					}
					if err != nil {
						t.Errorf("%s: read: %v", name, err)
						r.Close()
						return
					}
				}
				r.Delivered(want - 1)
				r.Close()
			}
		}()
	}
	wg.Wait()
}
