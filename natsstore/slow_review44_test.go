package natsstore

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/buffer"
	"github.com/mcpresume/caddy-mcp-resume/internal/testnet"
)

// Review 44 (mended): a lease taken again within leaseMarkerTTL of its
// release (a standalone GET reconnecting, the commonest thing an SSE
// client does) finds the release's marker: createTTL fails, and
// KeyValue.Create makes three more round trips (an update at 0, a get, the
// update at the marker). On a NATS that answers in ~1.1 s, a create's
// first attempt bounded at 3 s cut the get, and nats.go's KeyValue.Create
// then reported the update's wrong last sequence as ErrKeyExists: the
// GET was refused although no one held the lease. A later attempt is
// given more time, and an ErrKeyExists from a cut attempt is checked.
func TestReview44StandaloneTakenAgainOnASlowNATS(t *testing.T) {
	t.Parallel()
	ns := testnet.NATS(t)
	slow := newFaultRelay(t, ns.Addr().String())
	a := openAt(t, []string{"nats://" + slow.addr()})
	sa, err := a.CreateSession("sess", buffer.SessionMeta{})
	if err != nil {
		t.Fatal(err)
	}
	str := sa.Standalone()
	p := claim(t, str)
	p.Done()
	key := str.(*stream).key
	waitUntil(t, "the standalone lease's release", 10*time.Second, func() bool { return !a.holds(key) })

	var faults []string
	var fmu sync.Mutex
	a.opts.OnError = func(op string, err error) {
		fmu.Lock()
		faults = append(faults, op+": "+err.Error())
		fmu.Unlock()
	}
	slow.delay.Store(int64(550 * time.Millisecond)) // a round trip takes ~1.1 s
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	began := time.Now()
	p2, err := str.TakeProducer(ctx)
	took := time.Since(began).Round(100 * time.Millisecond)
	if err != nil {
		slow.delay.Store(0)
		gctx, gcancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer gcancel()
		_, gerr := a.leases.kv.Get(gctx, key)
		fmu.Lock()
		defer fmu.Unlock()
		t.Fatalf("FAULT: the standalone stream's producer could not be taken again on a NATS answering in ~1.1 s: "+
			"TakeProducer failed after %v with %v (faults: %q); the lease in KV: %v; its create needs ~4 round trips, "+
			"its attempt is cut at createAttempt = %v, and KeyValue.Create reports the cut get as ErrKeyExists", took, err, faults, gerr, createAttempt)
	}
	t.Logf("TakeProducer took %v", took)
	p2.Done()
}
