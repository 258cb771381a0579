package buffer_test

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/buffer"
	"github.com/mcpresume/caddy-mcp-resume/buffer/storetest"
	"github.com/mcpresume/caddy-mcp-resume/policy"
)

// Delete is synchronous in memory: when it returns, the session's readers
// are done and exactly its bytes are free.
func TestDeleteFreesAtOnce(t *testing.T) {
	st, _ := newStore(t, buffer.Options{Limits: storetest.BigLimits()})
	s := storetest.MustSession(t, st, "s1")
	a, b := storetest.MustStream(t, s, "1"), storetest.MustStream(t, s, "2")
	storetest.AppendN(t, a, 4, evSize)
	storetest.AppendN(t, b, 3, evSize)
	newStream(t, st, "s2", 2)
	r, _ := a.Attach(1)
	if st.Stats().RetainedBytes != 9*evBytes {
		t.Fatal("bytes before delete")
	}
	if !st.Delete("s1", policy.ReasonDeleted) {
		t.Fatal("Delete = false")
	}
	select {
	case <-r.Done():
	default:
		t.Fatal("reader not done when Delete returned")
	}
	if s := st.Stats(); s.RetainedBytes != 2*evBytes || s.Sessions != 1 {
		t.Fatalf("stats after delete %+v, want only s2's", s)
	}
}

// Tombstones are exact: every ended session is remembered for the TTL, up
// to the documented bound, and forgetting one early is counted.
func TestTombstonesAreExactAndBounded(t *testing.T) {
	var dropped sync.WaitGroup
	st, clk := newStore(t, buffer.Options{Limits: storetest.BigLimits(), MaxTombstones: 500,
		Hooks: buffer.Hooks{TombstoneDropped: func(string) { dropped.Done() }}})
	for i := 0; i < 500; i++ {
		id := fmt.Sprintf("s%d", i)
		storetest.MustSession(t, st, id)
		st.Delete(id, policy.ReasonExpired)
	}
	for i := 0; i < 500; i++ {
		if _, ok := st.Tombstone(fmt.Sprintf("s%d", i)); !ok {
			t.Fatalf("tombstone %d of 500 forgotten", i)
		}
	}
	dropped.Add(10)
	for i := 500; i < 510; i++ {
		id := fmt.Sprintf("s%d", i)
		storetest.MustSession(t, st, id)
		st.Delete(id, policy.ReasonExpired)
	}
	dropped.Wait()
	if _, ok := st.Tombstone("s9"); ok {
		t.Fatal("the oldest tombstones should go first")
	}
	if _, ok := st.Tombstone("s10"); !ok {
		t.Fatal("too many tombstones went")
	}
	if n := st.Counters().TombstonesDropped.Load(); n != 10 {
		t.Fatalf("TombstonesDropped = %d, want 10", n)
	}
	if n := st.Stats().Tombstones; n != 500 {
		t.Fatalf("Tombstones = %d", n)
	}
	clk.Advance(time.Hour)
	st.Sweep()
	if n := st.Stats().Tombstones; n != 0 {
		t.Fatalf("Tombstones after the TTL = %d", n)
	}
	if n := st.Counters().TombstonesDropped.Load(); n != 10 {
		t.Fatal("expiry counted as an early drop")
	}
}

// Idle expiry is exact on the store's clock, and the hook hears of each
// expired session.
func TestIdleExpiry(t *testing.T) {
	lim := storetest.BigLimits()
	lim.SessionIdleTimeout = 10 * time.Minute
	var mu sync.Mutex
	var ended []policy.Reason
	st, clk := newStore(t, buffer.Options{Limits: lim, Hooks: buffer.Hooks{
		SessionEnded: func(_ string, r policy.Reason) { mu.Lock(); ended = append(ended, r); mu.Unlock() },
	}})

	newStream(t, st, "idle", 3)
	touched := storetest.MustSession(t, st, "touched")
	r, _ := newStream(t, st, "connected", 0).Attach(1)

	clk.Advance(lim.SessionIdleTimeout - time.Second)
	touched.Touch()
	st.Sweep()
	if st.Stats().Sessions != 3 {
		t.Fatal("expired early")
	}
	clk.Advance(time.Second)
	st.Sweep()
	if _, ok := st.Session("idle"); ok {
		t.Fatal("idle session not expired")
	}
	if tomb, ok := st.Tombstone("idle"); !ok || tomb.Reason != policy.ReasonExpired {
		t.Fatalf("tombstone %+v %v", tomb, ok)
	}
	if _, ok := st.Session("touched"); !ok {
		t.Fatal("touched session expired")
	}
	if _, ok := st.Session("connected"); !ok {
		t.Fatal("connected session expired")
	}
	if st.Stats().RetainedBytes != 0 {
		t.Fatalf("RetainedBytes = %d", st.Stats().RetainedBytes)
	}
	clk.Advance(lim.SessionIdleTimeout)
	st.Sweep()
	if _, ok := st.Session("touched"); ok {
		t.Fatal("touched session outlived its idle timeout")
	}
	if _, ok := st.Session("connected"); !ok {
		t.Fatal("a session with a client connected expired")
	}
	// Once the client leaves, the idle clock starts from then.
	r.Close()
	clk.Advance(lim.SessionIdleTimeout - time.Second)
	st.Sweep()
	if _, ok := st.Session("connected"); !ok {
		t.Fatal("expired before its idle timeout after disconnect")
	}
	clk.Advance(time.Second)
	st.Sweep()
	if _, ok := st.Session("connected"); ok {
		t.Fatal("not expired after disconnect + idle timeout")
	}
	mu.Lock()
	defer mu.Unlock()
	if len(ended) != 3 || ended[0] != policy.ReasonExpired {
		t.Fatalf("SessionEnded hooks: %v", ended)
	}
}

// Close ends every session: readers end, nothing is held.
func TestCloseStore(t *testing.T) {
	st := buffer.NewMemoryStore(buffer.Options{Limits: storetest.BigLimits()})
	str := newStream(t, st, "s1", 2)
	r, _ := str.Attach(3)
	done := storetest.Async(func() error { _, err := storetest.ReadAll(t, r); return err })
	st.Close()
	var fe *buffer.FailedError
	if err := <-done; !errors.Is(err, buffer.ErrSessionGone) && !(errors.As(err, &fe) && fe.Reason == policy.ReasonDeleted) {
		t.Fatalf("reader after Close: %v", err)
	}
	if s := st.Stats(); s.Sessions != 0 || s.RetainedBytes != 0 {
		t.Fatalf("stats after close %+v", s)
	}
	assertNoEarlyEviction(t, st)
}
