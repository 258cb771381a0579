package natsstore

import (
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/internal/testnet"
)

// Review 48 (2742a6c): settleReleases runs at the start of every renewal
// round, in the round's goroutine, one unsure lease after another, each
// removal bounded by 10 s. Leases released during a cut are all unsure;
// a round that begins before the mend takes the whole list and settles it
// before it renews anything: 10 s per lease while NATS is out of reach,
// and a few round trips per lease once it is back. The kept leases wait
// for all of it: their fences fire though NATS answers. Mended: settled
// in the background, many at a time.
func TestReview48UnsureReleasesHoldTheRenewalRound(t *testing.T) {
	t.Parallel()
	var fmu sync.Mutex
	var faults []string
	ns := testnet.NATS(t)
	relay := newFaultRelay(t, strings.TrimPrefix(ns.ClientURL(), "nats://"))
	const ttl = 60 * time.Second // rounds every 20 s, fence at 40 s
	a := openAt(t, []string{"nats://" + relay.addr()}, func(o *Options) {
		o.LeaseTTL = ttl
		o.TakeoverWait = time.Hour
		o.OnError = func(op string, err error) {
			fmu.Lock()
			faults = append(faults, fmt.Sprintf("%s %s: %v", time.Now().Format("05.000"), op, err))
			fmu.Unlock()
		}
	})
	const keep = "keep48.e.0"
	if ok, err := a.acquire(keep, nil); !ok || err != nil {
		t.Fatal(ok, err)
	}
	var fired atomic.Int64
	a.fence(keep, func() { fired.Store(time.Now().UnixNano()) })
	const n = 60
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("settle48.e.%d", i)
		if ok, err := a.acquire(keys[i], nil); !ok || err != nil {
			t.Fatal(ok, err)
		}
	}
	renewedAt := func() time.Time {
		a.held.mu.Lock()
		defer a.held.mu.Unlock()
		if h := a.held.m[keep]; h != nil {
			return h.renewed
		}
		return time.Time{}
	}
	unsure := func() int {
		a.held.mu.Lock()
		defer a.held.mu.Unlock()
		return len(a.held.unsure)
	}
	r0 := renewedAt()
	waitUntil(t, "a renewal round", ttl/2, func() bool { return renewedAt().After(r0) })
	relay.cut()
	cutAt := time.Now()
	var wg sync.WaitGroup
	for _, k := range keys {
		wg.Add(1)
		go func() { defer wg.Done(); a.release(k) }()
	}
	wg.Wait()
	t.Logf("released %d leases into the cut in %v; unsure: %d", n, time.Since(cutAt).Round(100*time.Millisecond), unsure())
	// The next round takes the unsure list (settleReleases) while NATS is
	// still out of reach.
	waitUntil(t, "a round to take the unsure releases", ttl/2, func() bool { return unsure() < n })
	time.Sleep(time.Second)
	relay.delay.Store(int64(100 * time.Millisecond)) // NATS 200 ms away
	t.Cleanup(func() { relay.delay.Store(0) })
	relay.mend()
	mendAt := time.Now()
	t.Logf("mended %v after the cut", mendAt.Sub(cutAt).Round(100*time.Millisecond))
	waitUntil(t, "A to reconnect", 10*time.Second, func() bool { return a.nc.IsConnected() })
	// The first renewal acknowledged after the mend (its time is when it
	// was sent, maybe before the mend: what counts is when it shows).
	r1 := renewedAt()
	deadline := time.Now().Add(ttl)
	for renewedAt().Equal(r1) && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	took := time.Since(mendAt)
	if renewedAt().Equal(r1) {
		took = -1
	}
	f := fired.Load()
	fmu.Lock()
	fs := append([]string(nil), faults...)
	fmu.Unlock()
	if len(fs) > 8 {
		fs = fs[:8]
	}
	relay.delay.Store(0)
	if took < 0 || took > 5*time.Second || f != 0 {
		var fa string
		if f != 0 {
			fa = fmt.Sprintf("fired %v after the mend", time.Unix(0, f).Sub(mendAt).Round(100*time.Millisecond))
		}
		t.Fatalf("FAULT: the kept lease's first renewal acknowledged after NATS came back showed %v after the mend (-1: not within %v); its fence (%v) %s; "+
			"the round settled %d unsure releases first; faults: %q", took.Round(100*time.Millisecond), ttl, a.fenceAfter(), fa, n, fs)
	}
	t.Logf("held: kept lease renewed %v after the mend", took.Round(time.Millisecond))
}
