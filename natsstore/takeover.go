package natsstore

// Taking a request stream over from a producer that died (DESIGN.md,
// "Takeover"): the lease, a writer that starts from what is stored, the
// record told what was answered and who produces the stream now, and the
// fence that keeps the old producer out.

import (
	"context"
	"errors"
	"strconv"

	"github.com/nats-io/nats.go"

	"github.com/mcpresume/caddy-mcp-resume/buffer"
	"github.com/mcpresume/caddy-mcp-resume/policy"
)

// takeOver makes this replica the producer of the live request stream s,
// whose producer's lease lapsed, and returns the replica that produced it
// before. The lease decides: if another replica holds it, ErrProducing.
// lost runs if another replica holds the lease later.
func (s *stream) takeOver(lost func()) (previous string, err error) {
	st := s.sess.st
	ok, err := st.acquire(s.key, lost)
	if err != nil {
		return "", err
	}
	if !ok {
		return "", buffer.ErrProducing
	}
	defer func() {
		if err != nil {
			st.release(s.key)
		}
	}()
	for range 3 {
		// A writer this replica had (it produced the stream before, and was
		// cut off) stores nothing more: the fence below refuses it.
		s.dropWriter(errSuperseded)
		w, err := s.writer()
		if err != nil {
			return "", err
		}
		w.mu.Lock()
		head, off, expect, ended, upstream := w.head, w.headOff, w.lastMsg, w.ending, w.upstream
		w.mu.Unlock()
		if ended {
			return "", buffer.ErrStreamEnded
		}
		if previous, err = s.recordTakeover(expect); err != nil {
			return "", err
		}
		msg := takeoverMarker(s.subject, head, off, st.opts.ReplicaID, upstream)
		id := s.key + ".takeover." + st.opts.ReplicaID + "." + strconv.FormatUint(expect, 10)
		seq, err := st.publishAfter(msg, id, expect, func() error { return nil }, nil)
		if errors.Is(err, errConflict) {
			continue // stored after what the writer loaded: the old producer's last batch, or the sweeper's end
		}
		if err != nil {
			return "", err
		}
		w.mu.Lock()
		w.lastMsg = seq
		w.ids = s.key + ".t" + strconv.FormatUint(seq, 10)
		w.mu.Unlock()
		st.keepLease(s.key, s.producing.Load)
		return previous, nil
	}
	return "", errConflict
}

// errSuperseded stops a writer whose stream another producer took over:
// what it accepted and did not store is asked of the upstream again by its
// successor, so it is not lost.
var errSuperseded = errors.New("natsstore: another producer took the stream over")

// dropWriter stops and forgets this replica's writer of the stream, if any,
// so the next one learns the stream afresh from what is stored.
func (s *stream) dropWriter(why error) {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	s.mu.Lock()
	w := s.w
	s.w = nil
	s.mu.Unlock()
	// Opened here or not, others may have stored to it since (the sweeper,
	// a takeover while this replica was cut off): the next writer reads
	// where it stands from JetStream, not from this replica's memory.
	s.fresh.Store(false)
	if w != nil {
		w.mu.Lock()
		w.superseded = true
		w.mu.Unlock()
		w.stop(why)
	}
}

// recordTakeover writes into the stream record that this replica produces
// it now, with the answers stored (up to message sequence upTo) after the
// record last heard of them, so the stream's view says which requests still
// wait. It returns the producer the record named before.
func (s *stream) recordTakeover(upTo uint64) (previous string, err error) {
	st := s.sess.st
	ctx, cancel := st.opCtx()
	defer cancel()
	rec, _, ok := st.streams.get(s.key)
	if !ok {
		return "", buffer.ErrSessionGone
	}
	answered, err := st.answersAfter(ctx, s.subject, rec.Synced+1, upTo)
	if err != nil {
		return "", err
	}
	_, err = st.streams.update(ctx, s.key, func(r *streamRecord) error {
		if r.State != policy.Live {
			return buffer.ErrStreamEnded
		}
		previous = r.Producer
		for id, seq := range answered {
			r.answer(id, seq)
		}
		r.Producer = st.opts.ReplicaID
		return nil
	})
	if errors.Is(err, errNotFound) {
		return "", buffer.ErrSessionGone
	}
	return previous, err
}

// answersAfter returns the answers the messages of subject from message
// sequence from to upTo carry, by request id.
func (st *Store) answersAfter(ctx context.Context, subject string, from, upTo uint64) (map[string]uint64, error) {
	answered := make(map[string]uint64)
	for from <= upTo {
		m, _, err := st.nextMsg(ctx, subject, from)
		if err != nil {
			return nil, err
		}
		if m == nil || m.seq > upTo {
			break
		}
		for _, a := range m.answers {
			answered[a.id] = a.seq
		}
		from = m.seq + 1
	}
	return answered, nil
}

// takeoverMarker is the fence a new producer stores first: an empty
// message after the head, carrying the upstream cursor of what is stored.
func takeoverMarker(subject string, head uint64, off int64, replica, upstream string) *nats.Msg {
	msg := nats.NewMsg(subject)
	msg.Header.Set(hdrFirst, strconv.FormatUint(head+1, 10))
	msg.Header.Set(hdrOff, strconv.FormatInt(off, 10))
	msg.Header.Set(hdrTakeover, replica)
	if upstream != "" {
		msg.Header.Set(hdrUpstream, upstream)
	}
	return msg
}

// takenOver reports whether another replica took the stream over from this
// one (its record, read from KV, names another producer): a publish of
// this replica's that another's stored after is then no loss. It asks
// again while KV does not answer (this replica may just be back from a
// partition), and at worst falls back on the mirror.
func (s *stream) takenOver() bool {
	st := s.sess.st
	for round := 0; round < 3; round++ {
		ctx, cancel := st.opCtx()
		_, _, err := st.streams.fetch(ctx, s.key)
		cancel()
		if err == nil || errors.Is(err, errNotFound) || !sleepCtx(st.ctx, backoff(round)) {
			break
		}
	}
	rec, ok := s.record()
	return ok && rec.Kind == policy.RequestStream && rec.Producer != "" && rec.Producer != st.opts.ReplicaID
}

// TakeOver implements buffer.Takeover. The role is a producer of this
// replica's registry (producer.go), as TakeProducer's: a producer here
// asked to stop is waited for, bounded by ctx; one that runs keeps the role.
func (s *stream) TakeOver(ctx context.Context) (buffer.Producer, buffer.Succession, error) {
	st := s.sess.st
	if s.kind != policy.RequestStream || s.sess.gone() {
		return nil, buffer.Succession{}, buffer.ErrStreamEnded
	}
	if st.holds(s.key) {
		return nil, buffer.Succession{}, buffer.ErrProducing // this replica's producer has not let go
	}
	p, err := st.local.take(ctx, s.sess.ctx, s.key)
	if err != nil {
		return nil, buffer.Succession{}, err
	}
	prev, err := s.takeOver(p.Stop)
	if err != nil {
		st.local.abandon(s.key, p)
		return nil, buffer.Succession{}, err
	}
	s.fenceRequest(p)
	p.gone = func() {
		st.local.drop(s.key, p)
		s.producerDone()
	}
	s.producing.Store(true)
	return p, buffer.Succession{Previous: prev, Current: st.opts.ReplicaID}, nil
}

// fenceRequest makes the producer p of request stream s stop itself when
// its lease went unrenewed for fenceAfter (this replica cut off from NATS),
// if what is stored of the stream carries an upstream cursor: then another
// replica can take the call over once the lease lapses, and must find the
// upstream's response closed. (Without a cursor none can: p reads on, and
// stores what it read once NATS is back, as before.) A producer so stopped
// gives its lease up as it ends, so the call is taken over at once if NATS
// comes back before the lease lapsed.
func (s *stream) fenceRequest(p *producer) {
	st := s.sess.st
	st.fence(s.key, func() {
		if s.storedCursor() {
			s.fenced.Store(true)
			p.Stop()
		}
	})
}

// storedCursor reports whether what is stored of the stream carries an
// upstream cursor: its record's, or the last message this replica stored.
func (s *stream) storedCursor() bool {
	if rec, ok := s.record(); ok && rec.Upstream != "" {
		return true
	}
	w := s.currentWriter()
	if w == nil {
		return false
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.storedUp != ""
}

var _ buffer.Takeover = (*stream)(nil)
