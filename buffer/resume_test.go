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
	sess, err := st.NewSession("s", SessionMeta{})
	if err != nil {
		t.Fatal(err)
	}
	str, _ := sess.NewStream(policy.RequestStream, []string{"1"})
	ctx := context.Background()
	for i := 0; i < 5; i++ {
		str.Append(ctx, []byte("data: x\n\n"), false)
	}
	rd, _ := str.Attach(1)
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
	evs, err := r.Read(ctx, make([]Event, 0, 8))
	if err != nil || len(evs) != 3 || evs[0].Seq != 3 {
		t.Fatalf("replay after the sweep: %v %+v", err, evs)
	}
	if v := str.View(); v.Floor != 3 {
		t.Fatalf("acked events 1..2 should be gone, floor %d", v.Floor)
	}
}

func TestResumeDoesNotAckOrAttachOnReject(t *testing.T) {
	st, _ := newStore(t, bigLimits())
	sess, _ := st.NewSession("s", SessionMeta{})
	str, _ := sess.NewStream(policy.RequestStream, []string{"1"})
	for i := 0; i < 3; i++ {
		str.Append(context.Background(), []byte("data: x\n\n"), false)
	}
	for _, tc := range []struct {
		d     policy.Resume
		floor uint64 // a rejected cursor acknowledges nothing; a gap's does
	}{
		{policy.Resume{Kind: policy.Reject, Status: 400}, 1},
		{policy.Resume{Kind: policy.Gap, From: 1, Then: policy.ThenError}, 4},
	} {
		_, r, err := str.Resume(3, func(policy.StreamView) policy.Resume { return tc.d })
		if r != nil || err != nil {
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
