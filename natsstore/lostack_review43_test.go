package natsstore

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/buffer"
	"github.com/mcpresume/caddy-mcp-resume/internal/testnet"
)

// Reviews 41 and 43 (mended): a lease's renewal is stored but its
// acknowledgement lost (a blip; the replica reconnects at once). The next
// round found the revision moved, and its reacquire the key taken, by this
// replica's own write: taken for another replica's, it stopped a healthy
// producer (review 41). Recognised as its own (stillOwn), it still came at
// the moment the fence fired, which stops a call with an upstream cursor
// (one a takeover can resume: the usual SSE server) two rounds after the
// last acknowledged renewal: the call was taken over though its lease
// never lapsed (review 43). A failed renewal is tried again soon now, and
// one found to be its own is renewed at once, moving the fence.
func TestALostRenewalAckStopsNoProducer(t *testing.T) {
	for _, cursor := range []bool{false, true} {
		t.Run(fmt.Sprintf("upstream cursor %v", cursor), func(t *testing.T) {
			t.Parallel()
			// Renewals every 7 s, the fence 14 s after the last
			// acknowledged one.
			a, cut := cutLeasesTTL(t, 21*time.Second)
			_, str, p := callOn(t, a)
			defer p.Done()
			key := str.(*stream).key
			next := uint64(1)
			if cursor {
				// One event carrying the upstream's own event ID: the call
				// has an upstream cursor stored, so it is fenced.
				if _, err := str.Append(context.Background(), buffer.Entry{Fields: []byte("id: u1\ndata: one\n"), Upstream: "u1"}); err != nil {
					t.Fatal(err)
				}
				waitUntil(t, "the cursor stored", 5*time.Second, str.(*stream).storedCursor)
				next = 2
			}
			cut.arm("HPUB $KV."+a.names.leases+"."+key+" ", "Nats-TTL")
			waitUntil(t, "a renewal", 2*a.opts.LeaseTTL, cut.fired.Load)
			fired := time.Now()
			for deadline := fired.Add(a.opts.LeaseTTL); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
				if p.Context().Err() != nil {
					t.Fatalf("the producer was stopped %v after its lease renewal's acknowledgement was lost "+
						"(fenced: %v, lease still held here: %v); the lease never lapsed and no other replica took the call",
						time.Since(fired).Round(100*time.Millisecond), str.(*stream).fenced.Load(), a.holds(key))
				}
			}
			a.held.mu.Lock()
			h := a.held.m[key]
			renewed := h != nil && h.renewed.After(fired)
			a.held.mu.Unlock()
			if !renewed {
				t.Fatal("the lease was not renewed after the lost acknowledgement")
			}
			appendEvents(t, str, next, next+1)
		})
	}
}

// Review 43 (mended): the standalone (GET) stream's lease, which is never
// taken again once it lapsed, had no recognition of its own write: the
// round after a renewal whose acknowledgement was lost took the key for
// another replica's and stopped the GET's producer, and the client's next
// GET (a new value) was refused with ErrProducing until the old one's TTL
// ran out, with no replica producing the stream meanwhile.
func TestReview43LostRenewalAckStopsTheStandaloneProducer(t *testing.T) {
	t.Parallel()
	a, cut := cutLeasesTTL(t, 21*time.Second)
	sa, err := a.CreateSession("sess", buffer.SessionMeta{})
	if err != nil {
		t.Fatal(err)
	}
	sstr := sa.Standalone()
	key := sstr.(*stream).key
	p := claim(t, sstr)
	cut.arm("HPUB $KV."+a.names.leases+"."+key+" ", "Nats-TTL")
	waitUntil(t, "a renewal", 2*a.opts.LeaseTTL, cut.fired.Load)
	fired := time.Now()
	deadline := fired.Add(a.opts.LeaseTTL)
	var stopped time.Duration
	for time.Now().Before(deadline) {
		if p.Context().Err() != nil {
			stopped = time.Since(fired)
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if stopped == 0 {
		p.Done()
		return // kept: no fault
	}
	p.Done()
	// The client opens its GET again at once: is the stream's lease free?
	var refused []string
	var took buffer.Producer
	retake := time.Now()
	for time.Since(retake) < a.opts.LeaseTTL+2*time.Second {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		took, err = sstr.TakeProducer(ctx)
		cancel()
		if err == nil {
			break
		}
		refused = append(refused, fmt.Sprint(err))
		time.Sleep(250 * time.Millisecond)
	}
	if took != nil {
		took.Done()
	}
	t.Errorf("the standalone stream's producer was stopped %v after a lease renewal's acknowledgement was lost "+
		"(no other replica holds it); a new GET was refused %d times over %v (first: %v)",
		stopped.Round(100*time.Millisecond), len(refused), time.Since(retake).Round(100*time.Millisecond), first(refused))
}

func first(s []string) string {
	if len(s) == 0 {
		return "none"
	}
	return s[0]
}

// cutLeasesTTL opens a replica with lease TTL ttl whose NATS connection
// passes an ackCutter, with a sweeper beside it on a direct connection.
func cutLeasesTTL(t *testing.T, ttl time.Duration) (*Store, *ackCutter) {
	ns := testnet.NATS(t)
	mod := func(o *Options) { o.LeaseTTL = ttl; o.TakeoverWait = time.Hour }
	sweeper := openAt(t, []string{ns.ClientURL()}, mod)
	waitUntil(t, "the sweeper", 10*time.Second, sweeper.sweeps)
	cut := newAckCutter(t, ns.Addr().String())
	return openAt(t, []string{"nats://" + cut.addr()}, mod), cut
}

// Review 43 (mended): a new call's lease create whose acknowledgement is
// lost waited for it with acquire's whole 10 s context, so the retry that
// would have found the key holding its own value never ran: the call was
// refused after 10 s, its lease left in KV until its TTL. A create's
// attempt is bounded now (mirror.createBy), and one that finds its own
// bytes stored is done.
func TestReview43NewCallWhoseLeaseAckIsLost(t *testing.T) {
	t.Parallel()
	a, cut := cutLeasesTTL(t, 21*time.Second) // the lease outlives the wait
	sa, err := a.CreateSession("sess", buffer.SessionMeta{})
	if err != nil {
		t.Fatal(err)
	}
	s := sa.(*session)
	key := streamKey(s.sh, s.epoch, 1) // the session's first call
	cut.arm("HPUB $KV."+a.names.leases+"."+key+" ", "Nats-TTL")
	began := time.Now()
	str, err := sa.NewStream([]string{"1"}, [32]byte{1})
	took := time.Since(began).Round(100 * time.Millisecond)
	if !cut.fired.Load() {
		t.Fatal("the cutter did not fire")
	}
	if err != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, gerr := a.leases.kv.Get(ctx, key)
		t.Fatalf("NewStream failed after %v: %v; the lease it wrote is in KV: %v (held here: %v)",
			took, err, gerr == nil, a.holds(key))
	}
	t.Logf("NewStream took %v", took)
	p := claim(t, str)
	defer p.Done()
	appendEvents(t, str, 1, 1)
}
