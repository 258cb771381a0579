package buffer

import (
	"context"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/policy"
)

// memStream is one retention log of a MemoryStore.
type memStream struct {
	sess *memSession
	num  uint32
	kind policy.StreamKind
	key  [32]byte // identifies a request stream's request, for repeated requests

	producing atomic.Bool
	stalled   atomic.Bool
	stalls    atomic.Uint64 // times the producer began waiting on a full log
	attached  atomic.Bool   // a reader is attached (mirrors reader != nil for the budget)
	opened    atomic.Bool   // a client or producer ever used it (request streams: always)
	lastSent  atomic.Int64  // unix nanos of the last delivery, for the stall clock
	// evictFrom tells the sweeper when the head of the log may go, as
	// each eviction leaves it: a window after evictFrom, the head's
	// delivery (unix nanos, the store's clock), judged with the window of
	// the sweep that reads it; 0: at any sweep (a reader is attached: its
	// deliveries are what let events go); math.MaxInt64: not until a
	// reader attaches (which zeroes it) or an acknowledgement (ackLocked
	// evicts on the spot). Without it the sweeper visited every retained
	// stream every interval: a call's stream 240 times in a 2-minute
	// window, some 40 µs of CPU a call. It holds no window: one computed
	// with the window then was overwritten the old way by a sweep under
	// way as a reload shortened it (review 51).
	evictFrom atomic.Int64

	bytes int64 // capacity held, guarded by store.budget.mu

	mu         sync.Mutex
	log        eventLog
	requests   []policy.RequestView // the JSON-RPC requests a request stream answers
	acked      uint64
	delivered  uint64 // highest seq delivered (and not un-delivered by an ack)
	state      policy.StreamState
	failReason policy.Reason
	endedAt    time.Time
	upstream   string // the upstream's event ID as of the last event (or note): what is appended is stored
	reader     *memReader
	waiting    bool          // the reader waits on its notify channel
	done       chan struct{} // closed when the stream ends
}

func newStream(sess *memSession, num uint32, kind policy.StreamKind, ids []string, key [32]byte, maxChunk int) *memStream {
	s := &memStream{
		sess: sess, num: num, kind: kind, key: key,
		log:  newEventLog(sess.epoch, num, maxChunk),
		done: make(chan struct{}),
	}
	for _, id := range ids {
		s.requests = append(s.requests, policy.RequestView{ID: id})
	}
	s.opened.Store(kind == policy.RequestStream)
	s.log.fixedChunk = sess.store.opts.chunkSize
	return s
}

func (s *memStream) Num() uint32             { return s.num }
func (s *memStream) Kind() policy.StreamKind { return s.kind }

// TakeProducer implements Stream. The standalone stream's role is its
// session ID's, so a producer of an ended incarnation (stopping: its
// session's context ended) is waited for too.
func (s *memStream) TakeProducer(ctx context.Context) (Producer, error) {
	if s.sess.ctx.Err() != nil {
		return nil, ErrSessionGone
	}
	s.opened.Store(true)
	var key any = s
	if s.kind == policy.StandaloneStream {
		key = s.sess.id
	}
	p, err := s.sess.store.producers.take(ctx, s.sess.ctx, key, s.producerGone)
	if err != nil {
		return nil, err
	}
	s.producing.Store(true)
	return p, nil
}

// producerGone is the end of a producer: a caught-up standalone reader
// ends (ErrProducerGone).
func (s *memStream) producerGone() {
	s.mu.Lock()
	s.producing.Store(false)
	s.wakeLocked()
	s.mu.Unlock()
}

func (s *memStream) Connected() bool { return s.attached.Load() }

func (s *memStream) UpstreamCursor() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.upstream
}

func (s *memStream) NoteUpstream(id string) {
	if id == "" {
		return
	}
	s.mu.Lock()
	s.upstream = id
	s.mu.Unlock()
}

// wakeLocked tells a waiting reader to look again.
func (s *memStream) wakeLocked() {
	if s.waiting && s.reader != nil {
		s.waiting = false
		select {
		case s.reader.notify <- struct{}{}:
		default:
		}
	}
}

func (s *memStream) View() policy.StreamView {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.viewLocked()
}

func (s *memStream) viewLocked() policy.StreamView {
	return policy.StreamView{Kind: s.kind, State: s.state, Floor: s.log.floor, Head: s.log.head,
		Requests: append([]policy.RequestView(nil), s.requests...)}
}

// progressSince is when the stall of an append blocked since blockedAt
// counts from: the client's last delivery if later, or now while a client
// reads the stream and has every event retained (it is keeping up; the
// window holds the room). A client that left is not keeping up, whatever
// it was sent before.
func (s *memStream) progressSince(blockedAt, now time.Time) time.Time {
	s.mu.Lock()
	caughtUp := s.reader != nil && s.delivered >= s.log.head
	s.mu.Unlock()
	if caughtUp {
		return now
	}
	if sent := time.Unix(0, s.lastSent.Load()); sent.After(blockedAt) {
		return sent
	}
	return blockedAt
}

func (s *memStream) Append(ctx context.Context, e Entry) (uint64, error) {
	es := [1]Entry{e}
	last, _, err := s.AppendBatch(ctx, es[:])
	return last, err
}

// AppendBatch implements BatchAppender: the events that fit go in under one
// hold of the stream's lock, the reader is woken once for them, and bytes
// are reserved (outside the lock, blocking while the log is full) only for
// an event that needs more memory than the log holds.
func (s *memStream) AppendBatch(ctx context.Context, entries []Entry) (last uint64, n int, err error) {
	st := s.sess.store
	var reserved int64 // reserved and not yet taken by the log
	for {
		s.mu.Lock()
		if s.state != policy.Live {
			s.mu.Unlock()
			st.budget.release(s, reserved)
			return last, n, ErrStreamEnded
		}
		var freed, need int64
		done := n
		for n < len(entries) {
			e := &entries[n]
			size := s.log.framedLen(len(e.Fields))
			if need = s.log.growth(size, false); need > 0 {
				recycled, f := s.recycleLocked(size)
				freed += f
				if recycled {
					need = 0 // the front chunk takes the event: no new memory
				} else {
					need = s.log.growth(size, false)
				}
			}
			if need > reserved {
				break
			}
			reserved -= need
			last = s.appendLocked(e.Fields, e.Answers, false)
			if e.Upstream != "" {
				s.upstream = e.Upstream
			}
			n++
		}
		if n > done {
			s.wakeLocked()
		}
		s.mu.Unlock()
		if n > done {
			st.counters.EventsEnqueued.Add(uint64(n - done))
		}
		if n == len(entries) {
			st.budget.release(s, reserved+freed)
			return last, n, nil
		}
		st.budget.release(s, freed)
		// Reserve outside the stream's lock: a blocked append must not hold
		// up readers and acks, which are what free room.
		if err := st.reserve(ctx, s, need-reserved); err != nil {
			st.budget.release(s, reserved)
			return last, n, err
		}
		reserved = need
	}
}

// recycleLocked makes room for an event of n framed bytes that needs a new
// chunk, from the front of the log, where policy lets every event of a
// chunk go now: a chunk that suits is reused as the new last one (the
// stream's byte count is unchanged, so the common append of a busy stream
// takes no budget lock and allocates nothing); one that does not is evicted
// on the way, and its bytes are returned to be released.
func (s *memStream) recycleLocked(n int) (recycled bool, freed int64) {
	if !s.log.needsChunk(n) || len(s.log.chunks) < 2 {
		return false, 0
	}
	st := s.sess.store
	var readerNext uint64
	if s.reader != nil {
		readerNext = s.reader.next
	}
	var now time.Time
	var window time.Duration
	for len(s.log.chunks) >= 2 {
		last := s.log.chunks[0].last()
		if last > s.acked && last > s.delivered {
			break // neither acknowledged nor delivered: no clock lets it go
		}
		if now.IsZero() {
			now, window = st.now(), st.Limits().ResumeWindow
		}
		if !s.log.evictableThrough(last, s.acked, readerNext, now, window) {
			break
		}
		if s.log.recyclable(n) {
			st.counters.EventsEvicted.Add(s.log.recycle())
			return true, freed
		}
		st.counters.EventsEvicted.Add(last - s.log.floor + 1)
		freed += s.log.evict(last)
	}
	return false, freed
}

// appendLocked writes an event whose bytes are accounted for. The caller
// wakes the reader, once for all it appends.
func (s *memStream) appendLocked(fields []byte, answers []string, exact bool) uint64 {
	seq := s.log.append(fields, exact)
	for _, id := range answers {
		for i := range s.requests {
			if s.requests[i].ID == id && s.requests[i].AnsweredAt == 0 {
				s.requests[i].AnsweredAt = seq
			}
		}
	}
	return seq
}

func (s *memStream) Complete() {
	if s.kind == policy.RequestStream {
		s.finish(policy.Complete, "")
	}
}

func (s *memStream) Fail(reason policy.Reason, signals ...Signal) {
	st := s.sess.store
	s.mu.Lock()
	if s.state != policy.Live {
		s.mu.Unlock()
		return
	}
	for _, sig := range signals {
		// Signals bypass the bounds, so they take no more than their size: a
		// chunk of exactly their length when the current one is full.
		n := s.log.growth(s.log.framedLen(len(sig.Fields)), true)
		st.budget.take(s, n)
		s.appendLocked(sig.Fields, sig.Answers, true)
		st.counters.EventsEnqueued.Add(1)
	}
	s.wakeLocked()
	s.mu.Unlock()
	if s.kind == policy.RequestStream {
		s.finish(policy.Failed, reason)
	}
	st.counters.addFailed(reason)
	if h := st.opts.Hooks.StreamFailed; h != nil {
		h(s.sess.id, s.num, reason)
	}
}

func (s *memStream) finish(state policy.StreamState, reason policy.Reason) bool {
	s.mu.Lock()
	if s.state != policy.Live {
		s.mu.Unlock()
		return false
	}
	s.state, s.failReason, s.endedAt = state, reason, s.sess.store.now()
	close(s.done)
	s.wakeLocked()
	s.mu.Unlock()
	s.sess.streamEnded(s)
	return true
}

// end drops a stream with its session: every event goes.
func (s *memStream) end(reason policy.Reason) {
	if s.kind == policy.RequestStream && s.finish(policy.Failed, reason) {
		s.sess.store.counters.addFailed(reason)
	}
	s.mu.Lock()
	if s.kind == policy.StandaloneStream && s.state == policy.Live {
		s.state, s.failReason = policy.Failed, reason
		close(s.done)
		if s.opened.Load() { // a stream in use ends with its session, as a request stream does
			s.sess.store.counters.addFailed(reason)
		}
	}
	n := s.log.head - s.log.floor + 1
	freed := s.log.release()
	r := s.reader
	s.reader = nil
	s.attached.Store(false)
	s.wakeLocked()
	s.mu.Unlock()
	if r != nil {
		r.close(ErrSessionGone)
	}
	s.sess.store.counters.EventsEvicted.Add(n)
	s.sess.store.budget.release(s, freed)
}

func (s *memStream) Resume(ack uint64, decide func(policy.StreamView) policy.Resume) (policy.Resume, Reader, error) {
	s.mu.Lock()
	d := decide(s.viewLocked())
	switch d.Kind {
	case policy.Noop, policy.Replay, policy.Gap, policy.Ended:
	default:
		s.mu.Unlock()
		return d, nil, nil
	}
	freed := s.ackLocked(ack)
	var r, old *memReader
	var err error
	if d.Kind != policy.Ended && (d.Kind != policy.Gap || d.Then == policy.ThenReplay) {
		r, old, err = s.attachLocked(d.From)
	}
	s.mu.Unlock()
	s.sess.store.budget.release(s, freed)
	s.afterAttach(r, old)
	if r == nil {
		return d, nil, err
	}
	return d, r, nil
}

// ackLocked records the client's position and returns the bytes freed.
func (s *memStream) ackLocked(seq uint64) int64 {
	seq = min(seq, s.log.head)
	s.acked = max(s.acked, seq)
	// The client says it holds nothing past seq: what was written to an
	// earlier connection past that point never arrived.
	if s.delivered > seq {
		s.log.undeliver(seq)
		s.delivered = seq
	}
	return s.evictLocked(s.sess.store.now(), s.sess.store.Limits().ResumeWindow)
}

// evict drops the events at the front that policy allows to go, returning
// the bytes freed.
func (s *memStream) evict(now time.Time, window time.Duration) int64 {
	s.mu.Lock()
	n := s.evictLocked(now, window)
	s.mu.Unlock()
	s.sess.store.budget.release(s, n)
	return n
}

func (s *memStream) evictLocked(now time.Time, window time.Duration) int64 {
	var readerNext uint64
	if s.reader != nil {
		readerNext = s.reader.next
	}
	upTo := s.log.evictable(s.acked, readerNext, false, now, window)
	var freed int64
	if upTo >= s.log.floor {
		s.sess.store.counters.EventsEvicted.Add(upTo - s.log.floor + 1)
		freed = s.log.evict(upTo)
	}
	s.evictFrom.Store(s.evictFromLocked())
	return freed
}

// evictFromLocked is evictFrom as the log stands.
func (s *memStream) evictFromLocked() int64 {
	if s.reader != nil {
		return 0
	}
	if s.log.floor > s.log.head {
		return math.MaxInt64
	}
	if at := s.log.deliveredAt(s.log.floor); at != 0 {
		return at
	}
	return math.MaxInt64
}

// sweepDue reports whether the sweeper may find something to evict here
// at now with window.
func (s *memStream) sweepDue(now int64, window time.Duration) bool {
	from := s.evictFrom.Load()
	return from == 0 || from != math.MaxInt64 && now-from >= int64(window)
}

// retirable reports whether an ended stream holds nothing a client could
// still get: its record may go.
func (s *memStream) retirable() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.state != policy.Live && s.log.floor > s.log.head && s.reader == nil
}

func (s *memStream) Attach(from uint64) (Reader, error) {
	s.mu.Lock()
	r, old, err := s.attachLocked(from)
	s.mu.Unlock()
	s.afterAttach(r, old)
	if err != nil {
		return nil, err
	}
	return r, nil
}

func (s *memStream) attachLocked(from uint64) (r, old *memReader, err error) {
	if from == FromUndelivered {
		from = max(s.delivered+1, s.log.floor)
	}
	if from < s.log.floor {
		return nil, nil, ErrBelowFloor
	}
	if s.sess.ctx.Err() != nil {
		return nil, nil, ErrSessionGone
	}
	s.opened.Store(true)
	old = s.reader
	r = &memReader{s: s, next: from, done: make(chan struct{}), notify: make(chan struct{}, 1)}
	s.reader = r
	s.attached.Store(true)
	s.evictFrom.Store(0)
	return r, old, nil
}

// afterAttach does, without the stream lock, what attaching entails.
func (s *memStream) afterAttach(r, old *memReader) {
	if r == nil {
		return
	}
	s.sess.connected.Add(1)
	s.sess.Touch()
	if old != nil {
		old.close(ErrTakenOver)
	}
}

func (s *memStream) info() StreamInfo {
	s.mu.Lock()
	si := StreamInfo{
		Num: s.num, Kind: s.kind.String(), State: s.state.String(), FailReason: string(s.failReason),
		Floor: s.log.floor, Head: s.log.head, Acked: s.acked, Connected: s.reader != nil,
		Producing: s.producing.Load(), Stalled: s.stalled.Load(), Stalls: s.stalls.Load(),
	}
	for _, r := range s.requests {
		si.RequestIDs = append(si.RequestIDs, r.ID)
	}
	s.mu.Unlock()
	s.sess.store.budget.mu.Lock()
	si.Bytes = s.bytes
	s.sess.store.budget.mu.Unlock()
	return si
}
