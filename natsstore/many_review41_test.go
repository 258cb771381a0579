package natsstore

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/buffer"
	"github.com/mcpresume/caddy-mcp-resume/internal/testnet"
	"github.com/mcpresume/caddy-mcp-resume/policy"
)

// Review 41, attack 4: many long calls begun at once on one replica, each
// with an upstream cursor, their clients attached there, the upstream silent
// for a while. Every producer stays alive and connected: none may be
// stopped (fenced), taken over or failed. The sweeper runs on B; B's
// readers of a few of the calls ask for their producer and take over what
// they may.
func TestReview41ManyConcurrentCallsStayTheirProducers(t *testing.T) {
	t.Parallel()
	const ttl = 2 * time.Second
	const calls = 200
	urls := []string{testnet.NATS(t).ClientURL()}
	mod := func(o *Options) {
		o.LeaseTTL = ttl
		o.TakeoverWait = time.Hour
		o.Limits.MaxStreamsPerSession = calls
	}
	b := openAt(t, urls, mod)
	waitUntil(t, "B to sweep", 10*time.Second, func() bool { return b.sweeps() })
	a := openAt(t, urls, mod)
	const sessions = 10
	var ss []*session
	for i := range sessions {
		s, err := a.CreateSession(fmt.Sprintf("s%d", i), buffer.SessionMeta{})
		if err != nil {
			t.Fatal(err)
		}
		ss = append(ss, s.(*session))
	}
	type call struct {
		str buffer.Stream
		p   buffer.Producer
	}
	list := make([]call, calls)
	var wg sync.WaitGroup
	var failedOpen atomic.Int32
	began := time.Now()
	for i := range calls {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s := ss[i%sessions]
			str, p, _, err := s.OpenCall(context.Background(), []string{"1"}, [32]byte{byte(i), byte(i >> 8)})
			if err != nil {
				failedOpen.Add(1)
				return
			}
			e := buffer.Entry{Fields: []byte("data: event 1\n"), Upstream: "up-1"}
			if _, err := str.Append(context.Background(), e); err != nil {
				failedOpen.Add(1)
			}
			list[i] = call{str, p}
		}()
	}
	wg.Wait()
	t.Logf("%d calls opened in %v (%d failed)", calls, time.Since(began).Round(time.Millisecond), failedOpen.Load())
	// B's clients: takeovers attempted on a few calls all along.
	stop := make(chan struct{})
	var took atomic.Int32
	var twg sync.WaitGroup
	for i := 0; i < calls; i += 30 {
		c := list[i]
		if c.str == nil {
			continue
		}
		twg.Add(1)
		go func() {
			defer twg.Done()
			sb := sessionOn(t, b, fmt.Sprintf("s%d", i%sessions))
			stB, ok := sb.Stream(c.str.Num())
			if !ok {
				return
			}
			for {
				select {
				case <-stop:
					return
				case <-time.After(100 * time.Millisecond):
				}
				if p, _, err := stB.(buffer.Takeover).TakeOver(context.Background()); err == nil {
					took.Add(1)
					p.Done()
					return
				}
			}
		}()
	}
	time.Sleep(4 * ttl)
	close(stop)
	twg.Wait()
	stopped, failed := 0, 0
	for _, c := range list {
		if c.str == nil {
			continue
		}
		if c.p.Context().Err() != nil {
			stopped++
		}
		if r, ok := kvStreamRec(b, c.str.(*stream).key); ok && r.State != policy.Live {
			failed++
		}
	}
	if stopped+failed+int(took.Load()) > 0 {
		t.Fatalf("of %d live calls whose producers never died: %d producers stopped, %d streams ended, %d taken over by B",
			calls, stopped, failed, took.Load())
	}
}
