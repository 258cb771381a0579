package natsstore

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/buffer"
	"github.com/mcpresume/caddy-mcp-resume/internal/testnet"
)

// Review 41, held: many short calls at once, some straddling a round of
// the renewals (a few last past it): once all have ended, A holds no lease
// and KV has none, and no record keeps the mark of a live stream.
func TestReview41ManyShortCallsLeaveNoLease(t *testing.T) {
	t.Parallel()
	urls := []string{testnet.NATS(t).ClientURL()}
	mod := func(o *Options) { o.LeaseTTL = time.Second; o.Limits.MaxStreamsPerSession = 1000 }
	b := openAt(t, urls, mod)
	waitUntil(t, "B to sweep", 10*time.Second, func() bool { return b.sweeps() })
	a := openAt(t, urls, mod)
	const workers, calls = 24, 25
	var wg sync.WaitGroup
	for w := range workers {
		s, err := a.CreateSession(fmt.Sprintf("short-%d", w), buffer.SessionMeta{})
		if err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range calls {
				if i%5 == 4 {
					time.Sleep(time.Duration(w*13%300) * time.Millisecond) // some calls outlive a round
				}
				shortCall(t, s, fmt.Sprint(1000*w+i))
			}
		}()
	}
	wg.Wait()
	time.Sleep(1500 * time.Millisecond)
	a.held.mu.Lock()
	held := len(a.held.m)
	a.held.mu.Unlock()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	inKV := 0
	if lister, err := b.leases.kv.ListKeys(ctx); err == nil {
		for k := range lister.Keys() {
			if !isStandaloneKey(k) && k != probeKey {
				inKV++
				e, _ := b.leases.kv.Get(ctx, k)
				r, _ := kvStreamRec(b, k)
				if e != nil && r != nil {
					t.Logf("%s: %s rev %d created %v; stream %v lease_later %v producer %s ended %v", k, e.Value(), e.Revision(),
						time.Since(e.Created()), r.State, r.LeaseLater, r.Producer, time.Since(time.Unix(0, r.Ended)))
				}
			}
		}
	}
	if held > 0 || inKV > 0 {
		t.Fatalf("after %d short calls ended: A holds %d leases, KV has %d", workers*calls, held, inKV)
	}
}
