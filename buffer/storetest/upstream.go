package storetest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/buffer"
)

// The upstream cursor: the upstream's own event ID as of the last event the
// store holds, the one a successor producer resumes the upstream from.
var upstreamContracts = []contract{
	{"UpstreamCursorMovesWithStoredEntries", testUpstreamCursorMoves},
	{"UpstreamCursorIgnoresWhatIsNotStored", testUpstreamCursorUnstored},
	{"UpstreamCursorOfRequestStreams", testUpstreamCursorRequest},
}

// entry is an event of payload seq carrying the upstream ID up.
func entry(seq uint64, up string) buffer.Entry {
	return buffer.Entry{Fields: Fields(Payload(seq, EvSize)), Upstream: up}
}

// cursorOn is the cursor of the standalone stream of session id as a
// fresh lookup of the session finds it.
func cursorOn(t testing.TB, st buffer.Store, id string) string {
	t.Helper()
	s, ok := st.Session(id)
	if !ok {
		t.Fatalf("session %q not found", id)
	}
	return s.Standalone().UpstreamCursor()
}

// Entries move the cursor to their upstream ID (one without leaves it), a
// note moves it with no event (an empty one changes nothing), and what a
// producer left is what the next producer finds, on any handle.
func testUpstreamCursorMoves(t *testing.T, e *env) {
	st := e.store(BigLimits())
	s := MustSession(t, st, "s1")
	g := s.Standalone()
	if c := g.UpstreamCursor(); c != "" {
		t.Fatalf("a fresh stream has the upstream cursor %q", c)
	}
	p := MustProduce(t, g)
	for i, up := range []string{"u1", "", "u3", ""} {
		if _, err := g.Append(context.Background(), entry(uint64(i+1), up)); err != nil {
			t.Fatalf("append %d: %v", i+1, err)
		}
	}
	p.Done()
	if c := cursorOn(t, st, "s1"); c != "u3" {
		t.Fatalf("cursor after u1, -, u3, - = %q, want u3", c)
	}

	// The next producer: a note (a priming event's ID), an empty one.
	p = MustProduce(t, g)
	g.NoteUpstream("p4")
	g.NoteUpstream("")
	p.Done()
	if c := cursorOn(t, st, "s1"); c != "p4" {
		t.Fatalf("cursor after the note = %q, want p4", c)
	}

	// A note rides with the events appended before it; an entry after it
	// without an ID keeps it; one with an ID moves past it.
	p = MustProduce(t, g)
	if _, err := g.Append(context.Background(), entry(5, "u5")); err != nil {
		t.Fatal(err)
	}
	g.NoteUpstream("p6")
	if _, err := g.Append(context.Background(), entry(6, "")); err != nil {
		t.Fatal(err)
	}
	p.Done()
	if c := cursorOn(t, st, "s1"); c != "p6" {
		t.Fatalf("cursor after u5, note p6, - = %q, want p6", c)
	}
	p = MustProduce(t, g)
	g.NoteUpstream("p7")
	if _, err := g.Append(context.Background(), entry(7, "u8")); err != nil {
		t.Fatal(err)
	}
	p.Done()
	if c := cursorOn(t, st, "s1"); c != "u8" {
		t.Fatalf("cursor after note p7, u8 = %q, want u8", c)
	}
	if h := g.View().Head; h != 7 {
		t.Fatalf("head %d: notes are no events", h)
	}
}

// An entry the store did not take (its append blocked on a full log and
// gave up) leaves the cursor at the last one it holds: the successor asks
// the upstream for it again.
func testUpstreamCursorUnstored(t *testing.T, e *env) {
	lim := BigLimits()
	lim.MaxStreamBytes = 4 << 10
	st := e.store(lim)
	g := MustSession(t, st, "s1").Standalone()
	p := MustProduce(t, g)
	if _, err := g.Append(context.Background(), entry(1, "u1")); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	_, blocked := fillCtx(t, ctx, g, bigSize, 100)
	cancel()
	if r := AwaitAppend(t, blocked); !errors.Is(r.Err, context.Canceled) {
		t.Fatalf("the blocked append: %v", r.Err)
	}
	late, stop := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer stop()
	lost := buffer.Entry{Fields: Fields(Payload(99, bigSize)), Upstream: "lost"}
	if _, err := g.Append(late, lost); err == nil {
		t.Fatal("an append to the full log went in")
	}
	p.Done()
	if c := cursorOn(t, st, "s1"); c != "u1" {
		t.Fatalf("cursor = %q, want u1: the entry the store refused moved it", c)
	}
}

// A request stream's cursor follows its entries as the standalone
// stream's does.
func testUpstreamCursorRequest(t *testing.T, e *env) {
	st := e.store(BigLimits())
	s := MustSession(t, st, "s1")
	str := MustStream(t, s)
	p := MustProduce(t, str)
	if _, err := str.Append(context.Background(), entry(1, "r1")); err != nil {
		t.Fatal(err)
	}
	str.NoteUpstream("r2")
	str.Complete()
	p.Done()
	got, ok := s.Stream(str.Num())
	if !ok {
		t.Fatal("the stream is gone")
	}
	if c := got.UpstreamCursor(); c != "r2" {
		t.Fatalf("request stream cursor = %q, want r2", c)
	}
}
