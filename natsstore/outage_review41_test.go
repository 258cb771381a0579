package natsstore

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/buffer"
	"github.com/mcpresume/caddy-mcp-resume/internal/testnet"
	"github.com/mcpresume/caddy-mcp-resume/policy"
)

// Review 41, attack 3: the producer is cut off from NATS while its lease is
// unwritten, for cutFor from cutAt after the call began. With a cursor:
// its fence must stop it before B can take the call over (never two
// producers), and once back it must neither write a lease nor keep one.
// Without a cursor: it produces on; the sweeper may fail the stream, and
// then its lease must go with its producer.
func TestReview41OutageWhileTheLeaseIsUnwritten(t *testing.T) {
	const ttl = 3 * time.Second
	for _, c := range []struct {
		name          string
		cursor        bool
		cutAt, cutFor time.Duration
	}{
		{"cursor, cut at once, long", true, 0, 2 * ttl},
		{"cursor, cut at once, past the fence", true, 0, ttl * 5 / 6},
		{"cursor, cut at its first round", true, ttl / 3, ttl},
		{"no cursor, cut at once, long", false, 0, 3 * ttl},
		{"no cursor, cut past the wait", false, ttl / 4, ttl},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			ns := testnet.NATS(t)
			link := newCutter(t, strings.TrimPrefix(ns.ClientURL(), "nats://"))
			mod := func(o *Options) { o.LeaseTTL = ttl; o.TakeoverWait = time.Hour }
			b := openAt(t, []string{ns.ClientURL()}, mod)
			waitUntil(t, "B to sweep", 10*time.Second, func() bool { return b.sweeps() })
			a := openAt(t, []string{"nats://" + link.addr()}, mod)
			sa, err := a.CreateSession("sess", buffer.SessionMeta{})
			if err != nil {
				t.Fatal(err)
			}
			str, err := sa.NewStream([]string{"1"}, [32]byte{1})
			if err != nil {
				t.Fatal(err)
			}
			began := time.Now()
			pa := claim(t, str)
			done := make(chan struct{})
			go func() { // the engine's tap: done once stopped
				<-pa.Context().Done()
				pa.Done()
				close(done)
			}()
			if c.cursor {
				produceWithCursor(t, str, 1, 2)
			} else {
				appendEvents(t, str, 1, 2)
				str.(*stream).currentWriter().waitStored(10 * time.Second)
			}
			key := str.(*stream).key
			_, stB, _ := caughtUpOn(t, b, 2)
			time.Sleep(time.Until(began.Add(c.cutAt)))
			link.cut()
			cut := time.Now()
			// B asks all along, as its client's reads would.
			var taken time.Time
			var pb buffer.Producer
			aliveAtTakeover := false
			for time.Since(cut) < c.cutFor {
				if taken.IsZero() && c.cursor { // the engine takes over only from a cursor
					if p, _, err := stB.(buffer.Takeover).TakeOver(t.Context()); err == nil {
						taken, pb = time.Now(), p
						aliveAtTakeover = pa.Context().Err() == nil
					}
				}
				time.Sleep(20 * time.Millisecond)
			}
			link.mend()
			mended := time.Now()
			for time.Since(mended) < 2*ttl {
				if taken.IsZero() && c.cursor { // the engine takes over only from a cursor
					if p, _, err := stB.(buffer.Takeover).TakeOver(t.Context()); err == nil {
						taken, pb = time.Now(), p
						aliveAtTakeover = pa.Context().Err() == nil
					}
				}
				time.Sleep(20 * time.Millisecond)
			}
			if pb != nil {
				defer pb.Done()
			}
			t.Logf("taken over %v after the call began (cut %v..%v); A's producer alive then: %v, now: %v; state %v",
				since(taken, began), c.cutAt, c.cutAt+c.cutFor, aliveAtTakeover, pa.Context().Err() == nil, str.View().State)
			if aliveAtTakeover {
				t.Errorf("B took the call over while A's producer ran")
			}
			// (Sooner than a LeaseTTL is right once A's fence stopped its
			// producer and, back, it cleared the mark.)
			if pb == nil && c.cursor && str.View().State == policy.Live && pa.Context().Err() != nil && !a.holds(key) {
				t.Errorf("A's producer stopped, the call is live and no one took it over")
			}
			// A's producer ends as the engine would (its stream ended, or it
			// was stopped); no lease of A's may stay.
			if pa.Context().Err() == nil {
				str.Complete()
				pa.Done()
			}
			<-done
			if !c.cursor {
				r, _ := kvStreamRec(b, key)
				t.Logf("no cursor: the stream is %v", r.State)
			}
			time.Sleep(ttl)
			a.held.mu.Lock()
			h := a.held.m[key]
			a.held.mu.Unlock()
			if h != nil && pb == nil {
				t.Errorf("A still holds the lease after its producer let go (rev %d)", h.rev)
			}
			ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
			defer cancel()
			if e, err := b.leases.kv.Get(ctx, key); err == nil && pb == nil {
				t.Errorf("a lease is in KV with no producer: %s", e.Value())
			} else if err != nil && !strings.Contains(err.Error(), "not found") && !errors.Is(err, context.Canceled) {
				t.Logf("reading the lease: %v", err)
			}
		})
	}
}

func since(t, from time.Time) string {
	if t.IsZero() {
		return "never"
	}
	return t.Sub(from).Round(time.Millisecond).String()
}
