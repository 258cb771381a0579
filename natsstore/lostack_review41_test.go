package natsstore

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/buffer"
	"github.com/mcpresume/caddy-mcp-resume/internal/testnet"
	"github.com/mcpresume/caddy-mcp-resume/policy"
)

// Review 41, attack 2: the renewals' first write of a call's lease is
// stored, but its acknowledgement is lost (a network blip at the wrong
// moment; A reconnects at once). writeHeld's create is tried again
// (createWithTTL, or the next round) and finds the key taken: by A's own
// write. writeHeld takes that for another replica's takeover and stops A's
// producer (lost), though no one else holds the stream; A's own lease,
// renewed by no one, lapses a LeaseTTL later, and the call (no upstream
// cursor) is failed by the sweeper. Nothing was wrong with it.
//
// (A written lease's renewal whose acknowledgement is lost ends the same
// way before baec54a: its next round finds the revision moved, reacquire
// finds the key taken. Before baec54a the first write was NewStream's: a
// lost acknowledgement there refused the stream before the call began.)
func TestReview41LostAckOfTheFirstLeaseWriteStopsAHealthyProducer(t *testing.T) {
	for _, v := range []string{"first write", "a renewal (pre-existing)"} {
		t.Run(v, func(t *testing.T) { lostLeaseAck(t, v != "first write") })
	}
}

func lostLeaseAck(t *testing.T, renewal bool) {
	t.Parallel()
	const ttl = 9 * time.Second // above writeHeld's 5s bound, as the default 15s is
	ns := testnet.NATS(t)
	mod := func(o *Options) { o.LeaseTTL = ttl; o.TakeoverWait = time.Hour }
	sweeper := openAt(t, []string{ns.ClientURL()}, mod)
	waitUntil(t, "the sweeper", 10*time.Second, func() bool { return sweeper.sweeps() })
	cut := newAckCutter(t, ns.Addr().String())
	a := openAt(t, []string{"nats://" + cut.addr()}, mod)
	sa, err := a.CreateSession("sess", buffer.SessionMeta{})
	if err != nil {
		t.Fatal(err)
	}
	str, err := sa.NewStream([]string{"1"}, [32]byte{1})
	if err != nil {
		t.Fatal(err)
	}
	key := str.(*stream).key
	if !renewal {
		cut.arm("HPUB $KV."+a.names.leases+"."+key+" ", "Nats-TTL")
	}
	pa := claim(t, str)
	if renewal {
		waitUntil(t, "the lease written", 2*ttl, func() bool { return leaseInKV(t, sweeper, key) && !leaseLater(a, key) })
		cut.arm("HPUB $KV."+a.names.leases+"."+key+" ", "Nats-TTL")
	}
	appendEvents(t, str, 1, 1) // no upstream cursor
	waitUntil(t, "the lease's write", 2*ttl, func() bool { return cut.fired.Load() })
	select {
	case <-pa.Context().Done():
	case <-time.After(3 * ttl):
		t.Log("A's producer lives on (held)")
		return
	}
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	owner := "none"
	if e, err := sweeper.leases.kv.Get(ctx, key); err == nil {
		var lr leaseRecord
		json.Unmarshal(e.Value(), &lr)
		owner = lr.Replica
	}
	stopped := time.Now()
	failed := false
	for time.Since(stopped) < 3*ttl && !failed {
		r, ok := kvStreamRec(sweeper, key)
		failed = ok && r.State == policy.Failed
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("A's producer was stopped as if another replica had taken the stream; the lease in KV is %s's (A is %s); "+
		"the call was then failed by the sweeper: %v", owner, a.opts.ReplicaID, failed)
}
