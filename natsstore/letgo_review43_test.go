package natsstore

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/mcpresume/caddy-mcp-resume/buffer"
	"github.com/mcpresume/caddy-mcp-resume/internal/testnet"
	"github.com/mcpresume/caddy-mcp-resume/policy"
)

// Review 43 (guard): the renewals' let-go (leaseUnneeded) must not
// release the lease of a live call whose record this replica's mirror
// does not hold (forgotten: an interest dropped, a mirror reset); KV says
// it is live. Released, another replica could take the healthy producer's
// call over (its producer is not told).
func TestReview43LetGoKeepsALiveCallTheMirrorForgot(t *testing.T) {
	t.Parallel()
	a := openAt(t, []string{testnet.NATS(t).ClientURL()}, func(o *Options) { o.LeaseTTL = 1500 * time.Millisecond })
	_, str, p := callOn(t, a)
	defer p.Done()
	key := str.(*stream).key
	for range 6 { // several renewal rounds (every 500 ms)
		a.streams.forget(func(k string) bool { return k != key })
		time.Sleep(250 * time.Millisecond)
		if !a.holds(key) {
			t.Fatal("the renewals let the lease of a live call go: the mirror lacked its record")
		}
	}
	if p.Context().Err() != nil {
		t.Fatal("the producer was stopped")
	}
}

// Review 43 (guard): a creation that loses to another replica's session
// (it keeps the interest it began) while that replica deletes
// the session at once must not keep an interest in a session that no
// longer exists: nothing would ever end it.
func TestReview43LostCreationRacingADeleteKeepsNoInterest(t *testing.T) {
	t.Parallel()
	urls := []string{testnet.NATS(t).ClientURL()}
	a, b := openAt(t, urls), openAt(t, urls)
	var ids []string
	outcomes := map[string]int{}
	var omu sync.Mutex
	for i := range 60 {
		id := fmt.Sprintf("race-%d", i)
		if _, err := b.CreateSession(id, buffer.SessionMeta{Origin: policy.Adopted}); err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		wg.Add(2)
		go func() {
			defer wg.Done()
			time.Sleep(time.Duration(i%6) * 300 * time.Microsecond)
			b.Delete(id, policy.ReasonDeleted)
		}()
		go func() {
			defer wg.Done()
			_, err := a.CreateSession(id, buffer.SessionMeta{Origin: policy.Adopted})
			omu.Lock()
			outcomes[fmt.Sprint(err)]++
			omu.Unlock()
		}()
		wg.Wait()
		ids = append(ids, id)
	}
	t.Logf("A's creations: %v", outcomes)
	time.Sleep(time.Second)
	leaked := 0
	for _, id := range ids {
		sh := sessionToken(id)
		_, _, exists := b.sessions.lookup(t.Context(), sh)
		if !exists && a.interested(sh+".x") {
			leaked++
		}
	}
	if leaked > 0 {
		t.Errorf("A keeps an interest in %d of %d sessions that no longer exist", leaked, len(ids))
	}
}

// A lease whose stream's record went without it (a takeover racing its
// session's end, review 42; a session deleted where the lease was not
// seen) is not renewed for good: the renewals let it go.
func TestALeaseOutlivingItsStreamIsLetGo(t *testing.T) {
	t.Parallel()
	a := openAt(t, []string{testnet.NATS(t).ClientURL()}, func(o *Options) { o.LeaseTTL = 1500 * time.Millisecond })
	_, str, _ := callOn(t, a)
	key := str.(*stream).key
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	if err := a.streams.remove(ctx, key, 0); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the lease to go", 5*time.Second, func() bool {
		_, err := a.leases.kv.Get(ctx, key)
		return !a.holds(key) && errors.Is(err, jetstream.ErrKeyNotFound)
	})
}
