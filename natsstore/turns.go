package natsstore

import (
	"context"
	"sync"
)

// keyTurns lets this replica's updates of one key go one at a time. Two
// updates of a key from one replica at once (a call's end recorded by its
// writer while its reader, closing, records its deliveries) both start
// from the revision the mirror holds: one loses the compare-and-set and
// pays a refused write, a read of the key and the write again, three round
// trips where waiting for the other's acknowledgement costs none (the
// mirror then holds the revision it wrote). Updates of other replicas are
// still ordered by compare-and-set alone.
type keyTurns struct {
	mu   sync.Mutex
	busy map[string]*keyTurn
}

// keyTurn is a key's holder and those waiting after it, in order; a
// waiter's channel is closed when its turn comes.
type keyTurn struct {
	waiting []chan struct{}
}

var keyTurnPool = sync.Pool{New: func() any { return new(keyTurn) }}

// take waits for key's turn, or for ctx to end (an error: no turn taken).
// The caller ends its turn with done.
func (k *keyTurns) take(ctx context.Context, key string) error {
	k.mu.Lock()
	if k.busy == nil {
		k.busy = make(map[string]*keyTurn)
	}
	t := k.busy[key]
	if t == nil {
		k.busy[key] = keyTurnPool.Get().(*keyTurn)
		k.mu.Unlock()
		return nil
	}
	ch := make(chan struct{})
	t.waiting = append(t.waiting, ch)
	k.mu.Unlock()
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
	}
	k.mu.Lock()
	for i, c := range t.waiting {
		if c == ch {
			t.waiting = append(t.waiting[:i], t.waiting[i+1:]...)
			k.mu.Unlock()
			return ctx.Err()
		}
	}
	k.mu.Unlock()
	// Handed the turn as ctx ended: pass it on.
	k.done(key)
	return ctx.Err()
}

// done ends the current turn at key, handing it to the first waiter.
func (k *keyTurns) done(key string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	t := k.busy[key]
	if len(t.waiting) > 0 {
		close(t.waiting[0])
		t.waiting = t.waiting[1:]
		return
	}
	delete(k.busy, key)
	t.waiting = nil
	keyTurnPool.Put(t)
}
