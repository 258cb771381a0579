package natsstore

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/mcpresume/caddy-mcp-resume/buffer"
	"github.com/mcpresume/caddy-mcp-resume/internal/testnet"
)

// leaseInKV reads the lease of key from NATS itself, not a mirror.
func leaseInKV(t *testing.T, st *Store, key string) bool {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	_, err := st.leases.kv.Get(ctx, key)
	if err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) && !errors.Is(err, jetstream.ErrKeyDeleted) {
		t.Fatalf("reading the lease: %v", err)
	}
	return err == nil
}

// writeLeaseNow writes the lease st holds unwritten for key, as its
// renewals' next round would.
func writeLeaseNow(t *testing.T, st *Store, key string) {
	t.Helper()
	st.held.mu.Lock()
	h := st.held.m[key]
	st.held.mu.Unlock()
	if h == nil {
		t.Fatalf("no lease held for %s", key)
	}
	st.writeHeld(h)
	if !leaseInKV(t, st, key) {
		t.Fatalf("the lease of %s is not written", key)
	}
}

// callOn opens session "sess" on st and a call in it (stream 1), and
// takes its producer role.
func callOn(t *testing.T, st *Store) (buffer.Session, buffer.Stream, buffer.Producer) {
	t.Helper()
	s, err := st.CreateSession("sess", buffer.SessionMeta{})
	if err != nil {
		t.Fatal(err)
	}
	str, err := s.NewStream([]string{"1"}, [32]byte{1})
	if err != nil {
		t.Fatal(err)
	}
	return s, str, claim(t, str)
}

// takenOver waits (10 s at most) until str's replica takes it over, and
// returns the new producer role.
func takenOver(t *testing.T, str buffer.Stream) buffer.Producer {
	t.Helper()
	var p buffer.Producer
	waitUntil(t, "the stream to be taken over", 10*time.Second, func() bool {
		var err error
		p, _, err = str.(buffer.Takeover).TakeOver(t.Context())
		return err == nil
	})
	return p
}

func leaseLater(st *Store, key string) bool {
	rec, _, ok := st.streams.get(key)
	return ok && rec.LeaseLater
}

// A call that outlives the renewals' next round has its lease written then
// (within LeaseTTL/3), and its record's mark cleared; its end releases it.
func TestALongCallWritesItsLeaseAtTheNextRenewal(t *testing.T) {
	t.Parallel()
	urls := []string{testnet.NATS(t).ClientURL()}
	a := openAt(t, urls, func(o *Options) { o.LeaseTTL = 1500 * time.Millisecond })
	_, str, p := callOn(t, a)
	key := str.(*stream).key
	opened := time.Now()
	if !leaseLater(a, key) {
		t.Fatal("a new stream's record does not say its lease comes later")
	}
	waitUntil(t, "the lease to be written", 5*time.Second, func() bool { return leaseInKV(t, a, key) })
	if took := time.Since(opened); took > time.Second {
		t.Errorf("the lease was written %v after the stream was opened, more than LeaseTTL/3 and a margin", took)
	}
	waitUntil(t, "the record's mark to clear", 5*time.Second, func() bool { return !leaseLater(a, key) })
	appendEvents(t, str, 1, 1)
	str.Complete()
	p.Done()
	waitUntil(t, "the lease to be released", 5*time.Second, func() bool { return !leaseInKV(t, a, key) })
}

// A producer that dies before writing its lease: another replica takes its
// stream for held for a LeaseTTL from when it first finds it unwritten
// (a takeover is refused meanwhile), then takes it over; a third cannot.
func TestAProducerDeadBeforeItsLeaseIsTakenOverAfterALeaseTTL(t *testing.T) {
	t.Parallel()
	urls := []string{testnet.NATS(t).ClientURL()}
	const ttl = 3 * time.Second
	mod := func(o *Options) { o.LeaseTTL = ttl; o.TakeoverWait = time.Hour }
	b, c := openAt(t, urls, mod), openAt(t, urls, mod)
	// A renews every hour: it never writes its lease.
	a := openAt(t, urls, func(o *Options) { o.LeaseTTL = time.Hour; o.TakeoverWait = time.Hour })
	_, str, _ := callOn(t, a)
	produceWithCursor(t, str, 1, 2)
	key := str.(*stream).key
	crash(a)
	if leaseInKV(t, b, key) {
		t.Fatal("the lease was written: the test needs one that was not")
	}

	_, stB, rb := caughtUpOn(t, b, 2)
	first := time.Now()
	if _, _, err := stB.(buffer.Takeover).TakeOver(t.Context()); !errors.Is(err, buffer.ErrProducing) {
		t.Fatalf("a takeover while the lease may still be written: %v, want ErrProducing", err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 4*ttl)
	defer cancel()
	if _, err := rb.Read(ctx, nil, 1<<20, time.Hour); !errors.Is(err, buffer.ErrProducerGone) {
		t.Fatalf("B's reader: %v, want ErrProducerGone", err)
	}
	if waited := time.Since(first); waited < ttl-100*time.Millisecond {
		t.Fatalf("the producer was taken for dead %v after B first found its lease unwritten, before a LeaseTTL (%v)", waited, ttl)
	}
	pb, who, err := stB.(buffer.Takeover).TakeOver(ctx)
	if err != nil {
		t.Fatalf("B's takeover: %v", err)
	}
	defer pb.Done()
	if who.Previous != a.opts.ReplicaID {
		t.Fatalf("succession %+v, want from %s", who, a.opts.ReplicaID)
	}
	if leaseLater(b, key) {
		t.Error("the record still says the lease comes later after a takeover")
	}
	stC, _ := sessionOn(t, c, "sess").Stream(1)
	if _, _, err := stC.(buffer.Takeover).TakeOver(ctx); err == nil {
		t.Fatal("C took the stream over too")
	}
	appendEvents(t, stB, 3, 3)
	stB.Complete()
	if seqs, _ := readToEnd(t, ctx, rb); len(seqs) != 1 || seqs[0] != 3 {
		t.Fatalf("B's reader after the takeover read %v, want [3]", seqs)
	}
}

// A producer that was only slow, not dead: once another replica took the
// stream over (creating the lease), its own write of the lease finds the
// key taken, and it stops.
func TestASlowProducerWhoseStreamWasTakenStops(t *testing.T) {
	t.Parallel()
	urls := []string{testnet.NATS(t).ClientURL()}
	a := openAt(t, urls, func(o *Options) { o.LeaseTTL = time.Hour })
	b := openAt(t, urls, func(o *Options) { o.LeaseTTL = 500 * time.Millisecond })
	_, str, pa := callOn(t, a)
	produceWithCursor(t, str, 1, 1)
	key := str.(*stream).key

	stB, _ := sessionOn(t, b, "sess").Stream(1)
	defer takenOver(t, stB).Done()
	a.held.mu.Lock()
	h := a.held.m[key]
	a.held.mu.Unlock()
	if h == nil {
		t.Fatal("A no longer holds the lease it never wrote")
	}
	a.writeHeld(h) // A's renewals' round, late
	select {
	case <-pa.Context().Done():
	case <-time.After(5 * time.Second):
		t.Fatal("A's producer goes on after its lease was found taken")
	}
	if a.holds(key) {
		t.Error("A still holds the lease")
	}
}

// A producer that gives a live stream up before writing its lease (done
// with it unended) clears the mark: another replica takes it over at once,
// not a LeaseTTL later.
func TestAnUnwrittenLeaseGivenUpIsTakenAtOnce(t *testing.T) {
	t.Parallel()
	urls := []string{testnet.NATS(t).ClientURL()}
	mod := func(o *Options) { o.LeaseTTL = time.Hour }
	a, b := openAt(t, urls, mod), openAt(t, urls, mod)
	_, str, pa := callOn(t, a)
	produceWithCursor(t, str, 1, 1)
	stB, _ := sessionOn(t, b, "sess").Stream(1)
	if _, _, err := stB.(buffer.Takeover).TakeOver(t.Context()); !errors.Is(err, buffer.ErrProducing) {
		t.Fatalf("B's takeover while A produces: %v, want ErrProducing", err)
	}
	pa.Done() // its upstream response broke off: the stream is live, unproduced
	takenOver(t, stB).Done()
}

// A written lease whose stream's record went without it (a takeover
// racing its session's end, review 42) is not renewed for good: the
// renewals let it go.
func TestALeaseOutlivingItsStreamIsLetGo(t *testing.T) {
	t.Parallel()
	urls := []string{testnet.NATS(t).ClientURL()}
	a := openAt(t, urls, func(o *Options) { o.LeaseTTL = 1500 * time.Millisecond })
	_, str, _ := callOn(t, a)
	key := str.(*stream).key
	writeLeaseNow(t, a, key)
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	if err := a.streams.remove(ctx, key, 0); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the lease to go", 5*time.Second, func() bool { return !a.holds(key) && !leaseInKV(t, a, key) })
}
