package natsstore

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/buffer"
	"github.com/mcpresume/caddy-mcp-resume/internal/testnet"
	"github.com/mcpresume/caddy-mcp-resume/policy"
)

// Review 41, attack 5: a session deleted on the producer's own replica while
// its call's lease is unwritten, as a round of the renewals runs. Delete
// lists the incarnation's leases (ending: st.leases.keysOf, where an
// unwritten lease is not) before it removes the session record and then
// the stream records (clearIncarnation). A round whose writeHeld finds the
// record live in that window writes the lease after the list was made:
//   - f5b61f7: between ending() and the session record's removal (whose
//     reaction, dropInterest, makes the mirror forget the stream record);
//   - 7075b32 (HEAD) also after it, until clearIncarnation removes the
//     stream record from KV: writeHeld reads the forgotten record through
//     from KV, finds it live and writes the lease.
//
// Nothing releases it then: the producer's end finds no record
// (producerDone), the engine does not Fail a stream whose session ended
// (resume/tap.go fail: reason ""), and no sweep finds a record of the
// incarnation to clear. The lease is renewed for as long as the replica
// lives. Before baec54a the lease was written with the stream, so Delete's
// list had it (0 leaks at 1feefef with this load). (The leak after a Delete on
// another replica is pre-existing and known; this one is on the producer's
// own replica.)
func TestReview41DeleteRacingTheFirstRoundLeaksTheLease(t *testing.T) {
	t.Parallel()
	urls := []string{testnet.NATS(t).ClientURL()}
	mod := func(o *Options) { o.LeaseTTL = time.Second } // rounds every 333ms
	b := openAt(t, urls, mod)
	waitUntil(t, "B to sweep", 10*time.Second, func() bool { return b.sweeps() })
	a := openAt(t, urls, mod)
	const workers, rounds = 32, 20
	var mu sync.Mutex
	var keys []string
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range rounds {
				id := fmt.Sprintf("del-%d-%d", w, i)
				s, err := a.CreateSession(id, buffer.SessionMeta{})
				if err != nil {
					t.Error(err)
					return
				}
				str, p, r, err := s.(*session).OpenCall(context.Background(), []string{"1"}, [32]byte{1})
				if err != nil {
					t.Error(err)
					return
				}
				_ = r
				mu.Lock()
				keys = append(keys, str.(*stream).key)
				mu.Unlock()
				time.Sleep(time.Duration(rand.IntN(340)) * time.Millisecond)
				a.Delete(id, policy.ReasonDeleted)
				// The engine: the producer's context ends with the session,
				// its tap ends (no Fail: the session is gone), Done.
				<-p.Context().Done()
				p.Done()
			}
		}()
	}
	wg.Wait()
	time.Sleep(2 * time.Second) // rounds to write what they would
	leaked := 0
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	for _, key := range keys {
		held := a.holds(key)
		_, err := b.leases.kv.Get(ctx, key)
		if held || err == nil {
			leaked++
			t.Logf("%s: held by A %v, in KV %v", key, held, err == nil)
		}
	}
	if leaked > 0 {
		time.Sleep(5 * time.Second)
		still := 0
		for _, key := range keys {
			if a.holds(key) {
				still++
			}
		}
		t.Fatalf("%d of %d calls of deleted sessions still have their lease renewed (%d still held by A 5s later)",
			leaked, len(keys), still)
	}
}
