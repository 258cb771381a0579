package natsstore

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/buffer"
	"github.com/mcpresume/caddy-mcp-resume/policy"
)

// The bounds, as this store counts them:
//   - a stream holds the framed bytes of its events from its floor to its
//     head, counting what its producer has accepted and not yet stored;
//   - a session holds the sum over its streams: exact for the streams this
//     replica produces, as recorded (every 64 KiB) for the others;
//   - the total is what JetStream stores (messages with their headers,
//     including events below a floor that share a message with retained
//     ones), plus what this replica has accepted and not yet stored.
//     JetStream enforces it for real (MaxBytes, DiscardNew): a publish into
//     a full stream is refused and retried, never evicts.
// policy.DecideAppend decides on these figures, as it does for the memory
// store.

// pollInterval bounds a blocked append's wait between decisions: room
// freed on another replica is seen through the mirrors, but the total is
// read from JetStream.
const pollInterval = 250 * time.Millisecond

// tryAppend decides one append of the first of es: it appends (wait nil,
// err nil), refuses (wait nil, err set), or returns how to wait before
// deciding again. Once it appends, the rest of es follow under the same
// hold of the lock while each is decided an append as the first was (with
// the bytes before it counted); it returns the last seq and how many went
// in.
func (w *writer) tryAppend(es []buffer.Entry, clk *stallClock) (uint64, int, func(context.Context) error, error) {
	st, s := w.st, w.s
	var freed, changed, room <-chan struct{}
	refreshed := false
	for captured := false; ; captured = true {
		if captured {
			// Take the wake-ups before deciding again, so none is missed.
			freed, changed, room = st.freed.wait(), s.changed.wait(), w.room.wait()
		}
		rec, ok := s.record()
		if !ok || rec.State != policy.Live {
			return 0, 0, nil, buffer.ErrStreamEnded
		}
		now := time.Now()
		lim := st.Limits()
		others := w.others.get(w, clk.blocked())
		total := st.total.get(st, time.Second) + st.unstored.Load()

		w.mu.Lock()
		if err := w.usableLocked(); err != nil {
			w.mu.Unlock()
			return 0, 0, nil, err
		}
		n := int64(w.framedLen(len(es[0].Fields)))
		own := max(w.headOff-rec.FloorOff, 0)
		bud := policy.Budget{
			StreamBytes: own, StreamMax: lim.MaxStreamBytes,
			SessionBytes: own + others, SessionMax: lim.MaxSessionBytes,
			TotalBytes: total, TotalMax: lim.MaxTotalBytes,
			Attached: w.attached(rec, now),
		}
		var stalled time.Duration
		progress := now
		if clk.blocked() {
			progress = w.progressSince(rec, clk.since, now)
			stalled = now.Sub(progress)
		}
		action := policy.DecideAppend(bud, n, stalled, lim.StallTimeout)
		pipelineFull := len(w.open.lens) > 0 && len(w.open.buf)+int(n) > st.batchMax
		if action == policy.Append && !pipelineFull {
			seq, added := w.addLocked(es[0]), 1
			for ; added < len(es); added++ {
				total += n
				n = int64(w.framedLen(len(es[added].Fields)))
				own = max(w.headOff-rec.FloorOff, 0)
				bud.StreamBytes, bud.SessionBytes, bud.TotalBytes = own, own+others, total
				if policy.DecideAppend(bud, n, stalled, lim.StallTimeout) != policy.Append ||
					len(w.open.lens) > 0 && len(w.open.buf)+int(n) > st.batchMax {
					break // it decides again as an append of its own
				}
				seq = w.addLocked(es[added])
			}
			w.mu.Unlock()
			return seq, added, nil, nil
		}
		w.mu.Unlock()

		switch action {
		case policy.FailTooLarge:
			return 0, 0, nil, &buffer.FailedError{Reason: policy.ReasonTooLarge}
		case policy.Block, policy.FailStalled:
			// Room may be owed already: what the stream's own window has
			// released goes now (the sweeper does it for every stream).
			if st.evict(s.key, now) {
				continue
			}
			if !refreshed && st.total.due(100*time.Millisecond) {
				refreshed = true
				st.total.refresh(st)
				continue
			}
			if action == policy.FailStalled {
				return 0, 0, nil, &buffer.FailedError{Reason: policy.ReasonStalled}
			}
		case policy.Append:
			// The event fits; the store is not taking batches fast enough.
			// That is flow control against JetStream's acks, not a stall of
			// the log; it goes on past stall_timeout only while NATS fails,
			// and fails the stream as a full log would.
			if !clk.flowing.IsZero() && now.Sub(clk.flowing) >= lim.StallTimeout {
				return 0, 0, nil, &buffer.FailedError{Reason: policy.ReasonStalled}
			}
		}
		if !captured {
			continue
		}
		due := progress.Add(lim.StallTimeout).Sub(now)
		roomWait := action != policy.Append
		return 0, 0, func(ctx context.Context) error {
			if roomWait {
				clk.start(w)
				clk.flowing = time.Time{} // the pipeline moved, or room would not be the question
			} else {
				clk.flow()
			}
			t := time.NewTimer(min(max(due, time.Millisecond), pollInterval))
			defer t.Stop()
			select {
			case <-freed:
			case <-changed:
			case <-room:
			case <-t.C:
			case <-ctx.Done():
				return ctx.Err()
			}
			return nil
		}, nil
	}
}

// attached reports whether a client reads the stream now. A reader of this
// replica that closed is gone at once, before the record says so: its
// stream must not go on using the reserve for connected clients meanwhile.
func (w *writer) attached(rec *streamRecord, now time.Time) bool {
	e := rec.readerAt(now, w.st.opts.LeaseTTL)
	if e == nil {
		return false
	}
	return e.Replica != w.st.opts.ReplicaID || w.s.localReader() != nil
}

// progressSince is when the stall of an append blocked since blockedAt
// counts from: the client's last delivery if later, or now while a client
// is attached and has every event (it is keeping up; the window holds the
// room). A client that left with everything is not keeping up: the clock
// runs, as in the memory store.
// The record's deliveries are coalesced; a reader on this replica knows
// its own at once.
func (w *writer) progressSince(rec *streamRecord, blockedAt, now time.Time) time.Time {
	delivered, sent := rec.Delivered, rec.lastDelivery()
	attached := w.attached(rec, now)
	if r := w.s.localReader(); r != nil {
		d, at := r.progress()
		delivered, sent, attached = max(delivered, d), maxTime(sent, at), true
	}
	if attached && delivered >= w.head {
		return now // a client is here and has everything: it is keeping up
	}
	if sent.After(blockedAt) {
		return sent
	}
	return blockedAt
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// stallClock is one append's time blocked, as the memory store counts it:
// since, from when the log had no room (a backpressure stall); flowing,
// from when it began to wait only for the writer's pipeline, in a row
// (counted nowhere).
type stallClock struct{ since, flowing time.Time }

func (c *stallClock) blocked() bool { return !c.since.IsZero() }

func (c *stallClock) flow() {
	if c.flowing.IsZero() {
		c.flowing = time.Now()
	}
}

func (c *stallClock) start(w *writer) {
	if c.blocked() {
		return
	}
	c.since = time.Now()
	w.s.stalled.Store(true)
	w.s.stalls.Add(1)
	w.st.counters.Stalls.Add(1)
	if h := w.st.opts.Hooks.StallStarted; h != nil {
		h(w.s.sess.id, w.s.num)
	}
}

func (c *stallClock) stop(w *writer) {
	if !c.blocked() {
		return
	}
	waited := time.Since(c.since)
	w.s.stalled.Store(false)
	w.st.counters.StallNanos.Add(uint64(waited))
	if h := w.st.opts.Hooks.StallEnded; h != nil {
		h(w.s.sess.id, w.s.num, waited)
	}
}

// othersCache is what the other streams of a writer's session hold, summed
// again when the writer has grown by 64 KiB, a second has passed, or an
// append waits.
type othersCache struct {
	mu    sync.Mutex
	bytes int64
	atOff int64
	at    time.Time
	grown atomic.Int64 // the writer's byte count, readable without its lock
}

func (c *othersCache) get(w *writer, fresh bool) int64 {
	off := c.grown.Load()
	c.mu.Lock()
	if !fresh && !c.at.IsZero() && off-c.atOff < 64<<10 && time.Since(c.at) < time.Second {
		b := c.bytes
		c.mu.Unlock()
		return b
	}
	c.mu.Unlock()
	st, s := w.st, w.s
	// What the session's records say (kept as they change: incIndex), but
	// this stream's, and for the live streams produced here what their
	// writers know instead.
	sum := st.incs.retained(s.sess.inc)
	if rec, ok := s.record(); ok {
		sum -= rec.retained()
	}
	for _, o := range s.sess.liveWriters() {
		if o == s {
			continue
		}
		if rec, ok := o.record(); ok && rec.State == policy.Live {
			if ow := o.currentWriter(); ow != nil {
				if n, ok := ow.retained(rec); ok {
					sum += n - rec.retained()
				}
			}
		}
	}
	sum = max(sum, 0)
	c.mu.Lock()
	c.bytes, c.atOff, c.at = sum, off, time.Now()
	c.mu.Unlock()
	return sum
}

// totalBytes caches what the events stream stores, read from JetStream at
// most once a second (or when a decision needs it fresh), plus what this
// replica has stored since.
//
// A reading can miss batches stored while it was under way, and must not
// wipe out what add counted for them: each batch stored here is kept with
// its stream sequence until a reading's last sequence covers it. A reading
// can also land before the ack of a batch it counted: add skips it. (Dropping
// them let eight streams without a client take the reserve for connected
// ones: the total read low by a quarter of max_total_bytes.)
type totalBytes struct {
	mu         sync.Mutex
	bytes      int64
	at         time.Time
	refreshing bool
	// freedGen counts purges, readGen is freedGen as the last reading
	// began: a reading older than a purge is too high, which only a
	// blocked append needs to know (an append that fits on a high total
	// fits on the true one).
	freedGen, readGen uint64
	recent            []storedBatch // stored here, not yet seen by a reading
	seen              uint64        // the last message the last reading saw
}

type storedBatch struct {
	seq   uint64
	bytes int64
}

func (t *totalBytes) get(st *Store, maxAge time.Duration) int64 {
	if t.stale(maxAge) {
		t.refresh(st)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.bytes
}

func (t *totalBytes) stale(maxAge time.Duration) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return time.Since(t.at) >= maxAge
}

// due reports whether a blocked append should read the total again: it is
// older than maxAge, or events were purged since the reading began.
func (t *totalBytes) due(maxAge time.Duration) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.readGen != t.freedGen || time.Since(t.at) >= maxAge
}

func (t *totalBytes) refresh(st *Store) {
	t.mu.Lock()
	if t.refreshing {
		t.mu.Unlock()
		return
	}
	t.refreshing = true
	gen := t.freedGen
	t.mu.Unlock()
	ctx, cancel := context.WithTimeout(st.ctx, 2*time.Second)
	info, err := st.events.Info(ctx)
	cancel()
	if err == nil {
		t.settle(int64(info.State.Bytes), info.State.LastSeq, gen)
	} else {
		t.mu.Lock()
		t.refreshing, t.at = false, time.Now() // try again in a while; keep the last figure
		t.mu.Unlock()
	}
	st.fault("stream_info", err)
}

// settle takes a reading: the stream stored bytes up to message last. The
// batches stored here after last are added to it; the others it counted.
// gen is freedGen as the reading began.
func (t *totalBytes) settle(bytes int64, last uint64, gen uint64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if last < t.seen {
		// The events stream was recreated (sequences start again): what
		// was stored before is in no reading any more.
		clear(t.recent)
		t.recent = t.recent[:0]
	}
	keep := t.recent[:0]
	for _, b := range t.recent {
		if b.seq > last {
			bytes += b.bytes
			keep = append(keep, b)
		}
	}
	clear(t.recent[len(keep):])
	t.recent = keep
	t.bytes, t.at, t.refreshing, t.seen, t.readGen = bytes, time.Now(), false, last, gen
}

// add counts a batch stored here as message seq, unless a reading that
// landed before its ack did counted it already.
func (t *totalBytes) add(seq uint64, n int64) {
	t.mu.Lock()
	if seq > t.seen {
		t.bytes += n
		t.recent = append(t.recent, storedBatch{seq, n})
	}
	t.mu.Unlock()
}

// invalidate makes the next decision read the total again: it may be too
// low (NATS refused a batch as full, or lost its data).
func (t *totalBytes) invalidate() {
	t.mu.Lock()
	t.at = time.Time{}
	t.mu.Unlock()
}

// freed notes that events were purged: the total may be too high. Only a
// blocked append reads it again for that (due); the others go on with it.
// (Invalidating here made the append after each purge wait for a stream
// info request: 0.14 of them per call with eight sessions calling, and one
// per session in churn, each costlier than a KV write.)
func (t *totalBytes) freed() {
	t.mu.Lock()
	t.freedGen++
	t.mu.Unlock()
}
