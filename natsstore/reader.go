package natsstore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/mcpresume/caddy-mcp-resume/buffer"
	"github.com/mcpresume/caddy-mcp-resume/policy"
)

// reader reads one stream for one client connection, from JetStream only
// (an ordered consumer on the stream's subject, from the message holding
// its position), so it hands out nothing the store has not accepted. It is
// the stream's reader while the record names it; a record naming another
// ends it (ErrTakenOver), on whichever replica that one attached.
type reader struct {
	s  *stream
	st *Store
	id string

	once sync.Once
	done chan struct{}
	err  error // why done closed; set before close

	// The consumer: made by Read, released by Close or the stream's end.
	cmu      sync.Mutex
	started  bool
	released bool
	cons     jetstream.Consumer
	it       jetstream.MessagesContext

	// fed: the stream's writer here feeds the reader (feed.go) until it
	// cannot, and the reader goes on with a consumer.
	fed bool
	// progressed fires with each delivery; leaving says the stream's end
	// removed the reader's entry, with everything delivered (leaveWithEnd).
	progressed signal
	leaving    atomic.Bool

	// Read's own state (one Read at a time).
	msgs    chan jetstream.Msg
	pumpErr chan error
	cur     msgInfo // the message being handed out
	curData []byte
	lastMsg uint64 // stream sequence of the last message taken (or skipped)
	endErr  error  // io.EOF or *FailedError once the end is reached
	timer   *time.Timer
	asm     []byte  // the event being put together from its parts
	asmInfo msgInfo // its first part
	asmNext int     // the part it needs next (0: none under way)
	// goneTold: Read said ErrProducerGone of a request stream since its
	// last idle wait, at the stream's lease generation goneGen.
	goneTold bool
	goneGen  uint64

	mu        sync.Mutex
	next      uint64
	delivered uint64    // highest seq delivered on this connection
	sent      time.Time // when
	syncing   bool
	synced    uint64 // delivered, as last written
	lastSync  time.Time
}

var _ buffer.Reader = (*reader)(nil)

// A reader's first deliveries are written a quantum after it attached (the
// attach wrote its entry), not at once: a short call's client has
// everything by then, and its reader's close writes them all in one go.
func newReader(s *stream, id string, from uint64) *reader {
	return &reader{s: s, st: s.sess.st, id: id, next: from, done: make(chan struct{}), lastSync: time.Now()}
}

func (r *reader) Done() <-chan struct{} { return r.done }

func (r *reader) Next() uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.next
}

// progress is how far the client got on this connection, and when.
func (r *reader) progress() (uint64, time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.delivered, r.sent
}

// close ends the reader with err (first caller wins).
func (r *reader) close(err error) {
	r.once.Do(func() {
		r.err = err
		close(r.done)
	})
}

func (r *reader) Read(ctx context.Context, dst [][]byte, maxBytes int, idle time.Duration) (buffer.Batch, error) {
	for {
		select {
		case <-r.done:
			return buffer.Batch{}, r.err
		default:
		}
		rec, ok := r.s.record()
		if !ok {
			r.close(buffer.ErrSessionGone)
			continue
		}
		r.mu.Lock()
		next := r.next
		r.mu.Unlock()
		if next < rec.Floor {
			return buffer.Batch{}, r.lost(next, rec.Floor-next)
		}
		if b, ok := r.take(dst, maxBytes); ok {
			return b, nil
		}
		if r.endErr != nil {
			return buffer.Batch{}, r.endErr
		}
		if rec.State != policy.Live && next > rec.Head {
			r.endErr = endError(rec.State, rec.FailReason)
			return buffer.Batch{}, r.endErr
		}
		if r.fed {
			if err := r.fromFeed(ctx, next, idle); err != errFeedGone {
				if err != nil {
					return buffer.Batch{}, err
				}
				continue
			}
		}
		if r.msgs == nil {
			if err := r.start(rec, next); err != nil {
				return buffer.Batch{}, err
			}
			continue
		}
		changed := r.s.changed.wait()
		select {
		case m := <-r.msgs:
			if err := r.place(m); err != nil {
				return buffer.Batch{}, err
			}
			continue
		case err := <-r.pumpErr:
			return buffer.Batch{}, fmt.Errorf("natsstore: reading the stream: %w", err)
		default:
		}
		if r.s.kind == policy.StandaloneStream && r.producerGone(ctx) {
			return buffer.Batch{}, buffer.ErrProducerGone
		}
		if r.s.kind == policy.RequestStream && (!r.goneTold || r.goneGen != r.s.leaseGen.Load()) && r.producerGone(ctx) {
			// Its producer died: told once (and again after each idle
			// wait or change of the lease: a producer here that let it go
			// a moment later), so the reader's replica may take the
			// upstream read over; then this reader reads what the new
			// producer stores, or the sweeper's end.
			r.goneTold, r.goneGen = true, r.s.leaseGen.Load()
			return buffer.Batch{}, buffer.ErrProducerGone
		}
		if err := r.wait(ctx, idle, changed); err != nil {
			if errors.Is(err, buffer.ErrIdle) {
				r.goneTold = false
			}
			return buffer.Batch{}, err
		}
	}
}

// wait waits for a message, a change of the stream, the end, or idle. It
// reuses its timer as buffer's memReader.wait does; the events it waits
// for (messages, pump errors, record changes) are the JetStream reader's.
func (r *reader) wait(ctx context.Context, idle time.Duration, changed <-chan struct{}) error {
	if r.timer == nil {
		r.timer = time.NewTimer(idle)
	} else {
		r.timer.Reset(idle)
	}
	defer r.timer.Stop()
	select {
	case m := <-r.msgs:
		return r.place(m)
	case err := <-r.pumpErr:
		return fmt.Errorf("natsstore: reading the stream: %w", err)
	case <-changed:
		return nil
	case <-r.done:
		return nil // Read returns r.err
	case <-ctx.Done():
		return ctx.Err()
	case <-r.timer.C:
		return buffer.ErrIdle
	}
}

// errFeedGone: the writer's feed cannot serve the reader any more.
var errFeedGone = errors.New("natsstore: the local feed is gone")

// fromFeed places the writer's next stored message, or waits for one (or
// for the stream to change, the end, idle). errFeedGone: the feed cannot
// serve the reader any more, which goes on with a consumer from next.
func (r *reader) fromFeed(ctx context.Context, next uint64, idle time.Duration) error {
	w := r.s.currentWriter()
	if w == nil {
		r.fed = false
		return errFeedGone
	}
	// The wake-ups first, then what they would tell of: none is missed.
	room, changed := w.room.wait(), r.s.changed.wait()
	rec, ok := r.s.record()
	if !ok || rec.State != policy.Live && next > rec.Head {
		return nil // Read ends it
	}
	m, ok, usable := w.next(r, next, r.lastMsg, rec.Head)
	switch {
	case !usable:
		r.fed = false
		w.unregister(r)
		return errFeedGone
	case ok:
		return r.placeInfo(m.info, m.data)
	}
	if !r.s.producing.Load() {
		if rec, ok := r.s.record(); !ok || rec.State != policy.Live {
			// It ended since the record was read above: a producer lets go
			// only once its end is in the record, so the record read again
			// now tells, and Read ends it (no consumer for a call that
			// ended).
			return nil
		}
		// The producer here let go (cut off from NATS, it stopped before
		// its lease could lapse): the feed brings nothing more. A consumer
		// reads what a takeover or the sweeper stores, and tells of the
		// producer gone.
		r.fed = false
		w.unregister(r)
		return errFeedGone
	}
	if r.timer == nil {
		r.timer = time.NewTimer(idle)
	} else {
		r.timer.Reset(idle)
	}
	defer r.timer.Stop()
	select {
	case <-room:
	case <-changed:
	case <-r.done: // Read returns r.err
	case <-ctx.Done():
		return ctx.Err()
	case <-r.timer.C:
		return buffer.ErrIdle
	}
	return nil
}

// start creates the consumer at the message holding position next.
func (r *reader) start(rec *streamRecord, next uint64) error {
	ctx, cancel := r.st.opCtx()
	defer cancel()
	at, last, err := r.st.locate(ctx, r.s.subject, next, rec.FloorMsg)
	if err != nil {
		return err
	}
	cfg := jetstream.OrderedConsumerConfig{
		FilterSubjects:    []string{r.s.subject},
		DeliverPolicy:     jetstream.DeliverAllPolicy,
		InactiveThreshold: 30 * time.Second, // if this replica dies, the server cleans up
	}
	switch {
	case at != nil:
		cfg.DeliverPolicy, cfg.OptStartSeq = jetstream.DeliverByStartSequencePolicy, at.seq
		r.lastMsg = at.seq - 1
	case last != nil:
		cfg.DeliverPolicy, cfg.OptStartSeq = jetstream.DeliverByStartSequencePolicy, last.seq+1
		r.lastMsg = last.seq
	}
	cons, err := r.st.events.OrderedConsumer(ctx, cfg)
	if err != nil {
		r.st.fault("consumer", err)
		return err
	}
	it, err := cons.Messages(jetstream.PullMaxMessages(8))
	if err != nil {
		r.st.fault("consumer", err)
		return err
	}
	r.cmu.Lock()
	if r.released { // closed meanwhile
		r.cmu.Unlock()
		it.Stop()
		r.deleteConsumer(cons)
		return r.err
	}
	r.cons, r.it, r.started = cons, it, true
	r.st.reading.Store(r, it)
	r.cmu.Unlock()
	r.msgs, r.pumpErr = make(chan jetstream.Msg, 1), make(chan error, 1)
	if !r.st.spawn(func() { r.pump(it) }) {
		it.Stop()
		return errors.New("natsstore: the store is closed")
	}
	return nil
}

// pump moves messages from the consumer to Read, one at a time.
func (r *reader) pump(it jetstream.MessagesContext) {
	for {
		m, err := it.Next()
		if err != nil {
			if !errors.Is(err, jetstream.ErrMsgIteratorClosed) {
				r.pumpErr <- err
			}
			return
		}
		select {
		case r.msgs <- m:
		case <-r.done:
			return
		}
	}
}

// place takes a message as the one to hand out events from.
func (r *reader) place(m jetstream.Msg) error {
	md, err := m.Metadata()
	if err != nil {
		return err
	}
	info, err := parseMsg(md.Sequence.Stream, m.Headers(), m.Data())
	if err != nil {
		return err
	}
	return r.placeInfo(info, m.Data())
}

// placeInfo takes a message, as its headers say (info) and its payload, as
// the one to hand out events from.
func (r *reader) placeInfo(info msgInfo, data []byte) error {
	r.lastMsg = info.seq
	r.mu.Lock()
	next := r.next
	r.mu.Unlock()
	if info.parts > 0 {
		return r.placePart(info, data, next)
	}
	// An event left incomplete (its writer failed before its last part)
	// was never stored: what follows stores that seq again, or ends.
	r.asm, r.asmNext = nil, 0
	if info.first > next {
		// Events this reader still had to read are gone.
		return r.lost(next, info.first-next)
	}
	if info.end != policy.Live {
		r.endErr = endError(info.end, info.reason)
		if rec, ok := r.s.record(); ok && rec.State == policy.Live {
			// This replica's mirror has yet to hear of the end: read the
			// record, so what the stream says agrees with its reader.
			ctx, cancel := r.st.opCtx()
			r.st.streams.fetch(ctx, r.s.key)
			cancel()
		}
		return nil
	}
	r.cur, r.curData = info, data
	return nil
}

// placePart takes an event's part: the event is handed out once its last
// part is in, never before. Parts that do not add up (one missing, out of
// order, longer or shorter than the event) are a storage fault: Read fails
// with it (the relay logs it and ends the response), never hands out a
// truncated event.
func (r *reader) placePart(info msgInfo, data []byte, next uint64) error {
	switch {
	case info.first < next: // an event before the reader's position
		r.asm, r.asmNext = nil, 0
		return nil
	case info.first > next:
		return r.lost(next, info.first-next)
	case info.part == 1: // a first part starts the event again, even one under way (abandoned)
		r.asm, r.asmInfo, r.asmNext = make([]byte, 0, info.total), info, 1
	case r.asmNext != info.part || r.asmInfo.parts != info.parts || r.asmInfo.total != info.total:
		return r.partFault(info, "stored without the part before it")
	}
	if len(r.asm)+len(data) > info.total {
		return r.partFault(info, "longer than the event")
	}
	r.asm, r.asmNext = append(r.asm, data...), info.part+1
	if info.part < info.parts {
		return nil
	}
	if len(r.asm) != info.total {
		return r.partFault(info, "shorter than the event")
	}
	r.cur = msgInfo{seq: info.seq, first: info.first, off: info.off, size: info.total}
	r.curData, r.asm, r.asmNext = r.asm, nil, 0
	return nil
}

// partFault is an event whose parts do not add up.
func (r *reader) partFault(info msgInfo, why string) error {
	r.asm, r.asmNext = nil, 0
	err := fmt.Errorf("%w: stream %s, event %d, part %d of %d %s", errBadParts, r.s.key, info.first, info.part, info.parts, why)
	r.st.fault("read", err)
	return err
}

// errBadParts: an event stored in parts cannot be put together again.
var errBadParts = errors.New("natsstore: storage fault: an event's parts do not add up")

// take hands out events of the current message from next on, at most
// about maxBytes (at least one), as one slice of the message's payload
// (which is never written again).
func (r *reader) take(dst [][]byte, maxBytes int) (buffer.Batch, bool) {
	data := r.curData
	if data == nil {
		return buffer.Batch{}, false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	m := &r.cur
	if r.next > m.last() {
		r.curData = nil
		return buffer.Batch{}, false
	}
	first := max(r.next, m.first)
	start, end := m.span(first)
	last := first
	for last < m.last() {
		_, e := m.span(last + 1)
		if e-start > maxBytes {
			break
		}
		last, end = last+1, e
	}
	r.next = last + 1
	if last == m.last() {
		r.curData = nil
	}
	return buffer.Batch{First: first, Last: last, Data: append(dst[:0], data[start:end:end])}, true
}

// lost reports events a reader still needed that are gone: a bug that
// must never stay silent (the relay signals a gap).
func (r *reader) lost(from, n uint64) error {
	r.st.counters.EventsEvictedBeforeAck.Add(n)
	if h := r.st.opts.Hooks.EvictedBeforeAck; h != nil {
		h(r.s.sess.id, r.s.num, from, n)
	}
	return buffer.ErrBelowFloor
}

// producerGone reports that no producer holds the stream and the reader
// has read everything stored.
func (r *reader) producerGone(ctx context.Context) bool {
	if r.st.leased(ctx, r.s.key) {
		return false
	}
	if w := r.s.currentWriter(); w != nil {
		if h, ok := w.assigned(); ok {
			if s, _ := w.storedHead(); s < h {
				return false // still storing what it appended
			}
		}
	}
	ctx, cancel := r.st.opCtx()
	defer cancel()
	last, err := r.st.lastMsg(ctx, r.s.subject)
	if err != nil {
		return false
	}
	return last == nil || last.seq <= r.lastMsg
}

func endError(state policy.StreamState, reason policy.Reason) error {
	if state == policy.Complete {
		return io.EOF
	}
	return &buffer.FailedError{Reason: reason}
}

// Delivered implements buffer.Reader. Deliveries reach the stream record
// at most once per delivery quantum (and with the reader's heartbeat), so
// a busy stream costs a few writes per second; until then they protect
// events longer, never shorter.
func (r *reader) Delivered(seq uint64) {
	now := time.Now()
	r.mu.Lock()
	if seq <= r.delivered || seq >= r.next {
		r.mu.Unlock()
		return
	}
	r.delivered, r.sent = seq, now
	wait := r.st.deliveryQuantum() - now.Sub(r.lastSync)
	schedule := !r.syncing
	r.syncing = true
	r.mu.Unlock()
	r.progressed.fire()
	if schedule {
		time.AfterFunc(max(wait, 0), func() { r.sync(false) })
	}
}

// sync writes the reader's position and deliveries to the stream record
// while the record names it; final removes it.
func (r *reader) sync(final bool) {
	r.mu.Lock()
	if !final {
		r.syncing = false
	}
	next, delivered, sent := r.next, r.delivered, r.sent
	r.lastSync, r.synced = time.Now(), delivered
	r.mu.Unlock()
	select {
	case <-r.done:
		if !final {
			return
		}
	default:
	}
	quantum := r.st.deliveryQuantum()
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	_, err := r.st.streams.update(ctx, r.s.key, func(rec *streamRecord) error {
		if rec.Reader == nil || rec.Reader.ID != r.id {
			return errUnchanged // taken over: this connection's deliveries no longer count
		}
		if delivered > rec.Delivered {
			rec.delivered(delivered, sent.UnixNano(), quantum)
		}
		if final {
			rec.Reader = nil
		} else {
			rec.Reader.Next, rec.Reader.At = max(rec.Reader.Next, next), time.Now().UnixNano()
		}
		return nil
	})
	if err != nil && !errors.Is(err, errNotFound) {
		r.st.fault("reader", err)
	}
}

// flushDeliveries writes deliveries not yet in the record, before another
// connection takes the stream over (they decide where it starts).
func (r *reader) flushDeliveries() {
	r.mu.Lock()
	behind := r.delivered > r.synced
	r.mu.Unlock()
	if behind {
		r.sync(false)
	}
}

// heartbeat refreshes the reader's entry, so no replica takes it for dead.
func (r *reader) heartbeat() {
	r.mu.Lock()
	busy := r.syncing
	r.mu.Unlock()
	if !busy {
		r.sync(false)
	}
}

func (r *reader) Close() {
	// Touch first: a sweep between the reader's removal and the touch would
	// see the session idle since long before its client left.
	r.s.sess.Touch()
	mine := r.s.removeReader(r)
	r.close(io.ErrClosedPipe)
	if mine {
		r.sync(true)
	}
	r.release()
}

// release frees the reader's consumer (or its place in the writer's feed)
// once the reader is done.
func (r *reader) release() {
	if w := r.s.currentWriter(); w != nil {
		w.unregister(r)
	}
	r.cmu.Lock()
	started, released := r.started, r.released
	r.released = true
	r.cmu.Unlock()
	if !started || released {
		return
	}
	r.st.reading.Delete(r)
	r.it.Stop()
	r.deleteConsumer(r.cons)
}

// deleteConsumer removes a consumer from the server (an ordered consumer
// outlives Stop until its inactivity threshold otherwise).
func (r *reader) deleteConsumer(cons jetstream.Consumer) {
	name := cons.CachedInfo().Name
	// Once the store shuts down, the consumer goes with its inactivity
	// threshold instead.
	r.st.spawn(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := r.st.events.DeleteConsumer(ctx, name); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
			r.st.fault("delete_consumer", err)
		}
	})
}
