package natsstore

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/buffer"
)

// Updates of one key made at once by one replica (a call's end and its
// client's leaving) are written one after the other, each on the revision
// the one before wrote: none is refused by the compare-and-set and made
// again, which cost a refused write and a read more each.
func TestUpdatesOfAKeyFromOneReplicaTakeTurns(t *testing.T) {
	st := openEmbedded(t, testLimits())
	tap := newWiretap(t, st)
	key := streamRecordKey(t, st, "turns")
	tap.since()
	const writers = 8
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if _, err := st.streams.update(ctx, key, func(r *streamRecord) error {
				r.Tail = append(r.Tail, tailEntry{ID: fmt.Sprint(i)})
				return nil
			}); err != nil {
				t.Error(err)
			}
		}()
	}
	close(start)
	wg.Wait()
	if got := tap.since()["kv write streams"]; got != writers {
		t.Errorf("%d updates made %d writes of the record", writers, got)
	}
	r, _, _ := st.streams.get(key)
	if len(r.Tail) != writers {
		t.Errorf("the record holds %d of the %d updates: %+v", len(r.Tail), writers, r.Tail)
	}
}

// A turn passes in order, and a waiter whose context ends leaves the queue.
func TestKeyTurns(t *testing.T) {
	var k keyTurns
	ctx := context.Background()
	if err := k.take(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if err := k.take(ctx, "b"); err != nil { // another key: no wait
		t.Fatal(err)
	}
	got := make(chan int, 3)
	cctx, cancel := context.WithCancel(ctx)
	gave := make(chan error, 1)
	go func() { gave <- k.take(cctx, "a") }()
	waitQueued(t, &k, "a", 1)
	for i := 1; i <= 2; i++ {
		go func() {
			if k.take(ctx, "a") == nil {
				got <- i
				k.done("a")
			}
		}()
		waitQueued(t, &k, "a", i+1)
	}
	cancel()
	if err := <-gave; err == nil {
		t.Fatal("a waiter whose context ended took the turn")
	}
	k.done("a")
	if a, b := <-got, <-got; a != 1 || b != 2 {
		t.Fatalf("turns taken as %d, %d", a, b)
	}
	k.done("b")
	waitQueued(t, &k, "a", -1)
}

// waitQueued waits for n waiters at key (-1: the key free).
func waitQueued(t *testing.T, k *keyTurns, key string, n int) {
	t.Helper()
	waitUntil(t, fmt.Sprintf("%d waiting at %s", n, key), 5*time.Second, func() bool {
		k.mu.Lock()
		defer k.mu.Unlock()
		tu, ok := k.busy[key]
		if n < 0 {
			return !ok
		}
		return ok && len(tu.waiting) == n
	})
}

// streamRecordKey opens session id on st with one request stream and
// returns the key of its record.
func streamRecordKey(t *testing.T, st *Store, id string) string {
	t.Helper()
	sess, err := st.CreateSession(id, buffer.SessionMeta{Version: "2025-06-18"})
	if err != nil {
		t.Fatal(err)
	}
	str, err := sess.NewStream([]string{"1"}, [32]byte{1})
	if err != nil {
		t.Fatal(err)
	}
	return str.(*stream).key
}
