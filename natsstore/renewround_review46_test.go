package natsstore

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"strings"

	"github.com/mcpresume/caddy-mcp-resume/internal/testnet"

	"github.com/mcpresume/caddy-mcp-resume/buffer"
)

// Review 46 (93416d4: a round renews 16 leases at a time). 48 calls on A,
// renewals every 500 ms: while rounds run, 16 calls end (their leases are
// released while renewals of them may be in flight), 16 leases are
// overwritten in KV by another writer (each renewal meets it: lost() runs,
// from the round's goroutines, at once for several), and 16 live on. Then
// A closes while a round may be under way. Under -race: no data race; the
// healthy producers are never stopped (no fence fires, no lease_renew
// fault), each stolen one is stopped, and no ended call's lease outlives
// it by more than a TTL.
func TestReview46ConcurrentRenewalsWithReleasesAndLosses(t *testing.T) {
	var fmu sync.Mutex
	var faults []string
	mod := func(o *Options) {
		o.LeaseTTL = 1500 * time.Millisecond
		o.TakeoverWait = time.Hour
		o.OnError = func(op string, err error) {
			fmu.Lock()
			faults = append(faults, op+": "+err.Error())
			fmu.Unlock()
		}
	}
	a, b := replicas(t, mod)
	sa, err := a.CreateSession("sess", buffer.SessionMeta{})
	if err != nil {
		t.Fatal(err)
	}
	const n = 48
	strs := make([]buffer.Stream, n)
	ps := make([]buffer.Producer, n)
	for i := range n {
		if strs[i], err = sa.NewStream([]string{fmt.Sprint(i)}, [32]byte{byte(i)}); err != nil {
			t.Fatal(err)
		}
		ps[i] = claim(t, strs[i])
		produceWithCursor(t, strs[i], 1, 1)
	}
	time.Sleep(700 * time.Millisecond) // a round or so with every lease held

	var wg sync.WaitGroup
	for i := range 16 { // ended: released as renewals run
		wg.Add(1)
		go func() {
			defer wg.Done()
			time.Sleep(time.Duration(i*37) * time.Millisecond)
			strs[i].Complete()
			ps[i].Done()
		}()
	}
	for i := 16; i < 32; i++ { // taken by another writer
		wg.Add(1)
		go func() {
			defer wg.Done()
			time.Sleep(time.Duration((i-16)*29) * time.Millisecond)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if _, err := b.leases.kv.Put(ctx, strs[i].(*stream).key, []byte(`{"replica":"elsewhere","since":1}`)); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	time.Sleep(2 * a.opts.LeaseTTL)

	for i := 16; i < 32; i++ {
		if ps[i].Context().Err() == nil {
			t.Errorf("FAULT: call %d's lease was taken by another writer %v ago, and its producer on A runs on", i, 2*a.opts.LeaseTTL)
		}
	}
	for i := 32; i < n; i++ {
		if ps[i].Context().Err() != nil {
			t.Errorf("FAULT: call %d's producer was stopped though nothing touched its lease (fenced %v, held %v)",
				i, strs[i].(*stream).fenced.Load(), a.holds(strs[i].(*stream).key))
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for i := range 16 {
		key := strs[i].(*stream).key
		if e, err := b.leases.kv.Get(ctx, key); err == nil {
			t.Errorf("FAULT: call %d ended %v ago, and its lease is still in KV (revision %d: %s)", i, 2*a.opts.LeaseTTL, e.Revision(), e.Value())
		}
	}
	fmu.Lock()
	for _, f := range faults {
		if len(f) >= 11 && f[:11] == "lease_renew" {
			t.Errorf("FAULT: a renewal failed with NATS healthy: %s", f)
		}
	}
	fmu.Unlock()
	// Closing while rounds run: every goroutine of the round is waited for.
	closed := make(chan struct{})
	go func() { a.Close(); close(closed) }()
	select {
	case <-closed:
	case <-time.After(20 * time.Second):
		t.Fatal("FAULT: A's Close did not return within 20 s")
	}
	for i := 32; i < n; i++ {
		ps[i].Done()
	}
}

// Review 46 (mended: 128 at a time now, the limit moved, not gone): a
// round renewed 16 leases at a time, in waves, so it
// lasts ceil(leases/16) round trips, and a lease's renewals come that far
// apart once a round outlasts its period. Its fence stops the producer at
// 2/3 of the TTL without one: on a NATS 200 ms away (RTT), a TTL of 1.5 s
// (the default 15 s at 2 s away, or at 600 ms with 3x the leases: 400
// calls per replica) fences every call past 80 on a healthy but distant
// NATS; healthy producers are stopped and their calls taken for dead.
// The control: 16 calls (one wave) on the same NATS are never fenced.
func TestReview46RenewalRoundsOutlastTheFenceWithManyLeases(t *testing.T) {
	for _, n := range []int{16, 128} {
		t.Run(fmt.Sprint(n, " calls"), func(t *testing.T) { renewalsOnADistantNATS(t, n) })
	}
}

func renewalsOnADistantNATS(t *testing.T, n int) {
	ns := testnet.NATS(t)
	relay := newFaultRelay(t, strings.TrimPrefix(ns.ClientURL(), "nats://"))
	mod := func(o *Options) {
		o.LeaseTTL = 1500 * time.Millisecond
		o.TakeoverWait = time.Hour
	}
	a := openAt(t, []string{"nats://" + relay.addr()}, mod)
	strs := make([]buffer.Stream, n)
	ps := make([]buffer.Producer, n)
	var sa buffer.Session
	var err error
	for i := range n {
		if i%32 == 0 { // at most 100 streams a session
			if sa, err = a.CreateSession(fmt.Sprint("sess", i), buffer.SessionMeta{}); err != nil {
				t.Fatal(err)
			}
		}
		if strs[i], err = sa.NewStream([]string{fmt.Sprint(i)}, [32]byte{byte(i)}); err != nil {
			t.Fatal(err)
		}
		ps[i] = claim(t, strs[i])
		defer ps[i].Done()
		if _, err := strs[i].Append(context.Background(), buffer.Entry{Fields: []byte("data: one\n"), Upstream: "u1"}); err != nil {
			t.Fatal(err)
		}
	}
	for i := range n {
		strs[i].(*stream).currentWriter().waitStored(10 * time.Second)
	}
	relay.delay.Store(int64(100 * time.Millisecond)) // RTT 200 ms: slow, alive, nothing lost
	began := time.Now()
	time.Sleep(3 * time.Second)
	stopped := 0
	for i := range n {
		if ps[i].Context().Err() != nil {
			stopped++
		}
	}
	if stopped > 0 {
		t.Fatalf("FAULT: %d of %d healthy producers stopped by their fences within %v of NATS answering in 200 ms "+
			"(renewals 16 at a time: a round takes %d round trips = %v, the fence fires %v after the last renewal)",
			stopped, n, time.Since(began).Round(100*time.Millisecond), (n+15)/16, time.Duration((n+15)/16)*200*time.Millisecond, a.fenceAfter())
	}
}
