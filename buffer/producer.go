package buffer

import (
	"context"
	"errors"
	"sync"
)

// The producer role: the one routine whose upstream response feeds a
// stream. It is handed over explicitly (Stream.TakeProducer) so that the
// upstream never has two of a stream's responses open through the proxy
// at once: an upstream that allows one GET per session (the official SDK
// servers answer a second one 409) then never refuses the proxy, and a 409
// it does send is its own, for the client.

// ErrProducing is TakeProducer's answer while another producer runs and
// was not asked to stop: that one keeps the role, the caller relays what
// it appends.
var ErrProducing = errors.New("another upstream response feeds the stream")

// Producer is the producer role of a stream, as TakeProducer gave it.
type Producer interface {
	// Context ends when the producer must stop: Stop was called, its
	// session ended, or (a shared store) its lease lapsed or could not be
	// renewed in time. The producer then closes its upstream response and
	// calls Done.
	Context() context.Context
	// Stop asks the producer to stop; a TakeProducer from now on waits for
	// its Done instead of answering ErrProducing.
	Stop()
	// Done gives the role up, once the producer's upstream response is
	// closed (its body closed, its connection released) and what it
	// appended is stored: a successor may open the next one. A caught-up
	// reader of the standalone stream then ends (ErrProducerGone).
	// Calling it again does nothing.
	Done()
}

// Lapsed is implemented by a Producer of a shared store that says how its
// role was taken. From a released role (or none) the previous upstream
// response is known closed. From a lease that lapsed unreleased it is not:
// the holder stops itself before its lease can lapse, but a holder frozen
// meanwhile (SIGSTOP, a paused VM) cannot, and its upstream response stays
// open until it runs again and finds the lease gone. A 409 the upstream
// answers soon after such a take is then the proxy's own conflict.
type Lapsed interface {
	// Lapsed reports whether the role was taken from a lease that lapsed
	// while another replica held it.
	Lapsed() bool
}

// memProducer is a Producer of a MemoryStore.
type memProducer struct {
	ctx    context.Context
	cancel context.CancelFunc
	done   chan struct{}
	once   sync.Once
	gone   func() // runs once, at Done
}

func newMemProducer(parent context.Context, gone func()) *memProducer {
	p := &memProducer{done: make(chan struct{}), gone: gone}
	p.ctx, p.cancel = context.WithCancel(parent)
	return p
}

func (p *memProducer) Context() context.Context { return p.ctx }
func (p *memProducer) Stop()                    { p.cancel() }

func (p *memProducer) Done() {
	p.once.Do(func() {
		p.cancel()
		p.gone()
		close(p.done)
	})
}

// producers are a MemoryStore's producer roles, at most one per key: a
// request stream (its *memStream) or a session's standalone stream (its
// session ID: the upstream allows one GET per session, whichever
// incarnation of the session the store holds).
type producers struct {
	mu sync.Mutex
	m  map[any]*memProducer
}

// take gives the role of key to the caller: at once if none holds it,
// after its Done if the holder was asked to stop (bounded by ctx), never
// while the holder runs (ErrProducing). parent bounds the new producer;
// gone runs at its Done.
func (ps *producers) take(ctx, parent context.Context, key any, gone func()) (*memProducer, error) {
	for {
		ps.mu.Lock()
		cur := ps.m[key]
		if cur == nil {
			var p *memProducer
			p = newMemProducer(parent, func() {
				ps.mu.Lock()
				if ps.m[key] == p {
					delete(ps.m, key)
				}
				ps.mu.Unlock()
				gone()
			})
			if ps.m == nil {
				ps.m = make(map[any]*memProducer)
			}
			ps.m[key] = p
			ps.mu.Unlock()
			return p, nil
		}
		ps.mu.Unlock()
		if cur.ctx.Err() == nil {
			return nil, ErrProducing
		}
		select {
		case <-cur.done:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// await waits until none holds the role of key, bounded by ctx.
func (ps *producers) await(ctx context.Context, key any) error {
	for {
		ps.mu.Lock()
		cur := ps.m[key]
		ps.mu.Unlock()
		if cur == nil {
			return nil
		}
		select {
		case <-cur.done:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}
