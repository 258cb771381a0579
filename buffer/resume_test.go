package buffer

import (
	"context"
	"testing"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/policy"
)

// Resume decides, acknowledges and attaches in one step: events delivered to
// a connection that died are not lost to the sweeper between the decision
// and the replay, because the acknowledgement un-delivers them first.
func TestResumeIsAtomicWithEviction(t *testing.T) {
	st, clk := newStore(t, bigLimits())
	str := mustStream(t, mustSession(t, st, "s"))
	appendN(t, str, 5, evSize)
	rd, _ := str.Attach(1)
	readUntil(t, rd, 5)
	rd.Delivered(5) // written to a connection that then died
	rd.Close()
	clk.Advance(59 * time.Second) // just inside the window

	var seen policy.StreamView
	d, r, err := str.Resume(2, func(v policy.StreamView) policy.Resume {
		seen = v
		clk.Advance(2 * time.Second) // the window passes while deciding
		return policy.Resume{Kind: policy.Replay, From: 3}
	})
	if err != nil || r == nil || d.Kind != policy.Replay {
		t.Fatalf("Resume: %v %v %+v", r, err, d)
	}
	defer r.Close()
	if seen.Floor != 1 || seen.Head != 5 {
		t.Fatalf("decide saw %+v", seen)
	}
	st.Sweep() // events 3..5 were un-delivered by the ack: they must stay
	evs, err := read(context.Background(), r, 1<<20)
	if err != nil || len(evs) != 3 || evs[0].Seq != 3 {
		t.Fatalf("replay after the sweep: %v %+v", err, evs)
	}
	if v := str.View(); v.Floor != 3 {
		t.Fatalf("acked events 1..2 should be gone, floor %d", v.Floor)
	}
}

// A repeated request re-reads its stream from the start: Resume(0, ...)
// un-delivers everything, so nothing the reader still needs can go, however
// long the replay to a slow client takes.
func TestResumeFromZeroProtectsAReplay(t *testing.T) {
	st, clk := newStore(t, bigLimits())
	str := mustStream(t, mustSession(t, st, "s"))
	appendN(t, str, 8, evSize)
	first, _ := str.Attach(1)
	readUntil(t, first, 8)
	first.Delivered(8)
	first.Close()
	_, r, err := str.Resume(0, func(v policy.StreamView) policy.Resume {
		return policy.Resume{Kind: policy.Replay, From: 1}
	})
	if err != nil {
		t.Fatal(err)
	}
	for seq := uint64(1); seq <= 8; seq++ {
		clk.Advance(time.Hour)
		st.Sweep()
		evs, err := read(context.Background(), r, 1)
		if err != nil {
			t.Fatalf("seq %d: %v", seq, err)
		}
		checkSeqs(t, evs, seq, evSize)
		r.Delivered(seq)
	}
}

func TestResumeDoesNotAckOrAttachOnReject(t *testing.T) {
	st, _ := newStore(t, bigLimits())
	sess := mustSession(t, st, "s")
	str := mustStream(t, sess)
	appendN(t, str, 3, evSize)
	for _, tc := range []struct {
		d      policy.Resume
		floor  uint64 // a rejected cursor acknowledges nothing; a gap's or an end's does
		reader bool
	}{
		{policy.Resume{Kind: policy.Reject, Status: 400}, 1, false},
		{policy.Resume{Kind: policy.PassThrough}, 1, false},
		{policy.Resume{Kind: policy.Gap, From: 1, Then: policy.ThenHold}, 2, false},
		{policy.Resume{Kind: policy.Gap, From: 1, Then: policy.ThenEnd}, 3, false},
		{policy.Resume{Kind: policy.Ended}, 4, false},
	} {
		_, r, err := str.Resume(tc.floor-1, func(policy.StreamView) policy.Resume { return tc.d })
		if (r != nil) != tc.reader || err != nil {
			t.Fatalf("%v: got a reader %v / %v", tc.d.Kind, r, err)
		}
		if v := str.View(); v.Floor != tc.floor {
			t.Fatalf("%v: floor %d, want %d", tc.d.Kind, v.Floor, tc.floor)
		}
	}
	if info := sess.Info(); info.Connected != 0 {
		t.Fatalf("connected %d", info.Connected)
	}
}
