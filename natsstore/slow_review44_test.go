package natsstore

import (
	"context"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/buffer"
	"github.com/mcpresume/caddy-mcp-resume/internal/testnet"
)

// slowRelay is a TCP relay in front of a NATS server that delays every
// byte, each way, by delay (0 at first): a slow but alive NATS (a server
// under CPU load, a congested link). Order is kept; nothing is lost.
type slowRelay struct {
	ln     net.Listener
	target string
	delay  atomic.Int64 // one way, in nanoseconds
	mu     sync.Mutex
	conns  []net.Conn
}

func newSlowRelay(t testing.TB, target string) *slowRelay {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &slowRelay{ln: ln, target: target}
	t.Cleanup(func() {
		ln.Close()
		r.mu.Lock()
		for _, c := range r.conns {
			c.Close()
		}
		r.mu.Unlock()
	})
	go func() {
		for {
			in, err := ln.Accept()
			if err != nil {
				return
			}
			out, err := net.Dial("tcp", target)
			if err != nil {
				in.Close()
				continue
			}
			r.mu.Lock()
			r.conns = append(r.conns, in, out)
			r.mu.Unlock()
			go r.pipe(out, in)
			go r.pipe(in, out)
		}
	}()
	return r
}

func (r *slowRelay) addr() string { return r.ln.Addr().String() }

func (r *slowRelay) pipe(dst, src net.Conn) {
	type chunk struct {
		at time.Time
		b  []byte
	}
	ch := make(chan chunk, 1<<16)
	go func() {
		defer close(ch)
		for {
			buf := make([]byte, 32<<10)
			n, err := src.Read(buf)
			if n > 0 {
				ch <- chunk{time.Now().Add(time.Duration(r.delay.Load())), buf[:n]}
			}
			if err != nil {
				return
			}
		}
	}()
	for c := range ch {
		if d := time.Until(c.at); d > 0 {
			time.Sleep(d)
		}
		if _, err := dst.Write(c.b); err != nil {
			break
		}
	}
	dst.Close()
	src.Close()
}

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
	slow := newSlowRelay(t, ns.Addr().String())
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
