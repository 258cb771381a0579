package resume

import (
	"context"
	"fmt"
	"runtime/metrics"
	"testing"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/buffer"
	"github.com/mcpresume/caddy-mcp-resume/policy"
)

// producingTap is a tap of call i in sess, producing its stream.
func producingTap(t *testing.T, h *Engine, sess buffer.Session, i int) *upstreamTap {
	t.Helper()
	stream, err := sess.NewStream([]string{fmt.Sprint(i)}, [32]byte{byte(i), byte(i >> 8)})
	if err != nil {
		t.Fatal(err)
	}
	p, err := stream.TakeProducer(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	tap := h.newTap(post(fmt.Sprint(i)), nil, sess, "2025-06-18")
	tap.produce(stream, p)
	return tap
}

// goroutinesCreated is how many goroutines the process has started.
func goroutinesCreated() uint64 {
	s := []metrics.Sample{{Name: "/sched/goroutines-created:goroutines"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}

// A tap's stop follows its role while it holds it (the role lost, the tap
// stops reading), and no longer once it gives the role up: Done ended the
// role's context, which ran the tap's stop in a goroutine of its own at the
// end of every call, and cancelled the upstream request of a tap that
// abandoned its stream and was still passing the response through.
func TestATapsStopFollowsItsRoleUntilItGivesItUp(t *testing.T) {
	h := testHandler(t)
	sess := newSession(t, h, "2025-06-18")
	open := func(i int) *upstreamTap { return producingTap(t, h, sess, i) }

	tap := open(0)
	tap.prod.Stop() // the role must stop: the tap stops reading
	select {
	case <-tap.ctx.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("the tap did not stop with its role")
	}
	tap.close()

	const calls = 200
	started := goroutinesCreated()
	for i := 1; i <= calls; i++ {
		tap := open(i)
		ctx := tap.ctx
		tap.abandon(nil) // the role given up; the tap goes on passing the response through
		time.Sleep(time.Millisecond)
		if ctx.Err() != nil {
			t.Fatalf("call %d: giving the role up stopped the tap", i)
		}
		tap.close()
	}
	// A few for whatever else the process does meanwhile; one per call
	// before.
	if n := goroutinesCreated() - started; n > calls/4 {
		t.Fatalf("%d goroutines started for %d taps' ends", n, calls)
	}
}

// Review 55: a tap that gives a role up and is given another follows the
// new one (its loss stops the tap), and one that abandoned its stream still
// stops with its session's end.
func TestATapFollowsItsSecondRoleAndItsSession(t *testing.T) {
	h := testHandler(t)
	sess := newSession(t, h, "2025-06-18")
	tap := producingTap(t, h, sess, 1)
	p1 := tap.prod
	tap.giveUpRole()
	time.Sleep(10 * time.Millisecond)
	if tap.ctx.Err() != nil {
		t.Fatal("giving the first role up stopped the tap")
	}
	p2, err := tap.stream.TakeProducer(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	tap.produce(tap.stream, p2)
	p1.Stop() // the old role, given up: nothing to the tap
	time.Sleep(10 * time.Millisecond)
	if tap.ctx.Err() != nil {
		t.Fatal("the first role's stop, after it was given up, stopped the tap")
	}
	p2.Stop()
	select {
	case <-tap.ctx.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("the tap did not stop with its second role")
	}
	tap.close()

	// Abandoned: the session's end still stops the response passed through.
	tap2 := producingTap(t, h, sess, 2)
	tap2.abandon(nil)
	if tap2.ctx.Err() != nil {
		t.Fatal("abandoning stopped the tap")
	}
	h.rt.store.Delete(sess.ID(), policy.ReasonDeleted)
	select {
	case <-tap2.ctx.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("an abandoned tap did not stop with its session's end")
	}
	tap2.close()
}
