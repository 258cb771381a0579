package buffer_test

import (
	"context"
	"testing"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/buffer"
	"github.com/mcpresume/caddy-mcp-resume/buffer/storetest"
)

// The sweeper looks at a stream only when something in it may go
// (sweepAt): these are the ways a stream it set aside comes due again.

// sweepStream is a store on a fake clock with a one-minute window and a
// stream holding two events no client has seen, swept once (so the
// sweeper has set it aside: nothing there can go by time alone).
func sweepStream(t *testing.T) (*buffer.MemoryStore, *fakeClock, buffer.Stream) {
	t.Helper()
	lim := storetest.BigLimits()
	lim.ResumeWindow = time.Minute
	st, clk := newStore(t, buffer.Options{Limits: lim})
	s, err := st.CreateSession("s", buffer.SessionMeta{})
	if err != nil {
		t.Fatal(err)
	}
	str, err := s.NewStream([]string{"1"}, [32]byte{1})
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 2; i++ {
		if _, err := str.Append(context.Background(), buffer.Entry{Fields: storetest.Fields([]byte("x"))}); err != nil {
			t.Fatal(err)
		}
	}
	st.Sweep()
	return st, clk, str
}

// readAll reads what r has and reports it delivered.
func readAll(t *testing.T, r buffer.Reader) {
	t.Helper()
	b, err := r.Read(context.Background(), nil, 1<<20, time.Second)
	if err != nil || b.Last != 2 {
		t.Fatalf("read %d..%d, %v", b.First, b.Last, err)
	}
	r.Delivered(b.Last)
}

func floorOf(str buffer.Stream) uint64 { return str.View().Floor }

// A detached stream's client comes back, is sent everything and leaves:
// its events go a window after their delivery, not never.
func TestSweepEvictsAStreamWhoseClientCameBackAndLeft(t *testing.T) {
	st, clk, str := sweepStream(t)
	r, err := str.Attach(1)
	if err != nil {
		t.Fatal(err)
	}
	readAll(t, r)
	clk.Advance(30 * time.Second)
	st.Sweep()
	r.Close()
	st.Sweep()
	if f := floorOf(str); f != 1 {
		t.Fatalf("floor %d half a window after delivery, want 1", f)
	}
	clk.Advance(31 * time.Second)
	st.Sweep()
	if f := floorOf(str); f != 3 {
		t.Fatalf("floor %d a window after delivery, want 3: the sweeper never came back", f)
	}
}

// A client still attached when the window passes, swept before it read
// anything: its delivered events go.
func TestSweepEvictsDeliveredEventsOfAnAttachedClient(t *testing.T) {
	st, clk, str := sweepStream(t)
	r, err := str.Attach(1)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	st.Sweep()
	readAll(t, r)
	clk.Advance(61 * time.Second)
	st.Sweep()
	if f := floorOf(str); f != 3 {
		t.Fatalf("floor %d a window after delivery, want 3", f)
	}
}

// A shorter window applies to events whose eviction was judged by the
// longer one.
func TestSweepAppliesAShorterWindowAtOnce(t *testing.T) {
	st, clk, str := sweepStream(t)
	r, err := str.Attach(1)
	if err != nil {
		t.Fatal(err)
	}
	readAll(t, r)
	r.Close()
	lim := st.Limits()
	lim.ResumeWindow = time.Hour
	st.SetLimits(lim)
	st.Sweep() // judged by the hour
	lim.ResumeWindow = time.Minute
	st.SetLimits(lim)
	clk.Advance(61 * time.Second)
	st.Sweep()
	if f := floorOf(str); f != 3 {
		t.Fatalf("floor %d a minute after delivery with a minute's window, want 3", f)
	}
}
