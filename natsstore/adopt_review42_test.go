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

// Review 42: an adoption on A of a session B made a while ago (resume.go /
// tap.go: CreateSession, ErrSessionExists, then Session). A's CreateSession
// begins the interest with load=false (no tombstone) and keeps it on
// ErrKeyExists (review 41); the Session lookup that follows finds the
// interest begun and loads nothing. A then serves the session without B's
// stream records (and leases).
func TestReview42LostAdoptionLeavesAnUnloadedInterest(t *testing.T) {
	t.Parallel()
	urls := []string{testnet.NATS(t).ClientURL()}
	sweeper := openAt(t, urls)
	waitUntil(t, "the sweeper", 10*time.Second, func() bool { return sweeper.sweeps() })
	a, b := openAt(t, urls), openAt(t, urls)
	if a.sweeps() || b.sweeps() {
		t.Fatal("A or B sweeps")
	}
	const id = "adopted-elsewhere"
	sb, err := b.CreateSession(id, buffer.SessionMeta{Origin: policy.Adopted})
	if err != nil {
		t.Fatal(err)
	}
	str, err := sb.NewStream([]string{"r1"}, [32]byte{1})
	if err != nil {
		t.Fatal(err)
	}
	p := claim(t, str)
	defer p.Done()
	key := str.(*stream).key
	time.Sleep(200 * time.Millisecond)

	// The adoption on A loses, as resume.go's would.
	if _, err := a.CreateSession(id, buffer.SessionMeta{Origin: policy.Adopted}); !errors.Is(err, buffer.ErrSessionExists) {
		t.Fatalf("A's adoption: %v, want ErrSessionExists", err)
	}
	sa, ok := a.Session(id)
	if !ok {
		t.Fatal("A does not find the session")
	}
	if _, _, ok := a.streams.get(key); !ok {
		t.Errorf("A serves the session without B's live call %s in its mirror (interest never loaded)", key)
	}
	// A retried POST of the same request finds the call (else it is sent
	// upstream again).
	if _, ok := sa.StreamByKey([32]byte{1}); !ok {
		t.Errorf("A's StreamByKey does not find B's call of the same request")
	}
	if n := sa.(*session).liveRequests(); n != 1 {
		t.Errorf("A counts %d live request streams in the session, want 1", n)
	}
	// A deletes it (the client's DELETE lands on A): the tombstone must
	// name the call whose answer the client lacks, and the call's record
	// must go.
	if !a.Delete(id, policy.ReasonDeleted) {
		t.Fatal("A's delete failed")
	}
	tomb, ok := a.Tombstone(id)
	if !ok {
		t.Fatal("no tombstone")
	}
	if _, owed := tomb.Past.Streams[str.Num()]; !owed {
		t.Errorf("the tombstone lacks the live call %d the client is owed: %+v", str.Num(), tomb.Past.Streams)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := b.streams.kv.Get(ctx, key); err == nil {
		t.Errorf("the call's stream record %s outlives the session's delete", key)
	}
}
