package buffer

import (
	"context"
	"io"
	"sync"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/policy"
)

// memReader reads one memStream for one client connection.
type memReader struct {
	s    *memStream
	next uint64 // guarded by s.mu

	pins   []*chunk      // chunks the latest batch holds slices of; guarded by s.mu
	timer  *time.Timer   // reused for idle waits
	notify chan struct{} // capacity 1: a token tells a waiting Read to look again

	once sync.Once
	done chan struct{}
	err  error // why done closed; set before close
}

func (r *memReader) Done() <-chan struct{} { return r.done }

func (r *memReader) Next() uint64 {
	r.s.mu.Lock()
	defer r.s.mu.Unlock()
	return r.next
}

func (r *memReader) close(err error) {
	r.once.Do(func() {
		r.err = err
		close(r.done)
		r.s.sess.connected.Add(-1)
		r.s.sess.Touch()
	})
}

func (r *memReader) Close() {
	s := r.s
	s.mu.Lock()
	if s.reader == r {
		s.reader = nil
		s.attached.Store(false)
	}
	r.pins = unpin(r.pins)
	s.mu.Unlock()
	r.close(io.ErrClosedPipe)
	if r.timer != nil {
		r.timer.Stop()
	}
}

func (r *memReader) Read(ctx context.Context, dst [][]byte, maxBytes int, idle time.Duration) (Batch, error) {
	for {
		b, _, err := r.take(dst, maxBytes, false)
		if err != ErrIdle {
			return b, err
		}
		if err := r.wait(ctx, idle); err != nil {
			return Batch{}, err
		}
	}
}

// ReadReady implements ReadyReader.
func (r *memReader) ReadReady(dst [][]byte, maxBytes int) (Batch, bool, error) {
	return r.take(dst, maxBytes, true)
}

// take is one look at the log from the reader's position: the events
// ready (at most maxBytes; with ready, none if the next alone is over it,
// and more says what is left), else why there are none: the reader's end,
// or ErrIdle (Read waits then: s.waiting asks appends to wake it).
func (r *memReader) take(dst [][]byte, maxBytes int, ready bool) (b Batch, more bool, err error) {
	s := r.s
	select {
	case <-r.done:
		return Batch{}, false, r.err
	default:
	}
	s.mu.Lock()
	// The caller is done with the previous batch (its Data is valid
	// until this call): its chunks may be recycled again.
	r.pins = unpin(r.pins)
	if r.next < s.log.floor {
		// Events this reader still had to read are gone: a bug that
		// must never stay silent (the relay signals a gap).
		next, lost := r.next, s.log.floor-r.next
		s.mu.Unlock()
		return Batch{}, false, r.belowFloor(next, lost)
	}
	defer s.mu.Unlock()
	if r.next <= s.log.head {
		if ready {
			c := s.log.chunks[s.log.chunkOf(r.next)]
			if start, end := c.span(r.next); int(end-start) > maxBytes {
				return Batch{}, true, ErrIdle
			}
		}
		var data [][]byte
		var last uint64
		data, r.pins, last = s.log.readPinned(dst[:0], r.pins, true, r.next, s.log.head, maxBytes)
		b := Batch{First: r.next, Last: last, Data: data}
		r.next = last + 1
		return b, last < s.log.head, nil
	}
	switch s.state {
	case policy.Complete:
		return Batch{}, false, io.EOF
	case policy.Failed:
		return Batch{}, false, &FailedError{Reason: s.failReason}
	}
	if s.kind == policy.StandaloneStream && !s.producing.Load() {
		return Batch{}, false, ErrProducerGone
	}
	s.waiting = s.waiting || !ready
	return Batch{}, false, ErrIdle
}

// belowFloor counts and reports the lost events of a reader whose position
// next was evicted under it (lost of them), and returns ErrBelowFloor.
func (r *memReader) belowFloor(next, lost uint64) error {
	st := r.s.sess.store
	st.counters.EventsEvictedBeforeAck.Add(lost)
	if h := st.opts.Hooks.EvictedBeforeAck; h != nil {
		h(r.s.sess.id, r.s.num, next, lost)
	}
	return ErrBelowFloor
}

func (r *memReader) wait(ctx context.Context, idle time.Duration) error {
	if r.timer == nil {
		r.timer = time.NewTimer(idle)
	} else {
		r.timer.Reset(idle)
	}
	defer r.timer.Stop()
	select {
	case <-r.notify:
		return nil
	case <-r.done:
		return nil // Read returns r.err
	case <-ctx.Done():
		return ctx.Err()
	case <-r.timer.C:
		return ErrIdle
	}
}

func (r *memReader) Delivered(seq uint64) {
	s := r.s
	st := s.sess.store
	now := st.now().UnixNano()
	s.mu.Lock()
	if s.reader == r && seq > s.delivered && seq <= s.log.head {
		s.log.delivered(seq, now, st.deliveryQuantum())
		s.delivered = seq
		s.lastSent.Store(now)
	}
	s.mu.Unlock()
}
