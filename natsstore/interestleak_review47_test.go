package natsstore

import (
	"bytes"
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/buffer"
	"github.com/mcpresume/caddy-mcp-resume/internal/testnet"
	"github.com/mcpresume/caddy-mcp-resume/policy"
)

// Review 47 (5d5ee2f): the lost creation drops its interest only when the
// look-up says errNotFound; a look-up that fails (NATS out of reach: its
// context, shared with the creation's writes, ran out) keeps the interest.
// If the session was deleted meanwhile on another replica (its
// notification lost with the link), the interest is never ended: the
// reload after the reconnection finds the record gone but the mirror never
// held it, so no deletion is applied and sessionChanged never runs.
//
// A is 400 ms from NATS (one way); the link is cut right after A's
// session create was answered ErrKeyExists, and B deletes the session
// during the cut. NATS is back once A's CreateSession returned.
func TestReview47LostCreationWithAFailedLookupKeepsAnInterestForGood(t *testing.T) {
	t.Parallel()
	ns := testnet.NATS(t)
	relay := newFaultRelay(t, strings.TrimPrefix(ns.ClientURL(), "nats://"))
	a := openAt(t, []string{"nats://" + relay.addr()}, func(o *Options) { o.SweepInterval = time.Hour })
	b := openAt(t, []string{ns.ClientURL()})
	const id = "leak47"
	sh := sessionToken(id)
	_, err := b.CreateSession(id, buffer.SessionMeta{Origin: policy.Adopted})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// The link is cut once A got the answer to its session create: the
	// wrong last sequence (10071) of its write at revision 0, then of
	// KeyValue.Create's, then the answer to its read of the key.
	cutc := make(chan time.Time, 1)
	var once sync.Once
	var wrongLast atomic.Int32
	trig := func(b []byte) {
		if wrongLast.Load() >= 2 && bytes.Contains(b, []byte("_INBOX")) {
			// The read's answer (the key holds B's session)
			once.Do(func() { relay.cut(); cutc <- time.Now() })
		}
		if bytes.Contains(b, []byte("10071")) {
			wrongLast.Add(1)
		}
	}
	relay.trigger.Store(&trig)
	done := make(chan error, 1)
	go func() {
		_, err := a.CreateSession(id, buffer.SessionMeta{Origin: policy.Adopted})
		done <- err
	}()
	var cutAt time.Time
	select {
	case cutAt = <-cutc:
	case err := <-done:
		t.Fatalf("A's CreateSession returned before any wrong last sequence: %v", err)
	}
	if !b.Delete(id, policy.ReasonDeleted) {
		t.Fatal("B could not delete the session")
	}
	var cerr error
	select {
	case cerr = <-done:
	case <-time.After(40 * time.Second):
		t.Fatal("A's CreateSession did not return within 40 s of the cut")
	}
	t.Logf("A's CreateSession: %v, %v after the cut", cerr, time.Since(cutAt).Round(100*time.Millisecond))
	relay.delay.Store(0)
	relay.mend()
	if cerr != buffer.ErrSessionExists {
		t.Skipf("inconclusive: the cut did not fall after the create's answer (%v)", cerr)
	}
	waitUntil(t, "A to reconnect", 10*time.Second, func() bool { return a.nc.IsConnected() })
	time.Sleep(15 * time.Second) // reloads (interestLoop every LeaseTTL/6), resyncs
	_, _, lerr := b.sessions.lookupErr(ctx, sh)
	if lerr == nil {
		t.Fatal("the session exists")
	}
	if a.interested(sh + ".x") {
		t.Fatalf("FAULT: A keeps the interest in session %s, deleted (%v) on B during the cut, %v after NATS was back: nothing will end it", id, lerr, 15*time.Second)
	}
}
