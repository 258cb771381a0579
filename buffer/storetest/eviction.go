package storetest

import (
	"errors"
	"testing"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/buffer"
)

var evictionContracts = []contract{
	{"EvictAcked", testEvictAcked},
	{"EvictDeliveredAfterWindow", testEvictDeliveredAfterWindow},
	{"AttachedReaderIsNeverEvictedUnder", testAttachedReaderProtects},
	{"DeliveredByTakenOverReaderIgnored", testTakenOverDeliveryIgnored},
	{"AckBelowDeliveredResetsDelivery", testAckResetsDelivery},
}

const window = 600 * time.Millisecond

func windowLimits() buffer.Limits {
	lim := BigLimits()
	lim.ResumeWindow = window
	return lim
}

// Acknowledged events go at once, without waiting for a sweep.
func testEvictAcked(t *testing.T, e *env) {
	st, str := e.stream(BigLimits(), 5)
	ack(t, str, 3)
	if v := str.View(); v.Floor != 4 || v.Head != 5 {
		t.Fatalf("view after ack(3): %+v", v)
	}
	if _, err := str.Attach(3); !errors.Is(err, buffer.ErrBelowFloor) {
		t.Fatalf("Attach below floor: %v", err)
	}
	r, err := str.Attach(4)
	if err != nil {
		t.Fatal(err)
	}
	evs, _ := ReadUntil(t, r, 2)
	CheckSeqs(t, evs, 4, EvSize)
	r.Close()
	ack(t, str, 1)    // lower ack: nothing changes
	ack(t, str, 1000) // beyond head: clamps
	if v := str.View(); v.Floor != 6 || v.Head != 5 {
		t.Fatalf("view after ack(1000): %+v", v)
	}
	if b := st.Stats().RetainedBytes; b != 0 {
		t.Fatalf("RetainedBytes = %d", b)
	}
	if n := st.Counters().EventsEvicted.Load(); n != 5 {
		t.Fatalf("EventsEvicted = %d", n)
	}
	// Appends continue after the acknowledged position.
	if seq := MustAppend(t, str, Payload(6, EvSize)); seq != 6 {
		t.Fatalf("seq %d", seq)
	}
	if v := str.View(); v.Floor != 6 || v.Head != 6 {
		t.Fatalf("view %+v", v)
	}
	r2, _ := str.Attach(6)
	defer r2.Close()
	evs, _ = ReadUntil(t, r2, 1)
	CheckSeqs(t, evs, 6, EvSize)
}

// Delivered events go one window after their delivery; undelivered ones
// never do, however long.
func testEvictDeliveredAfterWindow(t *testing.T, e *env) {
	st, str := e.stream(windowLimits(), 5)
	r, _ := str.Attach(1)
	ReadUntil(t, r, 5)
	r.Delivered(3) // only 1..3 were written and flushed
	delivered := time.Now()
	r.Close()
	time.Sleep(window / 3)
	if v := str.View(); v.Floor != 1 && time.Since(delivered) < window {
		t.Fatalf("delivered events evicted inside the window: %+v", v)
	}
	WaitFor(t, "the window to release 1..3", func() bool { return floorOf(str) == 4 })
	if time.Since(delivered) < window {
		t.Fatalf("evicted after %s, inside the window", time.Since(delivered))
	}
	time.Sleep(2 * window) // undelivered events never go
	if v := str.View(); v.Floor != 4 || v.Head != 5 {
		t.Fatalf("undelivered evicted: %+v", v)
	}
	if b := st.Stats().RetainedBytes; b == 0 {
		t.Fatal("RetainedBytes = 0 with two events retained")
	}
	// Delivered later: they go one window after that delivery.
	r2, _ := str.Attach(4)
	Deliver(t, r2, 2)
	delivered = time.Now()
	r2.Close()
	WaitFor(t, "the second window", func() bool { return floorOf(str) == 6 })
	if time.Since(delivered) < window {
		t.Fatal("evicted early")
	}
	WaitFor(t, "the bytes to go", func() bool { return st.Stats().RetainedBytes == 0 })
	if n := st.Counters().EventsEvicted.Load(); n != 5 {
		t.Fatalf("EventsEvicted = %d", n)
	}
}

// An attached reader protects what it has yet to read, whatever the
// window says: a reader attached at 1 over events an earlier connection
// had been sent keeps them.
func testAttachedReaderProtects(t *testing.T, e *env) {
	_, str := e.stream(windowLimits(), 6)
	DeliverAndClose(t, str, 6)
	r, _ := str.Attach(1) // without an acknowledgement (what a repeated request did)
	defer r.Close()
	evs, err := Read(t.Context(), r, 1)
	if err != nil {
		t.Fatal(err)
	}
	CheckSeqs(t, evs, 1, EvSize)
	time.Sleep(3 * window)
	if f := floorOf(str); f > 2 {
		t.Fatalf("floor %d: only what the reader has passed may go", f)
	}
	evs, err = ReadUntil(t, r, 5)
	if err != nil {
		t.Fatal(err)
	}
	CheckSeqs(t, evs, 2, EvSize)
}

func testTakenOverDeliveryIgnored(t *testing.T, e *env) {
	_, str := e.stream(windowLimits(), 3)
	old, _ := str.Attach(1)
	ReadUntil(t, old, 3)
	r, err := str.Attach(1)
	if err != nil {
		t.Fatal(err)
	}
	old.Delivered(3) // too late: that connection no longer owns the stream
	old.Close()
	r.Close()
	time.Sleep(3 * window)
	if v := str.View(); v.Floor != 1 {
		t.Fatalf("evicted on a stale reader's delivery: %+v", v)
	}
}

// A client that resumes from 2 says 3..5 never arrived, whatever was
// written to its earlier connection: they are undelivered again.
func testAckResetsDelivery(t *testing.T, e *env) {
	_, str := e.stream(windowLimits(), 5)
	DeliverAndClose(t, str, 5)
	time.Sleep(window / 2)
	ack(t, str, 2)
	if v := str.View(); v.Floor != 3 {
		t.Fatalf("after ack(2): %+v", v)
	}
	time.Sleep(2 * window)
	if v := str.View(); v.Floor != 3 {
		t.Fatalf("3..5 evicted although the ack reset their delivery: %+v", v)
	}
	// Delivered again on a new connection: then they age out.
	r2, err := str.Attach(3)
	if err != nil {
		t.Fatal(err)
	}
	evs := Deliver(t, r2, 3)
	CheckSeqs(t, evs, 3, EvSize)
	r2.Close()
	WaitFor(t, "redelivered events to age out", func() bool { return floorOf(str) == 6 })
}
