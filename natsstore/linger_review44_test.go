package natsstore

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/buffer"
	"github.com/mcpresume/caddy-mcp-resume/internal/testnet"
)

// Review 44 (mended; older than the change it reviewed): A is cut off
// from NATS (its client reconnecting: what it publishes meanwhile waits in
// the reconnect buffer) long enough for the fence to stop its standalone
// producer; NATS is back before the lease's TTL ran out, and the
// producer's end releases the lease. The renewals sent during the cut
// reach NATS first and move the lease on; the release's purge, expecting
// the revision before them, failed on the wrong last sequence, dropped as
// harmless: the lease stayed a whole TTL with no one holding it, and the
// client's next GET was refused on every replica until it lapsed (a
// fenced call's takeover waited the same). A release that finds the key
// holding exactly its own value removes it at that revision.
func TestReview44ReleasedLeaseRenewedByABufferedRenewal(t *testing.T) {
	var fmu sync.Mutex
	var faults []string
	ns := testnet.NATS(t)
	link := newCutter(t, strings.TrimPrefix(ns.ClientURL(), "nats://"))
	const ttl = 6 * time.Second // fence at 4 s
	a := openAt(t, []string{"nats://" + link.addr()}, func(o *Options) {
		o.LeaseTTL = ttl
		o.TakeoverWait = time.Hour
		o.OnError = func(op string, err error) {
			fmu.Lock()
			faults = append(faults, fmt.Sprintf("%v %s: %v", time.Now().Format("05.000"), op, err))
			fmu.Unlock()
		}
	})
	sa, err := a.CreateSession("linger44", buffer.SessionMeta{})
	if err != nil {
		t.Fatal(err)
	}
	std := sa.Standalone()
	p := claim(t, std)
	key := std.(*stream).key
	// Right after a renewal: the fence fires ~4 s on, the lease lapses ~6 s on.
	a.held.mu.Lock()
	r0 := a.held.m[key].rev
	a.held.mu.Unlock()
	waitUntil(t, "a renewal", 5*time.Second, func() bool {
		a.held.mu.Lock()
		defer a.held.mu.Unlock()
		h := a.held.m[key]
		return h != nil && h.rev != r0
	})
	link.cut()
	cutAt := time.Now()
	waitUntil(t, "the fence", ttl, func() bool { return p.Context().Err() != nil })
	go p.Done() // waits for what it stored, then releases the lease
	time.Sleep(cutAt.Add(ttl * 3 / 4).Sub(time.Now()))
	link.mend() // 4.5 s into the cut: the lease has not lapsed
	waitUntil(t, "the release", 15*time.Second, func() bool { return !a.holds(key) })
	t.Logf("released %v into the cut", time.Since(cutAt).Round(100*time.Millisecond))
	time.Sleep(500 * time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if e, err := a.leases.kv.Get(ctx, key); err == nil {
		tctx, tcancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer tcancel()
		began := time.Now()
		p2, terr := std.TakeProducer(tctx)
		if p2 != nil {
			p2.Done()
		}
		fmu.Lock()
		defer fmu.Unlock()
		var hist []string
		if es, err := a.leases.kv.History(ctx, key); err == nil {
			for _, e := range es {
				hist = append(hist, fmt.Sprintf("%d:%v", e.Revision(), e.Operation()))
			}
		}
		t.Fatalf("FAULT: the standalone lease, released by A, %v after the cut began, is in KV at revision %d with A's value %s "+
			"after the release (held by A: %v); A's TakeProducer then: %v after %v; the key's history: %v; faults: %q",
			time.Since(cutAt).Round(100*time.Millisecond), e.Revision(), e.Value(), a.holds(key), terr, time.Since(began).Round(100*time.Millisecond), hist, faults)
	}
}
