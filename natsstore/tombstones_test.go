package natsstore

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/buffer"
	"github.com/mcpresume/caddy-mcp-resume/policy"
)

// Tombstones are kept for their TTL, at most MaxTombstones at each scan:
// forgetting one early is counted and told.
func TestTombstonesBoundedAndExpire(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var dropped []string
	st := openEmbedded(t, testLimits(), func(o *Options) {
		o.MaxTombstones = 5
		o.TombstoneTTL = 2 * time.Second
		o.Hooks.TombstoneDropped = func(id string) { mu.Lock(); dropped = append(dropped, id); mu.Unlock() }
	})
	for i := 0; i < 8; i++ {
		id := fmt.Sprintf("s%d", i)
		if _, err := st.CreateSession(id, buffer.SessionMeta{}); err != nil {
			t.Fatal(err)
		}
		st.Delete(id, policy.ReasonExpired)
	}
	st.scanNow(t) // the sweeper bounds them each scan
	if n := st.Stats().Tombstones; n != 5 {
		t.Fatalf("Tombstones = %d, want 5", n)
	}
	for i := 0; i < 8; i++ {
		if _, ok := st.Tombstone(fmt.Sprintf("s%d", i)); ok != (i >= 3) {
			t.Fatalf("tombstone s%d: %v (the oldest go first)", i, ok)
		}
	}
	mu.Lock()
	if len(dropped) != 3 || st.Counters().TombstonesDropped.Load() != 3 {
		t.Fatalf("dropped %v, counted %d", dropped, st.Counters().TombstonesDropped.Load())
	}
	mu.Unlock()
	waitUntil(t, "tombstones to expire", 10*time.Second, func() bool { return st.Stats().Tombstones == 0 })
	if _, ok := st.Tombstone("s7"); ok {
		t.Fatal("an expired tombstone is still told")
	}
	if n := st.Counters().TombstonesDropped.Load(); n != 3 {
		t.Fatal("expiry counted as an early drop")
	}
}
