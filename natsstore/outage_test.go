package natsstore

import (
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/buffer"
	"github.com/mcpresume/caddy-mcp-resume/internal/testnet"
	"github.com/mcpresume/caddy-mcp-resume/policy"
)

// A replica cut off from NATS for longer than a lease's TTL plus the life
// of its expiry marker (5 s) never sees the lease expire through its watch.
// Here a request stream's producer lets go of it during such an outage (as
// a POST whose client could not be attached does): its Fail and its lease
// release cannot reach NATS. Once NATS is back, the sweeper must still fail
// the stream, and a repeat of the request must get an end, not wait on a
// stream no one produces. (The leases mirror kept the lease for good.)
func TestALeaseThatLapsedDuringAnOutageIsSeenGone(t *testing.T) {
	t.Parallel()
	ns := testnet.NATS(t)
	link := newCutter(t, strings.TrimPrefix(ns.ClientURL(), "nats://"))
	st := openAt(t, []string{"nats://" + link.addr()}, func(o *Options) { o.LeaseTTL = 2 * time.Second })
	s, err := st.CreateSession("cut", buffer.SessionMeta{})
	if err != nil {
		t.Fatal(err)
	}
	key := [32]byte{7}
	str, err := s.NewStream([]string{"1"}, key)
	if err != nil {
		t.Fatal(err)
	}
	p := claim(t, str)

	link.cut()
	str.Fail(policy.ReasonUpstreamFailed) // cannot reach NATS
	p.Done()
	time.Sleep(2*time.Second + 5*time.Second + time.Second) // the lease lapses, its marker goes
	link.mend()

	waitUntil(t, "the sweeper to fail the stream", 30*time.Second, func() bool {
		return str.View().State == policy.Failed
	})
	again, ok := s.StreamByKey(key)
	if !ok {
		t.Fatal("a repeat of the request finds no stream")
	}
	_, rd, err := again.Resume(0, func(policy.StreamView) policy.Resume { return policy.Resume{Kind: policy.Replay, From: 1} })
	if err != nil {
		t.Fatal(err)
	}
	defer rd.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var got []string
	for {
		b, err := rd.Read(ctx, nil, 1<<20, time.Second)
		for _, ev := range b.Data {
			got = append(got, string(ev))
		}
		if err == nil || errors.Is(err, buffer.ErrIdle) {
			continue
		}
		var failed *buffer.FailedError
		if !errors.As(err, &failed) {
			t.Fatalf("the repeat's read ended with %v after %q", err, got)
		}
		break
	}
	if len(got) != 1 || !strings.Contains(got[0], "event: gap") || !strings.Contains(got[0], "-32010") {
		t.Fatalf("the repeat got %q, want the gap and the error", got)
	}
}

// A standalone reader on replica A, its producer on replica B; A is cut
// off from NATS. Once the lease's last renewal A saw is a TTL old, the
// reader's check for a producer asks KV, and must do so within the Read's
// context, once per TTL, not for the KV timeout (2 s) on every Read.
//
// Not parallel: it times the store against the lease TTL.
func TestAReadIsNotHeldByALeaseCheckWhileCut(t *testing.T) {
	ns := testnet.NATS(t)
	link := newCutter(t, strings.TrimPrefix(ns.ClientURL(), "nats://"))
	mod := func(o *Options) { o.LeaseTTL = 2 * time.Second }
	a := openAt(t, []string{"nats://" + link.addr()}, mod)
	b := openAt(t, []string{ns.ClientURL()}, mod)
	sb, err := b.CreateSession("cutread", buffer.SessionMeta{})
	if err != nil {
		t.Fatal(err)
	}
	gb := sb.Standalone()
	if tryClaim(gb) == nil {
		t.Fatal("no lease")
	}
	appendEvents(t, gb, 1, 3)
	sa := sessionOn(t, a, "cutread")
	r, err := sa.Standalone().Attach(1)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if _, err := readSeqs(t, r, sb.Epoch(), 0, 1, 3); err != nil {
		t.Fatal(err)
	}
	link.cut()
	time.Sleep(3 * time.Second) // the lease's last renewal seen is a TTL old
	worst := time.Duration(0)
	for i := 0; i < 3; i++ {
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		began := time.Now()
		_, err := r.Read(ctx, nil, 1<<20, time.Hour)
		took := time.Since(began)
		cancel()
		t.Logf("Read %d: %v after %v", i, err, took)
		worst = max(worst, took)
	}
	link.mend()
	if worst > time.Second {
		t.Errorf("a Read whose context ended after 100ms took %v while NATS was out of reach", worst)
	}
}

// A produces a request stream and is cut off longer than the lease TTL
// and its marker; B's sweeper fails the stream meanwhile. Back, A's
// renewal takes the lease again (its producer is still there), its pending
// publish conflicts with B's end, and the producer completes and lets go:
// the lease must go too, not be renewed for a stream nobody produces.
func TestALeaseTakenAgainGoesWithItsStream(t *testing.T) {
	t.Parallel()
	ns := testnet.NATS(t)
	link := newCutter(t, strings.TrimPrefix(ns.ClientURL(), "nats://"))
	mod := func(o *Options) { o.LeaseTTL = 2 * time.Second }
	b := openAt(t, []string{ns.ClientURL()}, mod)
	a := openAt(t, []string{"nats://" + link.addr()}, mod)
	sa, err := a.CreateSession("leak", buffer.SessionMeta{})
	if err != nil {
		t.Fatal(err)
	}
	str, err := sa.NewStream([]string{"1"}, [32]byte{9})
	if err != nil {
		t.Fatal(err)
	}
	p := claim(t, str)
	key := str.(*stream).key
	link.cut()
	go str.Append(context.Background(), buffer.Entry{Fields: []byte("data: {\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{}}\n"), Answers: []string{"1"}})
	sb := sessionOn(t, b, "leak")
	waitUntil(t, "B's sweeper to fail the stream", 40*time.Second, func() bool {
		s2, ok := sb.Stream(str.Num())
		return ok && s2.View().State == policy.Failed
	})
	link.mend()
	time.Sleep(3 * time.Second) // A reconnects, renews (reacquires), its publish conflicts
	t.Logf("after mend: A holds %v, KV leased %v", a.holds(key), b.leased(context.Background(), key))
	str.Complete()
	p.Done()
	time.Sleep(4 * time.Second) // two TTLs
	holds, leased := a.holds(key), b.leased(context.Background(), key)
	t.Logf("after the producer let go: A holds %v, KV leased %v, state %v", holds, leased, str.View().State)
	if holds || leased {
		t.Errorf("the lease of a failed stream nobody produces is still renewed")
	}
}

// cutter relays TCP connections to target; cut resets them all and
// refuses new ones until mend: this replica loses NATS while NATS, and
// its lease expiries, go on.
type cutter struct {
	ln     net.Listener
	target string
	mu     sync.Mutex
	down   bool
	conns  []net.Conn
}

func newCutter(t testing.TB, target string) *cutter {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	c := &cutter{ln: ln, target: target}
	t.Cleanup(func() { ln.Close(); c.cut() })
	go func() {
		for {
			in, err := ln.Accept()
			if err != nil {
				return
			}
			c.mu.Lock()
			down := c.down
			c.mu.Unlock()
			out, err := net.Dial("tcp", target)
			if down || err != nil {
				in.Close()
				if out != nil {
					out.Close()
				}
				continue
			}
			c.mu.Lock()
			c.conns = append(c.conns, in, out)
			c.mu.Unlock()
			go func() { io.Copy(out, in); out.Close() }()
			go func() { io.Copy(in, out); in.Close() }()
		}
	}()
	return c
}

func (c *cutter) addr() string { return c.ln.Addr().String() }

func (c *cutter) cut() {
	c.mu.Lock()
	c.down = true
	conns := c.conns
	c.conns = nil
	c.mu.Unlock()
	for _, conn := range conns {
		if tc, ok := conn.(*net.TCPConn); ok {
			tc.SetLinger(0)
		}
		conn.Close()
	}
}

func (c *cutter) mend() {
	c.mu.Lock()
	c.down = false
	c.mu.Unlock()
}

// The standalone stream's producer on A, cut off from NATS: A cannot renew
// its lease, so it stops its producer (its upstream GET closes) at 2/3 of
// the lease TTL, before the lease can lapse; B takes the stream over only
// after that, and only once the lease lapsed.
//
// Not parallel: it times the store against the lease TTL.
func TestAStandaloneProducerCutOffStopsBeforeItsLeaseLapses(t *testing.T) {
	ns := testnet.NATS(t)
	link := newCutter(t, strings.TrimPrefix(ns.ClientURL(), "nats://"))
	mod := func(o *Options) { o.LeaseTTL = 3 * time.Second }
	a := openAt(t, []string{"nats://" + link.addr()}, mod)
	b := openAt(t, []string{ns.ClientURL()}, mod)
	sa, err := a.CreateSession("fenced", buffer.SessionMeta{})
	if err != nil {
		t.Fatal(err)
	}
	pa := claim(t, sa.Standalone())
	gb := sessionOn(t, b, "fenced").Standalone()
	if _, err := gb.TakeProducer(t.Context()); !errors.Is(err, buffer.ErrProducing) {
		t.Fatalf("B's TakeProducer while A produces: %v, want ErrProducing", err)
	}
	link.cut()
	cutAt := time.Now()
	stopped := make(chan time.Duration, 1)
	go func() {
		<-pa.Context().Done()
		stopped <- time.Since(cutAt)
		pa.Done() // A's GET is closed: it lets go (KV is out of reach: the lease lapses)
	}()
	var pb buffer.Producer
	waitUntil(t, "B to take the stream over", 20*time.Second, func() bool {
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		defer cancel()
		if p, err := gb.TakeProducer(ctx); err == nil {
			pb = p
		}
		return pb != nil
	})
	tookAfter := time.Since(cutAt)
	link.mend()
	defer pb.Done()
	var stoppedAfter time.Duration
	select {
	case stoppedAfter = <-stopped:
	default:
		t.Fatal("B took the stream over while A's producer runs")
	}
	t.Logf("A stopped %v after the cut, B took over %v after it", stoppedAfter, tookAfter)
	if stoppedAfter >= 3*time.Second || stoppedAfter == 0 {
		t.Fatalf("A stopped %v after the cut, want before the lease TTL (3s)", stoppedAfter)
	}
	if tookAfter <= stoppedAfter {
		t.Fatalf("B took over %v after the cut, before A stopped (%v)", tookAfter, stoppedAfter)
	}
}
