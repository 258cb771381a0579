package natsstore

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/internal/testnet"
)

// Review 47 (f2ace91): renewHeld takes h.writing before it looks whether h
// is still held, so the renewal of a lease released after its round listed
// it waits for the whole release. A release whose purge was stored but
// whose acknowledgement was lost in a blip waits out its 10 s context; the
// round's goroutine for that lease waits with it, and the round (wg.Wait)
// with it: no other lease of the replica is renewed meanwhile. Their
// fences (2/3 TTL) fire: healthy producers stopped by one lost ack.
//
// 600 leases, NATS 200 ms away (RTT), so a round renews in waves of 128
// and the later waves are listed but not yet begun when a release comes.
// Right after a round's first wave is acknowledged, 60 leases not in it
// are released, and the link blips while their purges' acknowledgements
// are in transit.
func TestReview47ReleaseWithALostAckStallsEveryRenewal(t *testing.T) {
	var fmu sync.Mutex
	var faults []string
	ns := testnet.NATS(t)
	relay := newFaultRelay(t, strings.TrimPrefix(ns.ClientURL(), "nats://"))
	const ttl = DefaultLeaseTTL // 15 s: rounds every 5 s, fence at 10 s, renew timeout 2.5 s
	a := openAt(t, []string{"nats://" + relay.addr()}, func(o *Options) {
		o.LeaseTTL = ttl
		o.TakeoverWait = time.Hour
		o.OnError = func(op string, err error) {
			fmu.Lock()
			faults = append(faults, fmt.Sprintf("%s %s: %v", time.Now().Format("05.000"), op, err))
			fmu.Unlock()
		}
	})
	const n = 600
	keys := make([]string, n)
	var wg sync.WaitGroup
	sem := make(chan struct{}, 32)
	for i := range n {
		keys[i] = fmt.Sprintf("stall.e.%d", i)
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			if ok, err := a.acquire(keys[i], nil); !ok || err != nil {
				t.Errorf("acquire %s: %v %v", keys[i], ok, err)
			}
		}()
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	var fired atomic.Int32
	firedAt := make([]atomic.Int64, n)
	for i, k := range keys {
		a.fence(k, func() { fired.Add(1); firedAt[i].Store(time.Now().UnixNano()) })
	}
	relay.delay.Store(int64(100 * time.Millisecond))
	t.Cleanup(func() { relay.delay.Store(0) })

	renewedOf := func() map[string]time.Time {
		a.held.mu.Lock()
		defer a.held.mu.Unlock()
		m := make(map[string]time.Time, len(a.held.m))
		for k, h := range a.held.m {
			m[k] = h.renewed
		}
		return m
	}
	latest := func(m map[string]time.Time) time.Time {
		var l time.Time
		for _, r := range m {
			if r.After(l) {
				l = r
			}
		}
		return l
	}
	// A few healthy rounds first: nothing fires.
	time.Sleep(2 * ttl / 3)
	if f := fired.Load(); f > 0 {
		t.Fatalf("setup: %d fences fired on a healthy NATS 200 ms away", f)
	}
	// Wait for a round to begin: its first wave acknowledged.
	base := latest(renewedOf())
	var now map[string]time.Time
	waitUntil(t, "a round's first wave", 2*ttl, func() bool {
		now = renewedOf()
		return latest(now).Sub(base) > ttl/6
	})
	roundAt := latest(now)
	var release []string
	for _, k := range keys {
		if r, ok := now[k]; ok && roundAt.Sub(r) > ttl/6 && len(release) < 60 {
			release = append(release, k)
		}
	}
	began := time.Now()
	for _, k := range release {
		go a.release(k)
	}
	time.Sleep(150 * time.Millisecond) // the purges are stored, their acks in transit
	relay.blip()
	blipAt := time.Now()
	t.Logf("round seen %v after its first wave was sent; released %d leases, blip %v later",
		time.Since(roundAt).Round(time.Millisecond), len(release), blipAt.Sub(began).Round(time.Millisecond))
	released := make(map[string]bool)
	for _, k := range release {
		released[k] = true
	}
	// Sample the longest time any kept lease went without a renewal.
	var worst time.Duration
	deadline := time.Now().Add(ttl)
	for time.Now().Before(deadline) {
		m := renewedOf()
		for k, r := range m {
			if !released[k] {
				worst = max(worst, time.Since(r))
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	relay.delay.Store(0) // Close releases every lease, one after another
	f := fired.Load()
	fmu.Lock()
	fs := append([]string(nil), faults...)
	fmu.Unlock()
	if len(fs) > 12 {
		fs = fs[:12]
	}
	if f > 0 || worst > a.fenceAfter() {
		var first time.Time
		for i := range firedAt {
			if v := firedAt[i].Load(); v != 0 && (first.IsZero() || time.Unix(0, v).Before(first)) {
				first = time.Unix(0, v)
			}
		}
		t.Fatalf("FAULT: %d of %d kept leases' fences fired (first %v after the blip); the longest any kept lease went unrenewed: %v "+
			"(fence %v, TTL %v); one release with a lost ack stalled the round; faults: %q",
			f, n-len(release), first.Sub(blipAt).Round(time.Millisecond), worst.Round(time.Millisecond), a.fenceAfter(), ttl, fs)
	}
	t.Logf("held: no fence fired; longest unrenewed %v; faults %q", worst.Round(time.Millisecond), fs)
	_ = context.Background
}

// Review 47 (f2ace91), the mechanism alone: the renewal of a lease that
// its round listed before the lease was released waits for the whole
// release, here one whose purge's acknowledgement was lost in a blip (its
// 10 s bound). The round's wg.Wait waits with it.
func TestReview47RenewalOfAReleasedLeaseWaitsOutTheRelease(t *testing.T) {
	t.Parallel()
	ns := testnet.NATS(t)
	relay := newFaultRelay(t, strings.TrimPrefix(ns.ClientURL(), "nats://"))
	a := openAt(t, []string{"nats://" + relay.addr()}, func(o *Options) { o.LeaseTTL = time.Minute })
	const key = "wait47.e.0"
	if ok, err := a.acquire(key, nil); !ok || err != nil {
		t.Fatal(ok, err)
	}
	a.held.mu.Lock()
	h := a.held.m[key] // as a renewal round lists it
	a.held.mu.Unlock()
	relay.delay.Store(int64(100 * time.Millisecond))
	go a.release(key)
	time.Sleep(150 * time.Millisecond) // the purge stored, its ack in transit
	relay.blip()
	relay.delay.Store(0)
	time.Sleep(50 * time.Millisecond)
	waitUntil(t, "A to reconnect", 5*time.Second, func() bool { return a.nc.IsConnected() })
	began := time.Now()
	a.renewHeld(h) // the round's goroutine for h, once NATS is back
	took := time.Since(began)
	if took > 3*time.Second {
		t.Fatalf("FAULT: the renewal of a lease released before it began took %v: it waited out the release (its round, and every other lease's renewal, with it)", took.Round(100*time.Millisecond))
	}
	t.Logf("renewHeld of the released lease took %v", took.Round(time.Millisecond))
}
