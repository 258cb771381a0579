package resume

import (
	"context"
	"testing"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/policy"
)

// Review 55: a tap that gives a role up and is given another follows the
// new one (its loss stops the tap), and one that abandoned its stream still
// stops with its session's end.
func TestReview55ATapFollowsItsSecondRoleAndItsSession(t *testing.T) {
	h := testHandler(t)
	sess := newSession(t, h, "2025-06-18")
	stream, err := sess.NewStream([]string{"1"}, [32]byte{1})
	if err != nil {
		t.Fatal(err)
	}
	p1, err := stream.TakeProducer(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	tap := h.newTap(post("1"), nil, sess, "2025-06-18")
	tap.produce(stream, p1)
	tap.giveUpRole()
	time.Sleep(10 * time.Millisecond)
	if tap.ctx.Err() != nil {
		t.Fatal("giving the first role up stopped the tap")
	}
	p2, err := stream.TakeProducer(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	tap.produce(stream, p2)
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
	s2, err := sess.NewStream([]string{"2"}, [32]byte{2})
	if err != nil {
		t.Fatal(err)
	}
	p3, err := s2.TakeProducer(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	tap2 := h.newTap(post("2"), nil, sess, "2025-06-18")
	tap2.produce(s2, p3)
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
