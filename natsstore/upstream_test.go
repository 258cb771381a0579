package natsstore

import (
	"context"
	"testing"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/buffer"
)

// waitStored waits until what this replica appended to str is stored (or
// can never be), and returns the last seq stored.
func waitStored(str buffer.Stream) uint64 {
	s := str.(*stream)
	w := s.currentWriter()
	if w == nil {
		return s.View().Head
	}
	w.waitStored(s.sess.st.endTimeout())
	head, _ := w.storedHead()
	return head
}

// The batches of a stream carry the upstream cursor of their entries: a
// replica that crashes leaves the next producer the exact cursor of what
// it stored. A note the producer made after its last event, with no batch
// open to carry it, is recorded as it lets go, and wins over the last
// batch's cursor (it is later still); a crash before that loses only the
// note, never the cursor of what is stored.
func TestUpstreamCursorSurvivesACrash(t *testing.T) {
	t.Parallel()
	a, b := replicas(t, func(o *Options) { o.LeaseTTL = time.Second })
	sa, err := a.CreateSession("s1", buffer.SessionMeta{Version: "2025-11-25"})
	if err != nil {
		t.Fatal(err)
	}
	str := sa.Standalone()
	claim(t, str)
	for i, id := range []string{"u1", "", "u3"} {
		if _, err := str.Append(context.Background(), buffer.Entry{Fields: []byte("data: x\n"), Upstream: id}); err != nil {
			t.Fatalf("append %d: %v", i, err)
		}
	}
	if got := waitStored(str); got != 3 {
		t.Fatalf("stored up to %d", got)
	}
	str.NoteUpstream("u4") // nothing open carries it, and the producer crashes before it lets go
	crash(a)
	sb := sessionOn(t, b, "s1")
	g := sb.Standalone()
	if got := g.UpstreamCursor(); got != "u3" {
		t.Fatalf("cursor after the producer crashed = %q, want u3", got)
	}
	var p buffer.Producer
	waitUntil(t, "the crashed producer's lease to go", 10*time.Second, func() bool { p = tryClaim(g); return p != nil })
	g.NoteUpstream("u5") // a priming event after u3
	p.Done()
	if got := g.UpstreamCursor(); got != "u5" {
		t.Fatalf("cursor noted at head 3 = %q, want u5", got)
	}
}

// A producer that lets go leaves the cursor of what it stored to the next
// producer on another replica, and back: entries and notes alike.
func TestUpstreamCursorOnEveryReplica(t *testing.T) {
	t.Parallel()
	a, b := replicas(t)
	sa, err := a.CreateSession("s1", buffer.SessionMeta{Version: "2025-11-25"})
	if err != nil {
		t.Fatal(err)
	}
	ga, gb := sa.Standalone(), sessionOn(t, b, "s1").Standalone()
	produce := func(g buffer.Stream, up string, note string) {
		t.Helper()
		var p buffer.Producer
		waitUntil(t, "the producer lease", 10*time.Second, func() bool { p = tryClaim(g); return p != nil })
		if _, err := g.Append(context.Background(), buffer.Entry{Fields: []byte("data: x\n"), Upstream: up}); err != nil {
			t.Fatal(err)
		}
		if note != "" {
			g.NoteUpstream(note)
		}
		p.Done()
	}
	produce(ga, "a1", "")
	if got := gb.UpstreamCursor(); got != "a1" {
		t.Fatalf("B sees %q, want a1", got)
	}
	produce(gb, "b2", "b2-close")
	if got := ga.UpstreamCursor(); got != "b2-close" {
		t.Fatalf("A sees %q, want b2-close", got)
	}
	produce(ga, "", "")
	if got := gb.UpstreamCursor(); got != "b2-close" {
		t.Fatalf("after an event without an upstream ID, B sees %q, want b2-close", got)
	}
}
