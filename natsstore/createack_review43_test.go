package natsstore

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/buffer"
	"github.com/mcpresume/caddy-mcp-resume/internal/testnet"
	"github.com/mcpresume/caddy-mcp-resume/policy"
)

// Review 43 (mended): a session record's create is stored but its
// acknowledgement lost (B reconnects at once). The first attempt waited
// out CreateSession's whole opTimeout (10 s), so the retry that would have
// found the key never ran: the creation failed although the session
// existed in KV, B dropped its interest in it and announced the admission
// undone. (Had the retry run, the ErrKeyExists branch would have removed
// the standalone record of the session it made itself.) A create's
// attempt is bounded now, and one that finds its own bytes is done.
func TestReview43SessionCreateWhoseAckIsLost(t *testing.T) {
	t.Parallel()
	ns := testnet.NATS(t)
	cut := newAckCutter(t, ns.Addr().String())
	b := openAt(t, []string{"nats://" + cut.addr()})
	const id = "lost-ack-create"
	sh := sessionToken(id)
	cut.arm("HPUB $KV." + b.names.sessions + "." + sh + " ")
	began := time.Now()
	_, err := b.CreateSession(id, buffer.SessionMeta{Origin: policy.Adopted})
	if !cut.fired.Load() {
		t.Fatal("the cutter did not fire")
	}
	t.Logf("create after %v: %v", time.Since(began).Round(100*time.Millisecond), err)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	rec, _, _ := b.sessions.read(ctx, sh)
	if rec == nil {
		// The cutter forwards the write and drops only its reply: the
		// record is stored, or the test did not make its case.
		t.Fatal("the session record was not stored: the cutter lost the write itself")
	}
	skey := streamKey(sh, rec.Epoch, policy.StandaloneNum)
	if _, gerr := b.streams.kv.Get(ctx, skey); gerr != nil {
		t.Errorf("session %s exists (epoch %s) but its standalone stream record does not: %v", id, rec.Epoch, gerr)
	}
	if err != nil && !errors.Is(err, buffer.ErrSessionExists) {
		t.Errorf("CreateSession failed (%v) but the session it made exists in KV", err)
	}
	time.Sleep(time.Second)
	if !b.interested(sh + ".x") {
		t.Errorf("B made session %s but keeps no interest in it", id)
	}
}
