package natsstore

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/internal/testnet"
)

// A release racing a renewal of the same lease removes it. The renewal
// finds its revision moved on (its last write stored, the acknowledgement
// lost) and writes again over what it finds its own; the release, which
// read the key before that write, then removed nothing, and the lease
// stayed a TTL with no holder (review 44's test failed so under the
// suite's load). Each round loses one acknowledgement on purpose: the key
// is renewed behind the held lease's back.
func TestReleaseRacingARenewalRemovesTheLease(t *testing.T) {
	t.Parallel()
	st := openAt(t, []string{testnet.NATS(t).ClientURL()}, func(o *Options) { o.LeaseTTL = time.Minute })
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for i := range 40 {
		key := fmt.Sprintf("race.e.%d", i)
		if ok, err := st.acquire(key, nil); !ok || err != nil {
			t.Fatalf("acquire %s: %v %v", key, ok, err)
		}
		st.held.mu.Lock()
		h := st.held.m[key]
		st.held.mu.Unlock()
		// A renewal stored whose acknowledgement was lost.
		if _, err := st.renew(st.names.leases, key, h.val, h.rev, time.Minute); err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		wg.Add(1)
		go func() { defer wg.Done(); st.renewHeld(h) }()
		if i%2 == 1 {
			time.Sleep(time.Duration(i*25) * time.Microsecond)
		}
		st.release(key)
		wg.Wait()
		if e, err := st.leases.kv.Get(ctx, key); err == nil {
			t.Fatalf("FAULT: round %d: the released lease is in KV at revision %d: %s", i, e.Revision(), e.Value())
		}
	}
}
