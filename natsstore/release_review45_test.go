package natsstore

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Review 45, attack on 52362ba's release: A's lease lapsed (removed here
// by hand, as an expiry would) and B took it, with its own value. A's
// release then finds the revision moved; it must not remove B's lease
// (holds compares A's exact bytes). Also: B's lease renewed several
// times by B (its revision moves) is still not A's.
func TestReview45ReleaseLeavesAnotherReplicasLease(t *testing.T) {
	t.Parallel()
	a, b := replicas(t, func(o *Options) { o.LeaseTTL = 30 * time.Second })
	_, str, p := callOn(t, a)
	key := str.(*stream).key
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := a.leases.kv.Purge(ctx, key); err != nil {
		t.Fatal(err)
	}
	if ok, err := b.acquire(key, nil); !ok || err != nil {
		t.Fatalf("B's acquire after A's lease went: %v %v", ok, err)
	}
	b.held.mu.Lock()
	bh := struct {
		val []byte
		rev uint64
	}{b.held.m[key].val, b.held.m[key].rev}
	b.held.mu.Unlock()
	for range 2 { // B renews: its revision moves past anything A saw
		rev, err := b.renew(b.names.leases, key, bh.val, bh.rev, 30*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		b.renewed(b.held.m[key], rev, time.Now())
		bh.rev = rev
	}
	a.release(key)
	p.Done()
	e, err := b.leases.kv.Get(ctx, key)
	if err != nil || string(e.Value()) != string(bh.val) {
		t.Fatalf("FAULT: A's release removed or changed B's lease: %v %v", e, err)
	}
}

// Review 45, attack on 52362ba's createBy: a create attempt cut short
// (its context's deadline) that reports ErrKeyExists for a key another
// replica really holds must answer ErrKeyExists (not success, not a loop
// of attempts).
func TestReview45CutCreateOfAKeyHeldElsewhere(t *testing.T) {
	t.Parallel()
	a, b := replicas(t, func(o *Options) { o.LeaseTTL = 30 * time.Second })
	const key = "review45.cut.create"
	if ok, err := b.acquire(key, nil); !ok || err != nil {
		t.Fatalf("B's acquire: %v %v", ok, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	attempts := 0
	began := time.Now()
	_, err := a.leases.createBy(ctx, key, &leaseRecord{Replica: a.opts.ReplicaID, Since: time.Now().UnixNano()},
		func(actx context.Context, v []byte) (uint64, error) {
			attempts++
			rev, err := a.leases.kv.Create(actx, key, v)
			<-actx.Done() // its answer comes only once the attempt is cut
			return rev, err
		})
	if !errors.Is(err, jetstream.ErrKeyExists) || attempts != 1 {
		t.Fatalf("FAULT: a cut create of a key B holds: %v after %d attempts in %v", err, attempts, time.Since(began).Round(time.Millisecond))
	}
}
