package buffer

import (
	"context"
	"sync"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/policy"
)

// budget counts the bytes every log holds against the stream, session and
// total bounds, so a bound check and the reservation that follows are one
// step. Its mutex is the last in the lock order (see MemoryStore).
type budget struct {
	mu    sync.Mutex
	total int64
	freed chan struct{} // closed (and replaced) whenever bytes are released
}

func newBudget() budget { return budget{freed: make(chan struct{})} }

// take adds n bytes to a stream (and its session) unconditionally: signals,
// which bypass the bounds.
func (b *budget) take(s *memStream, n int64) {
	b.mu.Lock()
	s.bytes += n
	s.sess.bytes += n
	b.total += n
	b.mu.Unlock()
}

// release returns n bytes of a stream and wakes blocked appenders.
func (b *budget) release(s *memStream, n int64) {
	if n == 0 {
		return
	}
	b.mu.Lock()
	s.bytes -= n
	s.sess.bytes -= n
	b.total -= n
	close(b.freed)
	b.freed = make(chan struct{})
	b.mu.Unlock()
}

// wake wakes blocked appenders to decide again (a bound may have grown).
func (b *budget) wake() {
	b.mu.Lock()
	close(b.freed)
	b.freed = make(chan struct{})
	b.mu.Unlock()
}

// reserve takes size bytes for a stream, blocking while the policy says so.
// Before it blocks it evicts what the stream's own window has released,
// since room may be owed already; the sweeper does the same for every
// stream within about a second. The stall clock runs only while the
// stream's client has undelivered events and delivers none of them: a
// reader at full speed that waits for the window to release room is being
// slowed down, not stalled.
func (st *MemoryStore) reserve(ctx context.Context, s *memStream, size int64) error {
	b := &st.budget
	var blockedAt time.Time
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
		if !blockedAt.IsZero() {
			waited := st.now().Sub(blockedAt)
			s.stalled.Store(false)
			st.counters.StallNanos.Add(uint64(waited))
			if h := st.opts.Hooks.StallEnded; h != nil {
				h(s.sess.id, s.num, waited)
			}
		}
	}()
	for {
		st.reserveRounds.Add(1)
		lim := st.Limits()
		now := st.now()
		var stalled time.Duration
		if !blockedAt.IsZero() {
			stalled = now.Sub(s.progressSince(blockedAt, now))
		}
		b.mu.Lock()
		bud := policy.Budget{
			StreamBytes: s.bytes, StreamMax: lim.MaxStreamBytes,
			SessionBytes: s.sess.bytes, SessionMax: lim.MaxSessionBytes,
			TotalBytes: b.total, TotalMax: lim.MaxTotalBytes,
			Attached: s.attached.Load(),
		}
		action := policy.DecideAppend(bud, size, stalled, lim.StallTimeout)
		if action == policy.Append {
			s.bytes += size
			s.sess.bytes += size
			b.total += size
			b.mu.Unlock()
			return nil
		}
		freed := b.freed
		b.mu.Unlock()
		if action == policy.FailTooLarge {
			return &FailedError{Reason: policy.ReasonTooLarge}
		}
		if s.evict(now, lim.ResumeWindow) > 0 {
			continue
		}
		if action == policy.FailStalled {
			return &FailedError{Reason: policy.ReasonStalled}
		}
		if blockedAt.IsZero() {
			blockedAt = now
			s.stalled.Store(true)
			s.stalls.Add(1)
			st.counters.Stalls.Add(1)
			if h := st.opts.Hooks.StallStarted; h != nil {
				h(s.sess.id, s.num)
			}
		}
		// Wake when room is freed, or when the stall deadline (which moves
		// with the client's progress and with reloaded limits) is due.
		due := s.progressSince(blockedAt, now).Add(lim.StallTimeout).Sub(now)
		if timer == nil {
			timer = time.NewTimer(max(due, time.Millisecond))
		} else {
			timer.Reset(max(due, time.Millisecond))
		}
		select {
		case <-freed:
		case <-timer.C:
		case <-ctx.Done():
			return ctx.Err()
		case <-s.done:
			return ErrStreamEnded
		}
		if !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
	}
}
