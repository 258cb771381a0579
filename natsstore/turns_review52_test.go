package natsstore

import (
	"context"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Many takers of a few keys, some whose contexts end while they wait (or
// as their turn comes): at most one holder per key at any time, every
// taker that got nil held the key alone, and no turn is left behind.
func TestKeyTurnsStressReview52(t *testing.T) {
	var k keyTurns
	keys := []string{"a", "b", "c"}
	var holders [3]atomic.Int32
	var wg sync.WaitGroup
	var took, gaveUp atomic.Int64
	for g := range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(g), 7))
			for range 300 {
				i := r.IntN(len(keys))
				ctx, cancel := context.WithTimeout(context.Background(), time.Duration(r.IntN(3000))*time.Microsecond)
				err := k.take(ctx, keys[i])
				cancel()
				if err != nil {
					gaveUp.Add(1)
					continue
				}
				took.Add(1)
				if n := holders[i].Add(1); n != 1 {
					t.Errorf("%d holders of %s", n, keys[i])
				}
				if r.IntN(4) == 0 {
					time.Sleep(time.Duration(r.IntN(50)) * time.Microsecond)
				}
				holders[i].Add(-1)
				k.done(keys[i])
			}
		}()
	}
	wg.Wait()
	t.Logf("took %d, gave up %d", took.Load(), gaveUp.Load())
	k.mu.Lock()
	defer k.mu.Unlock()
	if len(k.busy) != 0 {
		t.Fatalf("turns left behind: %v", k.busy)
	}
}

// An update whose write hangs (its acknowledgement lost) holds the key's
// turn: a waiter on the key ends with its own context, not later, and a
// later one gets the turn and writes on top of the first's outcome.
func TestKeyTurnHeldByAHangingWriteReview52(t *testing.T) {
	st := openEmbedded(t, testLimits())
	key := streamRecordKey(t, st, "turns52")
	orig := st.streams.write
	if orig == nil {
		t.Fatal("the embedded store has no write hook to hang")
	}
	var hung atomic.Bool
	entered := make(chan struct{})
	st.streams.write = func(ctx context.Context, k string, v []byte, rev uint64, tag string) (uint64, error) {
		if k == key && hung.CompareAndSwap(false, true) {
			close(entered)
			<-ctx.Done() // never acknowledged
			return 0, ctx.Err()
		}
		return orig(ctx, k, v, rev, tag)
	}
	holder := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		_, err := st.streams.update(ctx, key, func(r *streamRecord) error {
			r.Tail = append(r.Tail, tailEntry{ID: "holder"})
			return nil
		})
		holder <- err
	}()
	<-entered
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	began := time.Now()
	_, err := st.streams.update(ctx, key, func(r *streamRecord) error {
		r.Tail = append(r.Tail, tailEntry{ID: "short"})
		return nil
	})
	cancel()
	if took := time.Since(began); err == nil || took > 1500*time.Millisecond {
		t.Fatalf("short waiter: %v after %v", err, took)
	}
	ctx2, cancel2 := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel2()
	_, err = st.streams.update(ctx2, key, func(r *streamRecord) error {
		r.Tail = append(r.Tail, tailEntry{ID: "late"})
		return nil
	})
	if err != nil {
		t.Fatalf("late waiter: %v", err)
	}
	t.Logf("holder: %v; late waited %v", <-holder, time.Since(began))
	r, _, _ := st.streams.get(key)
	var ids []string
	for _, e := range r.Tail {
		ids = append(ids, e.ID)
	}
	t.Logf("tail %v", ids)
	if len(ids) == 0 || ids[len(ids)-1] != "late" || len(ids) > 2 {
		t.Fatalf("record holds %v", ids)
	}
	st.streams.turns.mu.Lock()
	defer st.streams.turns.mu.Unlock()
	if len(st.streams.turns.busy) != 0 {
		t.Fatalf("turns left: %v", st.streams.turns.busy)
	}
}
