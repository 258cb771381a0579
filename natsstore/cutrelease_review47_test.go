package natsstore

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/internal/testnet"
)

// Review 47: a release during a cut longer than its 10 s bound. The
// renewals tried during the cut wait in the client's reconnect buffer, and
// so do the release's purges; the first renewal lands when NATS is back,
// every purge (expecting the revision before it) fails, and the release has
// given up: the lease stays a whole TTL with no holder (the next GET, or a
// takeover, refused on every replica). The writing lock does not help: the
// renewal's write left before the release, unacknowledged.
func TestReview47ReleaseDuringALongCutLeavesTheLease(t *testing.T) {
	t.Parallel()
	var fmu sync.Mutex
	var faults []string
	ns := testnet.NATS(t)
	relay := newFaultRelay(t, strings.TrimPrefix(ns.ClientURL(), "nats://"))
	const ttl = 30 * time.Second // rounds every 10 s
	a := openAt(t, []string{"nats://" + relay.addr()}, func(o *Options) {
		o.LeaseTTL = ttl
		o.OnError = func(op string, err error) {
			fmu.Lock()
			faults = append(faults, fmt.Sprintf("%s %s: %v", time.Now().Format("05.000"), op, err))
			fmu.Unlock()
		}
	})
	const key = "cut47.e.0"
	if ok, err := a.acquire(key, nil); !ok || err != nil {
		t.Fatal(ok, err)
	}
	relay.cut()
	cutAt := time.Now()
	time.Sleep(ttl/3 + 500*time.Millisecond) // a renewal round, buffered; the lease lapses 30 s after the cut
	released := make(chan struct{})
	go func() { a.release(key); close(released) }()
	select {
	case <-released:
	case <-time.After(30 * time.Second):
		t.Fatal("the release did not return")
	}
	t.Logf("released %v into the cut", time.Since(cutAt).Round(100*time.Millisecond))
	relay.mend()
	mendAt := time.Now()
	waitUntil(t, "A to reconnect", 10*time.Second, func() bool { return a.nc.IsConnected() })
	time.Sleep(time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if e, err := a.leases.kv.Get(ctx, key); err == nil {
		fmu.Lock()
		defer fmu.Unlock()
		t.Fatalf("FAULT: the lease released during the cut is in KV %v after NATS was back (revision %d, %s; held by A: %v); faults: %q",
			time.Since(mendAt).Round(100*time.Millisecond), e.Revision(), e.Value(), a.holds(key), faults)
	}
}
