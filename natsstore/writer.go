package natsstore

// The producer's side of a stream: one writer per stream this replica
// produces, batching appends into JetStream messages. It is one file,
// longer than most, because append, flush, publish and the record's sync
// share one lock and one set of counters; split, the invariants between
// them would be spread over files.

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/mcpresume/caddy-mcp-resume/buffer"
	"github.com/mcpresume/caddy-mcp-resume/internal/eventid"
	"github.com/mcpresume/caddy-mcp-resume/policy"
)

// writer is the producer's side of a stream on this replica. Append frames
// an event under the ID it mints and adds it to an open batch; one publish
// at a time stores the batch before it (group commit): at low rates each
// event is its own message, at high rates batches grow to batchMax. Every
// publish expects the subject's last message to be the previous one, and
// carries a message ID, so a retried publish is never stored twice and a
// writer that lost the stream cannot interleave.
type writer struct {
	s  *stream
	st *Store

	mu        sync.Mutex
	tail      tailRing // the last events' upstream IDs and sums, for evictions here (tail.go)
	head      uint64   // last seq assigned
	headOff   int64    // framed bytes of the events up to head
	stored    uint64   // last seq stored
	storedOff int64
	lastMsg   uint64 // stream sequence of the subject's last message
	open      batch  // filling while a publish is in flight
	spare     []byte
	flushing  bool
	ending    bool  // Complete or Fail under way: no more appends
	stopErr   error // the session ended or the store closes: stop publishing
	err       error // the writer can store nothing more
	answers   map[string]uint64
	upstream  string // the upstream cursor as of the last event appended (or note)
	// unnoted: a note (NoteUpstream) came when no open batch could carry
	// it, at head notedAt; the next batch carries it, or recordNote does.
	unnoted bool
	notedAt uint64
	// noteTimer records a note no batch carried within noteDelay.
	noteTimer *time.Timer
	synced    int64 // headOff last written to the record
	syncedAt  time.Time
	room      signal // a batch was taken or stored, or the writer stopped

	// ids is what its messages' IDs begin with: the stream's key, and
	// after a takeover the key and the marker's sequence, so no two
	// producers' messages share an ID in JetStream's duplicate window,
	// which is checked before the expected last sequence (review 46: a
	// fenced producer's publish, taken for a duplicate of its taker's,
	// was "stored", and its next went in after the taker's).
	ids string

	others othersCache
	feed   feed // for the local reader (feed.go)

	// superseded: another producer took the stream over (takeover.go), so
	// what this writer could not store is its successor's to get again.
	superseded bool
	storedUp   string // the upstream cursor of the last message stored here
}

type batch struct {
	buf      []byte
	lens     []int
	first    uint64
	off      int64
	answers  []answer
	upstream string   // the upstream cursor as of its last event
	ups      []string // the upstream cursor as of each event
	own      []string // the upstream ID each event came with (tail.go)
}

func (b *batch) last() uint64 { return b.first + uint64(len(b.lens)) - 1 }

// msg is the message that stores b on subject: its events' bytes, and in
// headers where they start and what they answer (msgs splits a batch too
// large for one message).
func (b *batch) msg(subject string) *nats.Msg {
	msg := nats.NewMsg(subject)
	msg.Data = b.buf
	msg.Header.Set(hdrFirst, strconv.FormatUint(b.first, 10))
	msg.Header.Set(hdrOff, strconv.FormatInt(b.off, 10))
	if len(b.lens) > 1 {
		msg.Header.Set(hdrLens, joinLens(b.lens))
	}
	if len(b.answers) > 0 {
		msg.Header.Set(hdrAnswers, encodeAnswers(b.answers))
	}
	if b.upstream != "" {
		msg.Header.Set(hdrUpstream, b.upstream)
	}
	if ids, ok := b.ids(); ok {
		msg.Header.Set(hdrIDs, ids)
	}
	return msg
}

var errConflict = errors.New("natsstore: another writer stored to the stream")

func newWriter(s *stream) *writer {
	return &writer{s: s, st: s.sess.st, answers: make(map[string]uint64)}
}

// load learns where the stream stands from its last stored message. A
// stream this replica opened (fresh) has none to read: no one else stores
// to it while its lease is held here, and a sweeper that ended it all the
// same is in its record, or refuses the first publish its expectation.
func (w *writer) load(fresh bool) error {
	var last *msgInfo
	if !fresh {
		ctx, cancel := w.st.opCtx()
		defer cancel()
		var err error
		if last, err = w.st.lastMsg(ctx, w.s.subject); err != nil {
			return err
		}
	}
	rec, ok := w.s.record()
	if !ok {
		return buffer.ErrStreamEnded
	}
	w.head, w.headOff = rec.Head, rec.HeadOff
	w.upstream = rec.Upstream // carried by the batches this writer stores until the tap moves it
	if last != nil && last.upstream != "" && last.last() > rec.UpstreamAt {
		w.upstream = last.upstream
	}
	w.storedUp = w.upstream
	if last != nil && last.last() >= w.head {
		w.head, w.headOff, w.lastMsg = last.last(), last.endOff(), last.seq
		w.ending = last.end != policy.Live
	}
	w.stored, w.storedOff, w.synced = w.head, w.headOff, w.headOff
	w.ending = w.ending || rec.State != policy.Live
	return nil
}

func (w *writer) framedLen(fields int) int {
	return len("id: ") + eventid.Len(eventid.EpochLen, w.s.num, w.head+1) + 1 + fields + 1
}

// usableLocked reports why nothing more can be appended, if so.
func (w *writer) usableLocked() error {
	if w.err != nil || w.stopErr != nil || w.ending {
		return buffer.ErrStreamEnded
	}
	return nil
}

// append implements Stream.Append and AppendBatch: see budget.go for when
// it blocks. Each entry's stall is its own, as if appended alone.
func (w *writer) append(ctx context.Context, es []buffer.Entry) (last uint64, n int, err error) {
	var blocked stallClock
	defer func() { blocked.stop(w) }()
	for n < len(es) {
		seq, added, wait, err := w.tryAppend(es[n:], &blocked)
		if wait == nil {
			if err != nil {
				return last, n, err
			}
			w.st.counters.EventsEnqueued.Add(uint64(added))
			last, n = seq, n+added
			blocked.stop(w)
			blocked = stallClock{}
			continue
		}
		if err := wait(ctx); err != nil {
			return last, n, err
		}
	}
	return last, n, nil
}

// addLocked frames an event as the next seq into the open batch, which
// carries the upstream cursor as of it.
func (w *writer) addLocked(e buffer.Entry) uint64 {
	fields, answers := e.Fields, e.Answers
	n := w.framedLen(len(fields))
	b := &w.open
	seq := w.head + 1
	if len(b.lens) == 0 {
		b.first, b.off = seq, w.headOff
		if b.buf == nil {
			b.buf, w.spare = w.spare[:0], nil
		}
	}
	b.buf = appendFramed(b.buf, w.s.sess.epoch, w.s.num, seq, fields)
	b.lens = append(b.lens, n)
	if len(answers) > 0 {
		rec, _ := w.s.record()
		for _, id := range answers {
			if w.answerable(rec, id) {
				w.answers[id] = seq
				b.answers = append(b.answers, answer{id, seq})
			}
		}
	}
	if e.Upstream != "" {
		w.upstream = e.Upstream
	}
	w.unnoted = false // this batch carries any note before it
	if w.noteTimer != nil {
		w.noteTimer.Stop()
		w.noteTimer = nil
	}
	b.upstream = w.upstream
	b.ups = append(b.ups, w.upstream)
	b.own = append(b.own, e.Upstream)
	w.tail.add(seq, e.Upstream, fields)
	w.head, w.headOff = seq, w.headOff+int64(n)
	w.others.grown.Store(w.headOff)
	w.st.unstored.Add(int64(n))
	if !w.flushing {
		w.flushing = w.st.spawn(w.flush) // after shutdown nothing stores it: Close failed the stream
	}
	return seq
}

// answerable reports whether id is a request of the stream still waiting.
func (w *writer) answerable(rec *streamRecord, id string) bool {
	if _, done := w.answers[id]; done || rec == nil {
		return false
	}
	for _, q := range rec.Requests {
		if q.ID == id {
			return q.AnsweredAt == 0
		}
	}
	return false
}

// flush publishes batches, one at a time, until none is open.
func (w *writer) flush() {
	for {
		w.mu.Lock()
		if w.stopErr != nil {
			w.failLocked(w.stopErr)
		}
		if len(w.open.lens) == 0 || w.err != nil {
			w.flushing = false
			w.mu.Unlock()
			w.room.fire()
			return
		}
		b := w.open
		w.open = batch{}
		expect := w.lastMsg
		w.mu.Unlock()
		w.room.fire()

		began := time.Now()
		fed := false // the local reader holds the batch's bytes: they are not reused
		// Each message stored moves what is stored: an event in parts is
		// stored with its last part.
		_, err := w.st.storeMsgs(b.msgs(w.s.subject, w.idBase(), w.st.partRoom), expect, w.aborted, w.emptied,
			func(o *outMsg, seq uint64) {
				w.mu.Lock()
				w.lastMsg = seq
				if !o.partial {
					w.stored, w.storedOff = o.last, o.endOff
					if up := o.msg.Header.Get(hdrUpstream); up != "" {
						w.storedUp = up
					}
				}
				if w.feed.reader != nil {
					info := o.info
					info.seq = seq
					w.fedLocked(info, o.msg.Data)
					fed = true
				}
				w.mu.Unlock()
				w.st.total.add(seq, o.stored) // before it leaves unstored: never counted in neither
				w.room.fire()
			})
		if err == nil && w.st.opts.OnPublish != nil {
			w.st.opts.OnPublish(time.Since(began), len(b.lens))
		}
		superseded := errors.Is(err, errConflict) && w.s.takenOver()
		w.mu.Lock()
		if err == nil {
			if cap(b.buf) <= 2*w.st.batchMax && !fed {
				w.spare = b.buf[:0]
			}
		} else {
			w.superseded = w.superseded || superseded
			w.failLocked(err)
		}
		late := err == nil && w.stopErr != nil
		w.mu.Unlock()
		if late && w.s.sess.gone() {
			// Stored after the session ended: perhaps after its events
			// were purged. Nothing may outlive the session.
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			w.st.purge(ctx, w.s.subject, 0)
			cancel()
		}
		w.st.unstored.Add(-int64(len(b.buf)))
		w.room.fire()
		if err == nil && len(b.answers) > 0 {
			// Answers reach the record within answerSync, unless the stream
			// is being finished by then: its end writes them with it. A
			// call's result is followed by its end at once, and one write
			// does for both.
			time.AfterFunc(answerSync, func() {
				w.mu.Lock()
				ending := w.ending
				w.mu.Unlock()
				if !ending {
					w.sync(true)
				}
			})
		} else if err == nil {
			w.sync(false)
		}
	}
}

// storedSize estimates what JetStream's file store counts for msg (its
// State.Bytes): payload, subject, headers (with the ones publishing adds)
// and the record's own overhead. Overestimating is safe; an estimate short
// of it let JetStream's hard limit bite before the budget's reserve for
// connected clients did, starving them.
func storedSize(msg *nats.Msg, id string) int64 {
	n := len(msg.Data) + len(msg.Subject) + len("NATS/1.0\r\n\r\n")
	for k, vs := range msg.Header {
		for _, v := range vs {
			n += len(k) + len(": \r\n") + len(v)
		}
	}
	n += len("Nats-Msg-Id: \r\n") + len(id) + len("Nats-Expected-Last-Subject-Sequence: 18446744073709551615\r\n")
	return int64(n + 64) // record header, sequence, timestamp, checksum
}

// aborted reports why the writer must stop retrying.
func (w *writer) aborted() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.stopErr
}

// emptied reports whether the subject may be empty because every event
// this writer stored was evicted and purged. The floor moves in the
// record before the purge, so KV says so where this replica's mirror
// lags: a reader on another replica acknowledged everything while this
// one was cut off (review 45: taken for another writer, the stream
// failed and its events were lost).
func (w *writer) emptied() bool {
	if w.floorPast() {
		return true
	}
	ctx, cancel := context.WithTimeout(w.st.ctx, 2*time.Second)
	defer cancel()
	_, _, err := w.st.streams.fetch(ctx, w.s.key)
	return err == nil && w.floorPast()
}

// idBase returns what the writer's message IDs begin with (see ids).
func (w *writer) idBase() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.ids == "" {
		return w.s.key
	}
	return w.ids
}

// floorPast reports whether the stream's floor, as the mirror holds it, is
// past everything this writer stored, while the record names no other
// producer: a floor moved past the events of a replica that took the
// stream over says nothing of this writer's (review 46: a fenced producer
// back from a cut stored from nothing into the taker's stream).
func (w *writer) floorPast() bool {
	rec, ok := w.s.record()
	w.mu.Lock()
	defer w.mu.Unlock()
	return ok && rec.Floor > w.stored && (rec.Producer == "" || rec.Producer == w.st.opts.ReplicaID)
}

// failLocked makes the writer terminal. Events it assigned and could not
// store are lost: with their session if it ended, else loudly (counted as
// evicted before acknowledgement, the counter that must stay 0).
func (w *writer) failLocked(err error) {
	if w.err != nil {
		return
	}
	w.err = err
	w.st.unstored.Add(-int64(len(w.open.buf)))
	w.open = batch{}
	lost := w.head - w.stored
	if lost == 0 {
		return
	}
	st, s := w.st, w.s
	if w.superseded {
		return // the producer that took the stream over asked the upstream for them again
	}
	if s.sess.gone() {
		st.counters.EventsEvicted.Add(lost)
		return
	}
	st.counters.EventsEvictedBeforeAck.Add(lost)
	if h := st.opts.Hooks.EvictedBeforeAck; h != nil {
		from := w.stored + 1
		go h(s.sess.id, s.num, from, lost) // hooks run without locks
	}
}

// stop ends the writer: its session ended, or the store closes.
func (w *writer) stop(err error) {
	w.mu.Lock()
	if w.stopErr == nil {
		w.stopErr = err
	}
	if !w.flushing {
		w.failLocked(err)
	}
	w.mu.Unlock()
	w.room.fire()
}

// waitStored waits until everything appended is stored (or can never be).
func (w *writer) waitStored(d time.Duration) { w.waitStoredTo(0, d) }

// waitStoredTo waits until events up to seq (0: all appended) are stored,
// or can never be.
func (w *writer) waitStoredTo(seq uint64, d time.Duration) {
	if w == nil {
		return
	}
	t := time.NewTimer(d)
	defer t.Stop()
	for {
		w.mu.Lock()
		done := w.err != nil || seq == 0 && w.stored == w.head && !w.flushing || seq > 0 && w.stored >= min(seq, w.head)
		ch := w.room.wait()
		w.mu.Unlock()
		if done {
			return
		}
		select {
		case <-ch:
		case <-t.C:
			return
		}
	}
}

// answerSync is how soon answers stored reach the stream record (the
// producer's own View has them at once).
const answerSync = 5 * time.Millisecond

func (st *Store) endTimeout() time.Duration {
	return min(max(st.Limits().StallTimeout, time.Second), 30*time.Second)
}

// sync writes how far the stream is stored (and the answers) to its
// record: always when answers were stored, else at most every 64 KiB and
// 100ms, so other replicas' session bounds see this stream's bytes.
func (w *writer) sync(force bool) {
	w.mu.Lock()
	stored, storedOff, lastMsg := w.stored, w.storedOff, w.lastMsg
	due := force || storedOff-w.synced >= 64<<10 && time.Since(w.syncedAt) >= 100*time.Millisecond
	if !due {
		w.mu.Unlock()
		return
	}
	w.synced, w.syncedAt = storedOff, time.Now()
	answers := make(map[string]uint64, len(w.answers))
	for id, seq := range w.answers {
		if seq <= stored {
			answers[id] = seq
		}
	}
	w.mu.Unlock()
	ctx, cancel := w.st.opCtx()
	defer cancel()
	_, err := w.st.streams.update(ctx, w.s.key, func(r *streamRecord) error {
		changed := false
		for id, seq := range answers {
			for _, q := range r.Requests {
				if q.ID == id && q.AnsweredAt == 0 {
					r.answer(id, seq)
					changed = true
				}
			}
		}
		if stored > r.Head {
			r.Head, r.HeadOff, r.Synced = stored, storedOff, max(r.Synced, lastMsg)
			changed = true
		}
		if !changed {
			return errUnchanged
		}
		return nil
	})
	if err != nil && !errors.Is(err, errNotFound) {
		w.st.fault("sync", err)
	}
}

// finish ends a request stream: the signals (if any) go in, everything is
// stored, then the end marker, then the record says so. False if the
// stream had ended already.
func (w *writer) finish(state policy.StreamState, reason policy.Reason, signals []buffer.Signal) bool {
	st, s := w.st, w.s
	w.mu.Lock()
	rec, ok := s.record()
	if w.usableLocked() != nil || !ok || rec.State != policy.Live {
		// Nothing more comes from here (unless another finish is under
		// way): the lease goes, and if the stream is unended the sweeper
		// ends it. A lease kept would be renewed for a stream no one
		// produces.
		over := w.err != nil || w.stopErr != nil || !ok || rec.State != policy.Live
		w.mu.Unlock()
		if over {
			st.release(s.key)
		}
		return false
	}
	for _, sig := range signals {
		w.addLocked(buffer.Entry{Fields: sig.Fields, Answers: sig.Answers})
		st.counters.EventsEnqueued.Add(1)
	}
	w.ending = true
	w.mu.Unlock()
	w.room.fire() // blocked appends end
	w.waitStored(st.endTimeout())

	w.mu.Lock()
	failed := w.err != nil
	head, off, expect := w.stored, w.storedOff, w.lastMsg
	var upstream string // the cursor as of head, if every event appended is stored
	if w.stored == w.head {
		upstream = w.upstream
	}
	fed := w.feed.reader
	w.mu.Unlock()
	if !failed {
		// The record first: readers on every replica end by it (after the
		// head), so the marker that follows only ends them sooner. A client
		// here that has everything leaves with the end (feed.go); if that
		// leaves no reader attached, none needs the marker (one attaching
		// later finds the record ended), so it is not stored: a short
		// call's publish fewer (issue 23). A sweeper that takes the lease
		// after its release reads the record from KV (failOrphan).
		attached := true
		recorded := w.recordEnd(state, reason, head, off, expect, fed.leaveWithEnd(head),
			func(r *streamRecord) { attached = r.Reader != nil })
		if recorded && !attached {
			st.release(s.key)
			s.changed.fire()
			return true
		}
		msg := endMarker(s.subject, head, off, state, reason, upstream)
		// The marker only ends readers sooner: it is not worth waiting for
		// past the end's own bound when NATS is out of reach.
		deadline := time.Now().Add(st.endTimeout())
		giveUp := func() error {
			if time.Now().After(deadline) {
				return context.DeadlineExceeded
			}
			return nil
		}
		// Never stored into a subject emptied meanwhile: the end is
		// recorded, so only its stream's whole eviction (or its session's
		// end) empties it, and a marker stored after that purge outlived
		// it, retirement included (review 50).
		if seq, err := st.publishAfter(msg, w.idBase()+".end", expect, giveUp, nil); err == nil {
			w.mu.Lock()
			w.lastMsg = seq
			w.mu.Unlock()
		}
	}
	st.release(s.key) // if unended, the sweeper ends it
	s.changed.fire()
	return true
}

// recordEnd writes the end into the stream record.
// It reports whether this write ended the record.
func (w *writer) recordEnd(state policy.StreamState, reason policy.Reason, head uint64, off int64, msg uint64, also ...func(*streamRecord)) bool {
	w.mu.Lock()
	answers := make(map[string]uint64, len(w.answers))
	for id, seq := range w.answers {
		answers[id] = seq
	}
	w.mu.Unlock()
	// Only while the record names this replica (or no one) the producer:
	// one whose lease lapsed unseen must not end a stream taken over.
	return w.st.endRecord(w.s.key, w.st.opts.ReplicaID, state, reason, head, off, msg, answers, nil, also...)
}

// signal appends the standalone stream's failure signals; it goes on.
func (w *writer) signal(signals []buffer.Signal) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.usableLocked() != nil {
		return false
	}
	for _, sig := range signals {
		w.addLocked(buffer.Entry{Fields: sig.Fields, Answers: sig.Answers})
		w.st.counters.EventsEnqueued.Add(1)
	}
	return true
}

// note implements Stream.NoteUpstream: the open batch carries the cursor
// as of its last event, so a note rides with it; with none open, the note
// waits for the next batch or recordNote.
func (w *writer) note(id string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.upstream = id
	if b := &w.open; len(b.lens) > 0 {
		b.upstream = id
		b.ups[len(b.ups)-1] = id
		return
	}
	w.unnoted, w.notedAt = true, w.head
	if w.noteTimer == nil {
		w.noteTimer = time.AfterFunc(noteDelay, w.recordNote)
	}
}

// noteDelay is how long a note waits for a batch to carry it before it is
// written to the stream record by itself. A short call's result carries
// its priming event's note at no cost; a call silent longer (a long tool
// run before any progress) has its upstream cursor stored, so a takeover
// can resume it if its producer dies in that silence.
const noteDelay = time.Second

// recordNote writes a note no batch carries into the stream record, once
// everything before it is stored: the producer lets go of the stream, and
// the next one (on any replica) must resume the upstream after it.
func (w *writer) recordNote() {
	w.mu.Lock()
	id, at := w.upstream, w.notedAt
	due := w.unnoted && w.err == nil && w.stored >= at
	w.unnoted = w.unnoted && !due
	if w.noteTimer != nil {
		w.noteTimer.Stop()
		w.noteTimer = nil
	}
	w.mu.Unlock()
	if !due {
		return
	}
	ctx, cancel := w.st.opCtx()
	defer cancel()
	_, err := w.st.streams.update(ctx, w.s.key, func(r *streamRecord) error {
		if r.Upstream == id && r.UpstreamAt == at {
			return errUnchanged
		}
		r.Upstream, r.UpstreamAt = id, at
		return nil
	})
	if err != nil && !errors.Is(err, errNotFound) {
		w.st.fault("stream", err)
	}
}

// ---- what the rest of the store asks of a writer (nil-safe) ----------------

// idle reports that the writer holds nothing unstored.
func (w *writer) idle() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return !w.flushing && w.stored == w.head
}

// assigned is the last seq handed out, if the writer can still store.
func (w *writer) assigned() (uint64, bool) {
	if w == nil {
		return 0, false
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.head, w.err == nil
}

func (w *writer) storedHead() (uint64, bool) {
	if w == nil {
		return 0, false
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.stored, true
}

// retained is what the stream holds against the bounds, counting what is
// on its way to being stored.
func (w *writer) retained(rec *streamRecord) (int64, bool) {
	if w == nil {
		return 0, false
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.err != nil {
		return 0, false
	}
	return max(w.headOff-rec.FloorOff, 0), true
}

// overlay adds the answers appended here that the record lacks yet.
func (w *writer) overlay(v *policy.StreamView) {
	if w == nil {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	for i, q := range v.Requests {
		if q.AnsweredAt == 0 {
			if seq, ok := w.answers[q.ID]; ok {
				v.Requests[i].AnsweredAt = seq
			}
		}
	}
}

// pending are the stream's requests still without an answer.
func (w *writer) pending() []string {
	rec, ok := w.s.record()
	if !ok {
		return nil
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []string
	for _, id := range rec.pending() {
		if _, answered := w.answers[id]; !answered {
			out = append(out, id)
		}
	}
	return out
}
