package natsstore

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/mcpresume/caddy-mcp-resume/buffer"
	"github.com/mcpresume/caddy-mcp-resume/internal/testnet"
)

// Review 41 (mended): a lease's renewal is stored but its acknowledgement
// is lost (a network blip at the wrong moment; the replica reconnects at
// once). The next round finds the revision moved, and its reacquire the
// key taken: by this replica's own write. Taken for another replica's, it
// stopped a healthy producer, though no one else held the stream. A key
// holding exactly this replica's value is its own (ownWrite, also where a
// lease's create is tried again).
func TestReview41ALeaseRenewalWhoseAckIsLostIsTakenAsOwn(t *testing.T) {
	t.Parallel()
	a, cut := cutLeasesTTL(t, 6*time.Second)
	sa, err := a.CreateSession("sess", buffer.SessionMeta{})
	if err != nil {
		t.Fatal(err)
	}
	str, err := sa.NewStream([]string{"1"}, [32]byte{1})
	if err != nil {
		t.Fatal(err)
	}
	key := str.(*stream).key
	p := claim(t, str)
	defer p.Done()
	cut.arm("HPUB $KV."+a.names.leases+"."+key+" ", "Nats-TTL")
	waitUntil(t, "a renewal", 2*a.opts.LeaseTTL, cut.fired.Load)
	fired := time.Now()
	// Renewed again after the lost acknowledgement: the producer kept
	// its lease.
	waitUntil(t, "the lease renewed after the lost acknowledgement", 3*a.opts.LeaseTTL, func() bool {
		if p.Context().Err() != nil {
			t.Fatal("the producer was stopped as if another replica had taken its stream")
		}
		a.held.mu.Lock()
		defer a.held.mu.Unlock()
		h := a.held.m[key]
		return h != nil && h.renewed.After(fired)
	})
	appendEvents(t, str, 1, 2)
}

// A lease whose stream's record went without it (a takeover racing its
// session's end, review 42; a session deleted where the lease was not
// seen) is not renewed for good: the renewals let it go.
func TestALeaseOutlivingItsStreamIsLetGo(t *testing.T) {
	t.Parallel()
	a := openAt(t, []string{testnet.NATS(t).ClientURL()}, func(o *Options) { o.LeaseTTL = 1500 * time.Millisecond })
	sa, err := a.CreateSession("sess", buffer.SessionMeta{})
	if err != nil {
		t.Fatal(err)
	}
	str, err := sa.NewStream([]string{"1"}, [32]byte{1})
	if err != nil {
		t.Fatal(err)
	}
	claim(t, str)
	key := str.(*stream).key
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	if err := a.streams.remove(ctx, key, 0); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the lease to go", 5*time.Second, func() bool {
		_, err := a.leases.kv.Get(ctx, key)
		return !a.holds(key) && errors.Is(err, jetstream.ErrKeyNotFound)
	})
}
