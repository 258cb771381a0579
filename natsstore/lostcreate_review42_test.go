package natsstore

import (
	"context"
	"testing"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/buffer"
	"github.com/mcpresume/caddy-mcp-resume/internal/testnet"
	"github.com/mcpresume/caddy-mcp-resume/policy"
)

// Review 42: B's connection drops as its session record's create is sent
// (the write never reaches NATS). The create then failed once it had
// waited out opTimeout, and were that failure to call neither undo nor
// dropInterest (review 41's first mend), B would have kept an interest in
// a session never made. A create's attempt is bounded now (review 43):
// tried again once B is back, the session is made, whole, and B's
// interest in it is the session's.
func TestReview42CreateLostWithItsConnectionIsTriedAgain(t *testing.T) {
	t.Parallel()
	ns := testnet.NATS(t)
	cut := newAckCutter(t, ns.Addr().String())
	cut.dropWrite = true
	b := openAt(t, []string{"nats://" + cut.addr()})
	const id = "lost-create"
	sh := sessionToken(id)
	cut.arm("HPUB $KV." + b.names.sessions + "." + sh + " ")
	s, err := b.CreateSession(id, buffer.SessionMeta{Origin: policy.Adopted})
	if !cut.fired.Load() {
		t.Fatal("the cutter did not fire")
	}
	if err != nil {
		t.Fatalf("the create, tried again once back: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if e, err := b.sessions.kv.Get(ctx, sh); err != nil {
		t.Fatalf("the session record: %v", err)
	} else if rec, _, _ := b.sessions.read(ctx, sh); rec == nil || rec.Epoch != s.Epoch() {
		t.Fatalf("the session record at %d is not the one made", e.Revision())
	}
	if !b.interested(sh + ".x") {
		t.Errorf("B made session %s but keeps no interest in it", id)
	}
}
