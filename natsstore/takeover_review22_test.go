package natsstore

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/buffer"
	"github.com/mcpresume/caddy-mcp-resume/internal/testnet"
	"github.com/mcpresume/caddy-mcp-resume/policy"
)

// The sweeper ends an orphan whose takeover_wait ran out (failOrphan: the
// failure signals, the record's end, the end marker) after it found the
// lease lapsed, without taking the lease itself; a client coming back at
// that moment makes its replica take the stream over (TakeOver: the lease,
// the record, the fence). "The lease decides" (DESIGN.md, Takeover): one of
// the two must win, whole. A takeover that succeeds must find the stream
// live and go on from the stored head; it must never produce into a
// stream the sweeper failed, or after failure signals that already told
// the client its request was lost (the client would get the -32010 error,
// then the result).
func TestTakeoverAndTheSweepersEndOfAnOrphanExcludeEachOther(t *testing.T) {
	urls := []string{testnet.NATS(t).ClientURL()}
	mod := func(o *Options) { o.LeaseTTL = time.Second; o.TakeoverWait = time.Hour }
	b, c := openAt(t, urls, mod), openAt(t, urls, mod)
	bad := 0
	const trials = 50 // the window is a few KV writes wide: about one trial in fifteen meets it
	for i := range trials {
		a := openAt(t, urls, mod)
		id := fmt.Sprintf("race-%d", i)
		sa, _ := a.CreateSession(id, buffer.SessionMeta{})
		str, err := sa.NewStream([]string{"1"}, [32]byte{1})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := str.TakeProducer(context.Background()); err != nil {
			t.Fatal(err)
		}
		produceWithCursor(t, str, 1, 3)
		key := str.(*stream).key
		crash(a)
		sessionOn(t, b, id)
		stC, _ := sessionOn(t, c, id).Stream(1)
		waitUntil(t, "the lease to lapse", 10*time.Second, func() bool { return !b.leased(context.Background(), key) })

		var wg sync.WaitGroup
		var p buffer.Producer
		var terr error
		wg.Add(2)
		go func() { defer wg.Done(); b.failOrphan(key) }() // the sweeper, its !leased check passed
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			p, _, terr = stC.(buffer.Takeover).TakeOver(ctx)
		}()
		wg.Wait()
		if terr != nil {
			continue // the sweeper won
		}
		time.Sleep(200 * time.Millisecond)
		v := stC.View()
		if v.State != policy.Live || v.Head != 3 {
			bad++
			t.Errorf("trial %d: the takeover succeeded, and the stream is %s with head %d (want live, head 3: no failure signal before the fence)",
				i, v.State, v.Head)
		}
		p.Done()
		if bad > 0 {
			break
		}
	}
}
