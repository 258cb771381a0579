package natsstore

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/buffer"
	"github.com/mcpresume/caddy-mcp-resume/internal/testnet"
	"github.com/mcpresume/caddy-mcp-resume/policy"
)

// prodIntervals are the production sweep and scan intervals (Options'
// defaults, which the Caddy module does not override: SweepInterval
// 500ms, ScanInterval 10 x that = 5s), where openStore's tests run with
// 20ms / 200ms.
func prodIntervals(ttl time.Duration) func(*Options) {
	return func(o *Options) {
		o.SweepInterval = 500 * time.Millisecond
		o.ScanInterval = 0 // default: 5s
		o.LeaseTTL = ttl
		o.TakeoverWait = time.Hour
	}
}

// Review 40, attack 1: the sweeper's wait for an unwritten lease is
// pruned between its scans. With production intervals (a scan every 5s)
// and a lease_ttl of 2s (the Caddyfile allows >= 1s), unwrittenLeases.prune
// (cutoff 2 x LeaseTTL = 4s) forgets the sweeper's first sight of the
// stream before its next scan, which then starts the wait afresh: a
// producer that died before its renewals' first round is never judged,
// and its stream (no cursor here) is never failed. The same stream whose
// lease was written is failed a few seconds after the crash (control).
// With the default lease_ttl (15s) the same happens in any zone whose scan
// takes >= 1.5s (the next scan then comes 30s = 2 x LeaseTTL later).
func TestReview40SweeperNeverJudgesAnUnwrittenOrphan(t *testing.T) {
	for _, v := range []string{"unwritten", "unwritten, same config", "written(control)"} {
		written, same := v == "written(control)", v == "unwritten, same config"
		t.Run(v, func(t *testing.T) {
			t.Parallel()
			const ttl = 2 * time.Second
			urls := []string{testnet.NATS(t).ClientURL()}
			b := openAt(t, urls, prodIntervals(ttl))
			waitUntil(t, "B to sweep", 10*time.Second, func() bool { return b.sweeps() })
			// A's renewals would write the lease at their first round; it
			// dies before that round (LeaseTTL 1h: the round never comes).
			a := openAt(t, urls, func(o *Options) { o.LeaseTTL = time.Hour; o.SweepInterval = 500 * time.Millisecond })
			if written || same {
				a = openAt(t, urls, prodIntervals(ttl)) // its renewals write the lease within LeaseTTL/3
			}
			sa, _ := a.CreateSession("sess", buffer.SessionMeta{})
			if same {
				// A's renewals' round just came (another call's lease was
				// written): A dies well before the next one.
				d, err := sa.NewStream([]string{"0"}, [32]byte{2})
				if err != nil {
					t.Fatal(err)
				}
				claim(t, d)
				dk := d.(*stream).key
				waitUntil(t, "a round of A's renewals", 5*time.Second, func() bool { return !leaseLater(a, dk) })
			}
			str, err := sa.NewStream([]string{"1"}, [32]byte{1})
			if err != nil {
				t.Fatal(err)
			}
			claim(t, str)
			appendEvents(t, str, 1, 2) // no upstream cursor: the sweeper fails it at LeaseTTL
			str.(*stream).currentWriter().waitStored(10 * time.Second)
			key := str.(*stream).key
			if written {
				waitUntil(t, "A's lease to be written", 5*time.Second, func() bool { return leaseInKV(t, a, key) && !leaseLater(a, key) })
			}
			crash(a)
			died := time.Now()
			if !written && leaseInKV(t, b, key) {
				t.Skip("A's renewals wrote the lease before it died (timing)")
			}
			deadline := died.Add(30 * time.Second) // 15 x LeaseTTL, 6 scans
			for time.Now().Before(deadline) {
				if r, ok := kvStreamRec(b, key); ok && r.State == policy.Failed {
					t.Logf("failed %v after the producer died", time.Since(died).Round(time.Millisecond))
					return
				}
				time.Sleep(100 * time.Millisecond)
			}
			b.unwritten.mu.Lock()
			seen := b.unwritten.m[key]
			b.unwritten.mu.Unlock()
			var first time.Time
			if seen != nil {
				first = seen[0]
			}
			t.Fatalf("the dead producer's stream is still live %v after it died (LeaseTTL %v, scans every 5s); "+
				"the sweeper's wait began %v ago", time.Since(died).Round(time.Second), ttl, time.Since(first).Round(time.Millisecond))
		})
	}
}

// Review 40, attack 1b: the same, seen by a client: it reads the stream on
// C, a replica that does not sweep. C's reader is told the producer is gone
// (C's own wait is kept alive by the reader's heartbeats), but the stream
// has no upstream cursor, so no takeover can come: the engine leaves it to
// the sweeper (resume/follow.go takeOver), whose end never comes. Silence.
func TestReview40ClientOfAnUnwrittenOrphanWaitsInSilence(t *testing.T) {
	t.Parallel()
	const ttl = 2 * time.Second
	urls := []string{testnet.NATS(t).ClientURL()}
	b := openAt(t, urls, prodIntervals(ttl))
	waitUntil(t, "B to sweep", 10*time.Second, func() bool { return b.sweeps() })
	c := openAt(t, urls, prodIntervals(ttl))
	a := openAt(t, urls, func(o *Options) { o.LeaseTTL = time.Hour; o.SweepInterval = 500 * time.Millisecond })
	_, str, _ := callOn(t, a)
	appendEvents(t, str, 1, 2)
	str.(*stream).currentWriter().waitStored(10 * time.Second)
	_, _, rc := caughtUpOn(t, c, 2)
	crash(a)
	died := time.Now()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	told := false
	for {
		_, err := rc.Read(ctx, nil, 1<<20, 5*time.Second) // keepalive 5s
		switch {
		case errors.Is(err, buffer.ErrProducerGone):
			if !told {
				t.Logf("C's reader told the producer is gone %v after it died", time.Since(died).Round(time.Millisecond))
			}
			told = true
			continue
		case errors.Is(err, buffer.ErrIdle):
			continue
		case err == nil:
			continue
		}
		var fe *buffer.FailedError
		if errors.As(err, &fe) {
			t.Logf("the client got the failure %v after the producer died", time.Since(died).Round(time.Millisecond))
			return
		}
		if ctx.Err() != nil {
			t.Fatalf("the client waited %v in silence for a stream whose producer died (told gone: %v; LeaseTTL %v)",
				time.Since(died).Round(time.Second), told, ttl)
		}
		t.Fatalf("C's reader: %v", err)
	}
}

// Review 40, attack 2: a session that ends while its call's lease is still
// unwritten. clearIncarnation releases the incarnation's leases it finds in
// the leases mirror (st.leases.keysOf), where an unwritten lease is not; the
// producer's end (Fail/Complete find the stream ended, producerDone finds
// no record) releases nothing either. The renewals' next round then writes
// the lease of a stream that no longer exists, and renews it for as long as
// the replica lives. Before baec54a, the lease was in the mirror and went
// with the session.
func TestReview40SessionEndedBeforeItsCallsLeaseIsWrittenLeaksTheLease(t *testing.T) {
	// (Deleted on another replica, the lease leaks before baec54a too: not
	// this change's.)
	for _, where := range []string{"deleted on the producer's replica"} {
		t.Run(where, func(t *testing.T) {
			t.Parallel()
			const ttl = 3 * time.Second
			urls := []string{testnet.NATS(t).ClientURL()}
			mod := func(o *Options) { o.LeaseTTL = ttl }
			a, b := openAt(t, urls, mod), openAt(t, urls, mod)
			sa, _ := a.CreateSession("sess", buffer.SessionMeta{})
			sessionOn(t, b, "sess")
			str, err := sa.NewStream([]string{"1"}, [32]byte{1})
			if err != nil {
				t.Fatal(err)
			}
			p := claim(t, str)
			key := str.(*stream).key
			if leaseInKV(t, a, key) {
				t.Skip("the renewals wrote the lease already (timing): the test needs it unwritten")
			}
			deleter := a
			if where != "deleted on the producer's replica" {
				deleter = b
			}
			if !deleter.Delete("sess", policy.ReasonDeleted) {
				t.Fatal("the session was not deleted")
			}
			// What the engine does once its producer's context ends.
			<-p.Context().Done()
			str.Fail(policy.ReasonUpstreamFailed)
			p.Done()
			time.Sleep(2 * ttl) // the renewals' rounds: six of them
			if a.holds(key) || leaseInKV(t, a, key) {
				t.Fatalf("%v after the session was deleted, A still holds the lease of its call (held %v, in KV %v): "+
					"renewed for as long as A lives", 2*ttl, a.holds(key), leaseInKV(t, a, key))
			}
		})
	}
}

// Review 40, attack 3: the scan records a stream's first sight (sweep.go,
// unwritten.since(key, now)) at the scan's now, taken before the buckets'
// load (scan: awaitFullWatch, bounded by 30s), not when the record was
// seen. A stream created while the load ran is then taken, on the
// sweeping replica, as waited for since before it existed: a reader there
// is told its producer is gone, and a takeover succeeds, less than a
// LeaseTTL after the stream was created, from a producer that is alive
// and would write its lease at its renewals' next round. The scan's load
// is simulated here by calling sweep with the now of a scan that began
// 2.5s (a load of 2.5s) before the sweep: B's LeaseTTL is 3s.
func TestReview40ScanStartBackdatesTheUnwrittenWait(t *testing.T) {
	t.Parallel()
	const ttl = 3 * time.Second
	urls := []string{testnet.NATS(t).ClientURL()}
	// B sweeps; its one scan here is done before the stream exists.
	b := openAt(t, urls, func(o *Options) { o.LeaseTTL = ttl; o.TakeoverWait = time.Hour; o.ScanInterval = time.Hour })
	waitUntil(t, "B to sweep", 10*time.Second, func() bool { return b.sweeps() && b.scans.Load() > 0 })
	// A's renewals' round is slow in coming (LeaseTTL 1h stands for a
	// round that has not come yet, a second or so after the call began).
	a := openAt(t, urls, func(o *Options) { o.LeaseTTL = time.Hour })
	scanBegan := time.Now()
	time.Sleep(2500 * time.Millisecond) // the buckets' load
	_, str, pa := callOn(t, a)
	created := time.Now()
	produceWithCursor(t, str, 1, 2)
	key := str.(*stream).key
	sessionOn(t, b, "sess")
	waitUntil(t, "B to see the record", 10*time.Second, func() bool { return leaseLater(b, key) })
	b.sweep(scanBegan, nil) // the scan's sweep, with the scan's now
	_, stB, _ := caughtUpOn(t, b, 2)
	defer takenOver(t, stB).Done()
	took := time.Since(created)
	alive := pa.Context().Err() == nil
	if took < ttl {
		t.Fatalf("B took the stream over %v after it was created (LeaseTTL %v), its producer on A alive: %v",
			took.Round(time.Millisecond), ttl, alive)
	}
}

// Review 40, attack 3, all replicas alike (LeaseTTL 6s, renewals every
// 2s): A makes the call right after a round of its renewals; B's scan
// "began" 5.5s before (its load took that long). B took the stream over
// half a second after A made it, while A was alive, well connected and
// producing; A's next round found the lease taken and stopped its
// producer. Now B's wait runs from when its sweep saw the stream: A
// writes its lease first, and B never takes the call of a live producer.
func TestReview40ScanStartBackdatesTheUnwrittenWaitSameConfig(t *testing.T) {
	t.Parallel()
	const ttl = 6 * time.Second
	urls := []string{testnet.NATS(t).ClientURL()}
	mod := func(o *Options) { o.LeaseTTL = ttl; o.TakeoverWait = time.Hour; o.ScanInterval = time.Hour }
	b := openAt(t, urls, mod)
	waitUntil(t, "B to sweep", 10*time.Second, func() bool { return b.sweeps() && b.scans.Load() > 0 })
	a := openAt(t, urls, mod)
	sa, _ := a.CreateSession("sess", buffer.SessionMeta{})
	d, err := sa.NewStream([]string{"0"}, [32]byte{2})
	if err != nil {
		t.Fatal(err)
	}
	claim(t, d)
	dk := d.(*stream).key
	waitUntil(t, "a round of A's renewals", 5*time.Second, func() bool { return !leaseLater(a, dk) })
	str, err := sa.NewStream([]string{"1"}, [32]byte{1})
	if err != nil {
		t.Fatal(err)
	}
	created := time.Now()
	scanBegan := created.Add(-5500 * time.Millisecond)
	pa := claim(t, str)
	produceWithCursor(t, str, 1, 2)
	key := str.(*stream).key
	sessionOn(t, b, "sess")
	waitUntil(t, "B to see the record", 10*time.Second, func() bool { return leaseLater(b, key) })
	b.sweep(scanBegan, nil) // the scan's sweep, with the scan's now
	s := sessionOn(t, b, "sess")
	stB, _ := s.Stream(2)
	for time.Since(created) < ttl+time.Second {
		if p, _, err := stB.(buffer.Takeover).TakeOver(t.Context()); err == nil {
			p.Done()
			t.Fatalf("B took the stream over %v after it was created (LeaseTTL %v), its producer on A alive: %v",
				time.Since(created).Round(time.Millisecond), ttl, pa.Context().Err() == nil)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if pa.Context().Err() != nil {
		t.Fatal("A's producer was stopped: its lease was found taken")
	}
	if !leaseInKV(t, a, key) {
		t.Fatal("A's renewals did not write its lease")
	}
}

// Review 40, held: a replica that closes hands a call with a cursor over
// while its lease is unwritten: B takes it over at once (the mark is
// cleared), not a LeaseTTL later.
func TestReview40CloseHandsAnUnwrittenCallOverAtOnce(t *testing.T) {
	t.Parallel()
	urls := []string{testnet.NATS(t).ClientURL()}
	const ttl = 30 * time.Second
	mod := func(o *Options) { o.LeaseTTL = ttl; o.TakeoverWait = time.Hour }
	a, b := openAt(t, urls, mod), openAt(t, urls, mod)
	_, str, pa := callOn(t, a)
	produceWithCursor(t, str, 1, 2)
	_, stB, rb := caughtUpOn(t, b, 2)
	go func() { <-pa.Context().Done(); pa.Done() }()
	closed := time.Now()
	a.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	for {
		_, err := rb.Read(ctx, nil, 1<<20, time.Second)
		if errors.Is(err, buffer.ErrProducerGone) {
			break
		}
		if err != nil && !errors.Is(err, buffer.ErrIdle) {
			t.Fatalf("B's reader: %v", err)
		}
	}
	pb, who, err := stB.(buffer.Takeover).TakeOver(ctx)
	if err != nil {
		t.Fatalf("B's takeover %v after A closed: %v", time.Since(closed), err)
	}
	defer pb.Done()
	t.Logf("taken over from %s %v after A closed", who.Previous, time.Since(closed).Round(time.Millisecond))
}
