package natsstore

// The producer role (buffer.Producer) on a shared store: a stream's
// producer is the replica holding its lease, and on that replica one
// routine (the tap reading the upstream response). The handover is what
// keeps the upstream from ever seeing two of a stream's responses open
// through the proxy:
//
//   - On this replica, a producer asked to stop (its session ended, its
//     runtime drains) is waited for until Done: its upstream response is
//     closed. The standalone stream's role is the session's (its token),
//     so that covers a producer of an ended incarnation too.
//   - Across replicas, the lease decides. A holder releases it only once
//     Done, so a taker that creates the lease knows the old GET is closed;
//     a holder that cannot renew its standalone lease stops itself at 2/3
//     of lease_ttl (fenceAfter), before the lease can lapse, so a taker
//     that creates a lapsed lease knows the same (the holder died, or is cut
//     off and closed its GET). A holder frozen past its lease (SIGSTOP, a
//     paused VM) cannot stop itself, though: its GET stays open until it
//     runs again, finds the lease gone (its fence is overdue, its renewal
//     fails) and closes it. So a producer that took a lapsed lease says so
//     (buffer.Lapsed), and the upstream's 409 soon after is the proxy's own
//     (resume/standalone.go). A standalone lease of an ended incarnation
//     is left to its holder (clearIncarnation), and the next incarnation's
//     producer waits for it to go.

import (
	"context"
	"errors"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/mcpresume/caddy-mcp-resume/buffer"
	"github.com/mcpresume/caddy-mcp-resume/policy"
)

// producer is a buffer.Producer of this replica.
type producer struct {
	ctx    context.Context
	cancel context.CancelFunc
	done   chan struct{}
	once   sync.Once
	gone   func() // runs once, at Done
	lapsed bool   // the lease was taken from a holder that did not release it
}

func (p *producer) Context() context.Context { return p.ctx }
func (p *producer) Lapsed() bool             { return p.lapsed }
func (p *producer) Stop()                    { p.cancel() }

func (p *producer) Done() {
	p.once.Do(func() {
		p.cancel()
		p.gone()
		close(p.done)
	})
}

// localProducers are this replica's producer roles, at most one per key:
// a request stream's key, or a session token for its standalone stream.
type localProducers struct {
	mu sync.Mutex
	m  map[string]*producer
}

// take registers a producer of key, waiting (bounded by ctx) for a holder
// asked to stop; ErrProducing while the holder runs. The producer's gone
// is set by the caller once the role is complete (lease taken); until
// then abandon undoes the take.
func (lp *localProducers) take(ctx, parent context.Context, key string) (*producer, error) {
	for {
		lp.mu.Lock()
		cur := lp.m[key]
		if cur == nil {
			p := &producer{done: make(chan struct{})}
			p.ctx, p.cancel = context.WithCancel(parent)
			if lp.m == nil {
				lp.m = make(map[string]*producer)
			}
			lp.m[key] = p
			lp.mu.Unlock()
			return p, nil
		}
		lp.mu.Unlock()
		if cur.ctx.Err() == nil {
			return nil, buffer.ErrProducing
		}
		select {
		case <-cur.done:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// drop forgets p as the producer of key.
func (lp *localProducers) drop(key string, p *producer) {
	lp.mu.Lock()
	if lp.m[key] == p {
		delete(lp.m, key)
	}
	lp.mu.Unlock()
}

// abandon undoes a take whose role could not be completed.
func (lp *localProducers) abandon(key string, p *producer) {
	lp.drop(key, p)
	p.cancel()
	close(p.done)
}

// running reports whether a producer of key is registered and not done.
func (lp *localProducers) running(key string) *producer {
	lp.mu.Lock()
	defer lp.mu.Unlock()
	return lp.m[key]
}

// fenceAfter is how long a standalone producer goes on without a renewed
// lease before it stops itself: the lease cannot lapse (and another
// replica cannot open the next GET) before its GET is closed.
func (st *Store) fenceAfter() time.Duration { return st.opts.LeaseTTL * 2 / 3 }

// TakeProducer implements buffer.Stream.
func (s *stream) TakeProducer(ctx context.Context) (buffer.Producer, error) {
	st := s.sess.st
	if s.sess.gone() {
		return nil, buffer.ErrSessionGone
	}
	s.markOpened()
	key := s.key
	if s.kind == policy.StandaloneStream {
		key = s.sess.sh
	} else if !st.holds(s.key) {
		return nil, buffer.ErrProducing // a request stream's producer is the replica that opened it (or took it over: TakeOver)
	}
	p, err := st.local.take(ctx, s.sess.ctx, key)
	if err != nil {
		return nil, err
	}
	if s.kind == policy.RequestStream {
		st.onLost(s.key, p.Stop)
		s.fenceRequest(p)
	}
	if s.kind == policy.StandaloneStream {
		if err := st.awaitEarlierStandalone(ctx, s.sess.sh, s.sess.epoch); err != nil {
			st.local.abandon(key, p)
			return nil, err
		}
		lapsed := st.lapsedLease(ctx, s.key) // before acquire writes the key
		ok, _ := st.acquire(s.key, p.Stop)
		p.lapsed = ok && lapsed
		if !ok {
			st.local.abandon(key, p)
			return nil, buffer.ErrProducing
		}
		st.fence(s.key, p.Stop)
		s.dropIdleWriter() // another replica may have produced it since: start from what is stored
	}
	p.gone = func() {
		st.local.drop(key, p)
		s.producerDone()
	}
	s.producing.Store(true)
	return p, nil
}

// producerDone ends this replica's production of the stream. The
// standalone stream's lease goes once what the producer appended is
// stored, so a reader that sees the lease gone and the subject read to
// its end has everything, and the next producer finds the upstream cursor
// of exactly that (a note no batch carried is recorded first).
func (s *stream) producerDone() {
	s.producing.Store(false)
	w := s.currentWriter()
	if s.kind == policy.StandaloneStream && w != nil {
		w.waitStored(s.sess.st.endTimeout())
	}
	if w != nil {
		w.recordNote() // before the lease goes: the next producer resumes from it
	}
	if s.kind == policy.StandaloneStream {
		s.sess.st.release(s.key)
	} else if s.fenced.Swap(false) {
		// A request stream's producer that stopped itself (fenceRequest)
		// lets the lease go, so the call is taken over (here too) as soon
		// as NATS is back, not only once the lease lapsed.
		go s.sess.st.release(s.key)
	} else if rec, ok := s.record(); ok && rec.State == policy.Live && s.sess.st.holds(s.key) {
		// Done with the stream unended (its end is written with the
		// lease's release otherwise): no upstream response feeds it any
		// more, so the role goes now. Kept, the renewals would go on for a
		// stream no one produces, and neither a takeover (this replica's
		// own included) nor the sweeper's failure could ever come: its
		// clients would wait in silence.
		go s.sess.st.release(s.key)
	}
	s.changed.fire()
}

// lapsedLease reports whether the lease of key was last held by another
// replica and went unreleased: its TTL expired. This replica's mirror says
// so if it saw the lease held; a replica that took an interest in the
// session only now reads what the bucket holds at the key: an expiry's
// marker (Nats-Marker-Reason MaxAge), where a release leaves a purge.
func (st *Store) lapsedLease(ctx context.Context, key string) bool {
	if prev := st.leases.unreleased(key); prev != nil {
		return prev.Replica != st.opts.ReplicaID
	}
	kv, err := st.kvStream(st.names.leases)
	if err != nil {
		return false
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	m, err := kv.GetLastMsgForSubject(ctx, "$KV."+st.names.leases+"."+key)
	return err == nil && m.Header.Get("KV-Operation") == "" && m.Header.Get(jetstream.MarkerReasonHeader) == "MaxAge"
}

// isStandaloneKey reports whether a stream (or lease) key is a standalone
// stream's.
func isStandaloneKey(key string) bool {
	_, num, ok := splitStreamKey(key)
	return ok && num == policy.StandaloneNum
}

// standaloneLeased returns the key of a standalone lease of session token
// sh held for another epoch than epoch ("" for none), as this replica's
// mirror has it.
func (st *Store) standaloneLeased(ctx context.Context, sh, epoch string) string {
	var found []string
	st.leases.each(func(key string, _ *leaseRecord, _ uint64) {
		if strings.HasPrefix(key, sh+".") && isStandaloneKey(key) && key != streamKey(sh, epoch, policy.StandaloneNum) {
			found = append(found, key)
		}
	})
	for _, key := range found {
		if st.leased(ctx, key) { // a lease that lapsed unseen is read again
			return key
		}
	}
	return ""
}

// awaitEarlierStandalone waits, bounded by ctx, until no replica holds the
// standalone lease of another incarnation of session token sh: its GET is
// closed (released) or its holder stopped itself (lapsed).
func (st *Store) awaitEarlierStandalone(ctx context.Context, sh, epoch string) error {
	for wait := 10 * time.Millisecond; ; wait = min(2*wait, 250*time.Millisecond) {
		if st.standaloneLeased(ctx, sh, epoch) == "" {
			return nil
		}
		if !sleepCtx(ctx, wait) {
			return ctx.Err()
		}
	}
}

// StandaloneClosed implements buffer.Store.
func (st *Store) StandaloneClosed(ctx context.Context, id string) error {
	sh := sessionToken(id)
	for {
		p := st.local.running(sh)
		if p == nil {
			break
		}
		select {
		case <-p.done:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	err := st.awaitEarlierStandalone(ctx, sh, "")
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		return err
	}
	return nil
}
