package natsstore

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/mcpresume/caddy-mcp-resume/buffer"
	"github.com/mcpresume/caddy-mcp-resume/internal/testnet"
	"github.com/mcpresume/caddy-mcp-resume/policy"
)

// Review 42: B's connection drops as its session record's create is sent
// (the write never reaches NATS). CreateSession fails (the request waits
// out opTimeout); were its non-ErrKeyExists failure to call neither undo
// nor dropInterest (review 41's first mend), B would keep, for as long as it lived, an
// interest in a session that was never made.
func TestReview42CreateLostWithItsConnectionLeaksTheInterest(t *testing.T) {
	t.Parallel()
	ns := testnet.NATS(t)
	cut := newAckCutter(t, ns.Addr().String())
	cut.dropWrite = true
	b := openAt(t, []string{"nats://" + cut.addr()})
	const id = "lost-create"
	sh := sessionToken(id)
	cut.arm("HPUB $KV." + b.names.sessions + "." + sh + " ")
	_, err := b.CreateSession(id, buffer.SessionMeta{Origin: policy.Adopted})
	if !cut.fired.Load() {
		t.Fatal("the cutter did not fire")
	}
	if err == nil {
		t.Fatal("the create succeeded")
	}
	t.Logf("create: %v", err)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := b.sessions.kv.Get(ctx, sh); !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Fatalf("the session record: %v (want none)", err)
	}
	time.Sleep(time.Second) // reconnected, interests reloaded
	b.interest.mu.Lock()
	_, kept := b.interest.subs[sh]
	b.interest.mu.Unlock()
	if kept {
		t.Errorf("B keeps an interest in session %s, which was never made", sh)
	}
}
