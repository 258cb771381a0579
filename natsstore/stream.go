package natsstore

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/buffer"
	"github.com/mcpresume/caddy-mcp-resume/internal/eventid"
	"github.com/mcpresume/caddy-mcp-resume/policy"
)

// stream is this replica's handle of one stream. Its state is the stream
// record (every replica's) and, where this replica produces it, its writer.
type stream struct {
	sess    *session
	num     uint32
	kind    policy.StreamKind
	key     string // <sh>.<epoch>.<num>
	subject string

	// changed fires when the record or the lease changed, or the stream
	// ended here: readers and blocked appends look again.
	changed   signal
	producing atomic.Bool // an upstream response here feeds it (TakeProducer)
	fresh     atomic.Bool // opened here (NewStream): nothing is stored to it but by this replica
	stalled   atomic.Bool
	stalls    atomic.Uint64 // times this replica's producer began waiting on a full log

	fenced   atomic.Bool   // its producer here stopped itself, its lease unrenewed (fenceRequest)
	leaseGen atomic.Uint64 // counts the changes of its lease this replica's mirror saw

	mu      sync.Mutex
	w       *writer
	ended   error // why the stream is over here (the session ended, the store closed)
	wmu     sync.Mutex
	rmu     sync.Mutex // guards readers (and, in recordChanged, reading the record with them)
	readers map[*reader]struct{}

	// last is the newest record this handle has seen, at revision lastRev:
	// what View tells once the record is gone (the session ended), as the
	// memory store's stream does, so a relay still knows which requests
	// its client was owed.
	lmu     sync.Mutex
	last    *streamRecord
	lastRev uint64
}

var _ buffer.Stream = (*stream)(nil)

func newStream(sess *session, num uint32, kind policy.StreamKind) *stream {
	key := streamKey(sess.sh, sess.epoch, num)
	return &stream{sess: sess, num: num, kind: kind, key: key, subject: sess.st.names.subject(key),
		readers: make(map[*reader]struct{})}
}

func (s *stream) Num() uint32             { return s.num }
func (s *stream) Kind() policy.StreamKind { return s.kind }

func (s *stream) record() (*streamRecord, bool) {
	r, rev, ok := s.sess.st.streams.get(s.key)
	if ok {
		s.lmu.Lock()
		if rev > s.lastRev {
			s.last, s.lastRev = r, rev
		}
		s.lmu.Unlock()
	}
	return r, ok
}

// endedErr reports why the stream is over here, if it is.
func (s *stream) endedErr() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ended
}

// writer returns the stream's writer, made on first use: the producer's
// side of the stream on this replica.
func (s *stream) writer() (*writer, error) {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	s.mu.Lock()
	w, ended := s.w, s.ended
	s.mu.Unlock()
	if ended != nil {
		return nil, buffer.ErrStreamEnded
	}
	if w != nil {
		return w, nil
	}
	w = newWriter(s)
	if err := w.load(s.fresh.Load()); err != nil {
		return nil, err
	}
	s.mu.Lock()
	s.w = w
	s.mu.Unlock()
	s.sess.addWriter(s)
	return w, nil
}

func (s *stream) currentWriter() *writer {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w
}

// View implements buffer.Stream. The head is the producer's if this
// replica produces the stream (events it has accepted and is storing),
// else the stored one.
func (s *stream) View() policy.StreamView {
	rec, ok := s.record()
	if !ok {
		return s.endView()
	}
	return s.viewOf(rec)
}

// endView is the view of a stream whose record is gone with its session:
// the last record seen (its head as a producer here stored it), with no
// event retained, and failed if it was live (as the memory store ends it).
func (s *stream) endView() policy.StreamView {
	s.lmu.Lock()
	last := s.last
	s.lmu.Unlock()
	if last == nil {
		return policy.StreamView{Kind: s.kind, State: policy.Failed, Floor: 1}
	}
	head := last.Head
	w := s.currentWriter()
	if h, ok := w.storedHead(); ok { // a producer here knows what it stored (the record may lag it)
		head = max(head, h)
	}
	v := last.view(head)
	w.overlay(&v)
	v.Floor = v.Head + 1
	if v.State == policy.Live {
		v.State = policy.Failed
	}
	return v
}

func (s *stream) viewOf(rec *streamRecord) policy.StreamView {
	head := rec.Head
	w := s.currentWriter()
	if h, ok := w.assigned(); ok {
		head = max(head, h)
	}
	if rec.State == policy.Live && !(w != nil && s.sess.st.holds(s.key)) {
		// Another replica may be producing it: its last stored event.
		ctx, cancel := s.sess.st.opCtx()
		if last, err := s.sess.st.lastMsg(ctx, s.subject); err == nil && last != nil {
			head = max(head, last.last())
		}
		cancel()
	}
	v := rec.view(head)
	w.overlay(&v)
	return v
}

// recordChanged runs when the mirror's record changed: a reader that is no
// longer the attached one was taken over. It judges by the record the
// mirror holds now, not the one it was told of: the mirror applies
// revisions in order but runs their callbacks unlocked, so an older
// revision's callback (the record before an attach) can arrive after the
// attach registered its reader, which it would take for a takeover. It
// reads the record under rmu: attached registers a reader (under rmu) only
// once the mirror shows its attach, so every reader seen here is judged by
// a record at least as new as the one that named it.
func (s *stream) recordChanged(*streamRecord) {
	s.rmu.Lock()
	cur, ok := s.record()
	if !ok {
		cur = nil
	}
	var over []*reader
	for r := range s.readers {
		if cur == nil || cur.Reader == nil || cur.Reader.ID != r.id {
			over = append(over, r)
			delete(s.readers, r)
		}
	}
	s.rmu.Unlock()
	for _, r := range over {
		switch {
		case cur == nil:
			r.close(buffer.ErrSessionGone)
		case cur.Reader == nil && cur.State == policy.Complete && r.leaving.Load():
			r.close(io.EOF) // it left with the end, having everything
		case cur.Reader == nil && cur.State == policy.Failed && r.leaving.Load():
			r.close(&buffer.FailedError{Reason: cur.FailReason})
		default:
			r.close(buffer.ErrTakenOver)
		}
		r.release() // its consumer goes now, not when its relay notices
	}
	s.changed.fire()
}

func (s *stream) addReader(r *reader) {
	s.rmu.Lock()
	s.readers[r] = struct{}{}
	s.rmu.Unlock()
}

func (s *stream) removeReader(r *reader) bool {
	s.rmu.Lock()
	defer s.rmu.Unlock()
	_, ok := s.readers[r]
	delete(s.readers, r)
	return ok
}

// localReader returns the reader attached on this replica, if any.
func (s *stream) localReader() *reader {
	s.rmu.Lock()
	defer s.rmu.Unlock()
	for r := range s.readers {
		return r
	}
	return nil
}

func (s *stream) Connected() bool {
	rec, ok := s.record()
	return ok && rec.readerAt(time.Now(), s.sess.st.opts.LeaseTTL) != nil
}

// ---- producer --------------------------------------------------------------

func (s *stream) Append(ctx context.Context, e buffer.Entry) (uint64, error) {
	w, err := s.writer()
	if err != nil {
		return 0, err
	}
	es := [1]buffer.Entry{e}
	last, _, err := w.append(ctx, es[:])
	return last, err
}

// AppendBatch implements buffer.BatchAppender: the entries that fit go into
// the open batch under one hold of the writer's lock.
func (s *stream) AppendBatch(ctx context.Context, entries []buffer.Entry) (uint64, int, error) {
	if len(entries) == 0 {
		return 0, 0, nil
	}
	w, err := s.writer()
	if err != nil {
		return 0, 0, err
	}
	return w.append(ctx, entries)
}

func (s *stream) Complete() {
	if s.kind != policy.RequestStream {
		return
	}
	if w, err := s.writer(); err == nil {
		w.finish(policy.Complete, "", nil)
	}
}

// Fail implements buffer.Stream. On a request stream the signals go in,
// then the end; on the standalone stream the signals go in and it goes on.
func (s *stream) Fail(reason policy.Reason, signals ...buffer.Signal) {
	st := s.sess.st
	if s.currentWriter() == nil {
		// Nothing was appended or attached here: learn where the stream
		// stands from JetStream (fresh or not). If NATS is out of reach that
		// fails, and the sweeper ends the stream once its lease lapses.
		s.fresh.Store(false)
	}
	w, err := s.writer()
	if err != nil {
		// The stream ended already, or NATS is out of reach: then the
		// sweeper fails it once its producer lease is gone.
		if !errors.Is(err, buffer.ErrStreamEnded) && !errors.Is(err, buffer.ErrSessionGone) {
			st.fault("fail_stream", err)
		}
		return
	}
	if s.kind == policy.RequestStream {
		if !w.finish(policy.Failed, reason, signals) {
			return
		}
	} else if !w.signal(signals) {
		return
	}
	st.counters.AddFailed(reason)
	if h := st.opts.Hooks.StreamFailed; h != nil {
		h(s.sess.id, s.num, reason)
	}
}

// dropIdleWriter forgets the writer if it holds nothing unstored, so the
// next append learns the stream's head afresh.
func (s *stream) dropIdleWriter() {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.w != nil && s.w.idle() {
		s.w = nil
	}
}

// markOpened records that a client or producer used the stream (the
// standalone stream is shown only then).
func (s *stream) markOpened() {
	if rec, ok := s.record(); !ok || rec.Opened {
		return
	}
	ctx, cancel := s.sess.st.opCtx()
	defer cancel()
	_, err := s.sess.st.streams.update(ctx, s.key, func(r *streamRecord) error {
		if r.Opened {
			return errUnchanged
		}
		r.Opened = true
		return nil
	})
	if err != nil && !errors.Is(err, errNotFound) {
		s.sess.st.fault("stream", err)
	}
}

// ---- readers ---------------------------------------------------------------

// Resume implements buffer.Stream: decide, acknowledge and attach are one
// compare-and-set on the stream record, so no floor move (on any replica)
// comes between the decision and the replay. decide may run again if
// another writer changed the record meanwhile: it must be pure.
func (s *stream) Resume(ack uint64, decide func(policy.StreamView) policy.Resume) (policy.Resume, buffer.Reader, error) {
	st := s.sess.st
	ctx, cancel := st.opCtx()
	defer cancel()
	if old := s.localReader(); old != nil {
		old.flushDeliveries()
	}
	var d policy.Resume
	var r *reader
	var attachErr error
	_, err := st.streams.update(ctx, s.key, func(rec *streamRecord) error {
		v := s.viewOf(rec)
		d = decide(v)
		r, attachErr = nil, nil
		switch d.Kind {
		case policy.Noop, policy.Replay, policy.Gap, policy.Ended:
		default:
			return errUnchanged
		}
		rec.ack(min(ack, v.Head))
		if d.Kind != policy.Ended && (d.Kind != policy.Gap || d.Then == policy.ThenReplay) {
			r, attachErr = s.attachTo(rec, d.From)
		}
		return nil
	})
	if errors.Is(err, errNotFound) {
		if s.sess.goneInKV(ctx) {
			return d, nil, buffer.ErrSessionGone // the session ended: its records are gone
		}
		return d, nil, buffer.ErrStreamGone // retired meanwhile (review 50)
	}
	if err != nil {
		st.fault("resume", err)
		return d, nil, err
	}
	if d.Kind == policy.Reject && s.sess.goneInKV(ctx) {
		// A deletion under way purges the events before it removes the
		// stream records: in between, a cursor reads as ahead of its
		// stream. The session ended: that is the answer.
		return d, nil, buffer.ErrSessionGone
	}
	if r != nil && attachErr == nil {
		s.attached(r)
	}
	// What the acknowledgement released goes now. A client acknowledges
	// only what it was sent, hence stored; a producer here may still be
	// storing what a test (or a racing client) acknowledges: wait for it.
	if ack > 0 {
		s.currentWriter().waitStoredTo(ack, st.endTimeout())
	}
	st.evict(s.key, time.Now())
	if attachErr != nil {
		return d, nil, attachErr
	}
	if r == nil {
		return d, nil, nil
	}
	return d, r, nil
}

// Attach implements buffer.Stream.
func (s *stream) Attach(from uint64) (buffer.Reader, error) {
	st := s.sess.st
	ctx, cancel := st.opCtx()
	defer cancel()
	if old := s.localReader(); old != nil {
		old.flushDeliveries()
	}
	var r *reader
	var attachErr error
	_, err := st.streams.update(ctx, s.key, func(rec *streamRecord) error {
		r, attachErr = s.attachTo(rec, from)
		if attachErr != nil {
			return errUnchanged
		}
		return nil
	})
	switch {
	case errors.Is(err, errNotFound):
		return nil, buffer.ErrSessionGone
	case err != nil:
		st.fault("attach", err)
		return nil, err
	case attachErr != nil:
		return nil, attachErr
	}
	s.attached(r)
	return r, nil
}

// attachTo makes a reader from seq from and enters it in rec as the
// stream's reader (the record's next writer takes over from any other).
func (s *stream) attachTo(rec *streamRecord, from uint64) (*reader, error) {
	if from == buffer.FromUndelivered {
		from = max(rec.Delivered+1, rec.Floor)
	}
	if from < rec.Floor {
		return nil, buffer.ErrBelowFloor
	}
	if s.sess.gone() || s.endedErr() != nil {
		return nil, buffer.ErrSessionGone
	}
	id := make([]byte, 8)
	rand.Read(id)
	r := newReader(s, hex.EncodeToString(id), from)
	rec.Reader = &readerEntry{ID: r.id, Replica: s.sess.st.opts.ReplicaID, Next: from, At: time.Now().UnixNano()}
	rec.Opened = true
	return r, nil
}

// attached does what attaching entails once the record names r: a reader
// attached here before it is taken over, and the session is active.
func (s *stream) attached(r *reader) {
	s.rmu.Lock()
	var over []*reader
	for old := range s.readers {
		over = append(over, old)
		delete(s.readers, old)
	}
	s.readers[r] = struct{}{}
	s.rmu.Unlock()
	for _, old := range over {
		old.close(buffer.ErrTakenOver)
		old.release()
	}
	if rec, ok := s.record(); !ok || rec.Reader == nil || rec.Reader.ID != r.id {
		// Taken over already, between the write and now, or the record
		// went with its session (its client is told the session ended).
		if s.removeReader(r) {
			if ok {
				r.close(buffer.ErrTakenOver)
			} else {
				r.close(buffer.ErrSessionGone)
			}
		}
	} else if s.kind == policy.RequestStream && s.producing.Load() && s.sess.st.holds(s.key) {
		// The producer is here: its writer feeds the reader what it stores.
		if w, err := s.writer(); err == nil {
			r.fed = w.register(r, r.next)
		}
	}
	s.sess.Touch()
}

// ---- ending ----------------------------------------------------------------

// end stops the stream here: readers end with err, appends with
// ErrStreamEnded.
func (s *stream) end(err error) {
	s.mu.Lock()
	if s.ended == nil {
		s.ended = err
	}
	w := s.w
	s.mu.Unlock()
	if w != nil {
		w.stop(err)
	}
	s.rmu.Lock()
	list := make([]*reader, 0, len(s.readers))
	for r := range s.readers {
		list = append(list, r)
		delete(s.readers, r)
	}
	s.rmu.Unlock()
	for _, r := range list {
		r.close(err)
		r.release()
	}
	s.producing.Store(false)
	s.changed.fire()
}

// leave is what a closing store does with the stream: a live request
// stream it produces is failed (its producer goes with this replica), the
// standalone stream's producer flushes and lets go.
func (s *stream) leave() {
	st := s.sess.st
	w := s.currentWriter()
	handOver := false
	if w != nil && s.kind == policy.RequestStream && st.holds(s.key) {
		if rec, ok := s.record(); ok && rec.State == policy.Live {
			// A stream the upstream can resume from what is stored is left
			// live for a takeover (takeover.go) on any replica, this one
			// restarted too; the others fail now, loudly.
			w.mu.Lock()
			handOver = w.upstream != ""
			w.mu.Unlock()
			if handOver = handOver || st.hasCursor(s.key, rec); !handOver {
				head, _ := w.assigned()
				last := string(eventid.Append(nil, s.sess.epoch, s.num, head))
				s.Fail(policy.ReasonUpstreamFailed, st.opts.FailureSignals(policy.ReasonUpstreamFailed, last, w.pending())...)
			}
		}
	}
	if w != nil {
		w.waitStored(st.endTimeout())
		w.recordNote()
		if handOver {
			// What it could not store, the successor asks the upstream for.
			w.mu.Lock()
			w.superseded = true
			w.mu.Unlock()
		}
	}
	s.producing.Store(false)
	st.release(s.key)
	if r := s.localReader(); r != nil && s.removeReader(r) {
		// Its client goes with this replica: no longer connected.
		r.close(buffer.ErrSessionGone)
		r.sync(true)
		r.release()
	}
}
