package natsstore

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// transient reports an error that may pass if the operation is retried:
// the connection is down or reconnecting, a leader is being elected, a
// reply was lost. An ambiguous failure may have succeeded; every retried
// write is made safe to repeat (message IDs, compare-and-set).
func transient(err error) bool {
	switch {
	case err == nil:
		return false
	case errors.Is(err, nats.ErrConnectionClosed), errors.Is(err, jetstream.ErrMsgIteratorClosed):
		return false
	case errors.Is(err, nats.ErrTimeout), errors.Is(err, context.DeadlineExceeded),
		errors.Is(err, nats.ErrNoResponders), errors.Is(err, jetstream.ErrNoStreamResponse),
		errors.Is(err, nats.ErrConnectionReconnecting), errors.Is(err, nats.ErrDisconnected),
		errors.Is(err, jetstream.ErrAsyncPublishTimeout), errors.Is(err, nats.ErrConnectionDraining):
		return true
	}
	var api *jetstream.APIError
	if errors.As(err, &api) {
		return api.Code == 503 || api.Code == 408 // no leader yet, or the cluster is busy
	}
	return false
}

// Error codes of the JetStream API that the store acts on.
const (
	errCodeStoreFull         = 10077 // DiscardNew and MaxBytes reached: backpressure
	errCodeWrongLastSequence = 10071
	errCodeNoPeers           = 10005 // a forming cluster: no suitable peers for placement yet
)

// isStoreFull reports a publish refused because the events stream is full.
func isStoreFull(err error) bool {
	var api *jetstream.APIError
	return errors.As(err, &api) && api.ErrorCode == errCodeStoreFull
}

// isWrongLast reports a publish refused because the subject's last message
// is not the one expected: another writer (or this one's retried publish)
// got there first.
func isWrongLast(err error) bool {
	var api *jetstream.APIError
	return errors.As(err, &api) && (api.ErrorCode == errCodeWrongLastSequence ||
		api.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant)
}

// backoff is the wait before retry round n (from 0): 10ms growing to 1s.
func backoff(n int) time.Duration {
	d := 10 * time.Millisecond
	for i := 0; i < n && d < time.Second; i++ {
		d *= 2
	}
	return min(d, time.Second)
}

// sleepCtx waits d; false if ctx ended first.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// signal wakes every waiter at once: a waiter takes the channel, then
// checks its condition, then waits on the channel; fire closes it.
type signal struct {
	mu sync.Mutex
	ch chan struct{}
}

func (s *signal) wait() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ch == nil {
		s.ch = make(chan struct{})
	}
	return s.ch
}

func (s *signal) fire() {
	s.mu.Lock()
	if s.ch != nil {
		close(s.ch)
		s.ch = nil
	}
	s.mu.Unlock()
}

// connLife is the life of the store's connection to NATS: its context is
// done once the connection is lost, which loses the acknowledgement of
// every write in flight. A write's attempt ends then (mirror.attempt),
// rather than waiting for its bound.
type connLife struct {
	mu     sync.Mutex
	cur    context.Context
	cancel context.CancelFunc
}

// ctx is the current connection's context.
func (c *connLife) ctx() context.Context {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cur == nil {
		c.cur, c.cancel = context.WithCancel(context.Background())
	}
	return c.cur
}

// lost ends the current connection's context; the next is a new one.
func (c *connLife) lost() {
	c.mu.Lock()
	if c.cancel != nil {
		c.cancel()
	}
	c.cur, c.cancel = nil, nil
	c.mu.Unlock()
}
