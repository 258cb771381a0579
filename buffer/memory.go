package buffer

import (
	"context"
	"io"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dgraph-io/ristretto/v2"

	"github.com/mcpresume/caddy-mcp-resume/internal/eventid"
	"github.com/mcpresume/caddy-mcp-resume/policy"
)

// EventOverhead is counted against the byte bounds for every retained event
// on top of its payload's capacity: the entry, its slice header and its ID
// line. Bounds then hold on real memory, not just payload (less the
// allocator's rounding to size classes, at most about 12%).
const EventOverhead = 64

// Hooks let the embedding layer log and meter what the store decides on its
// own. Any of them may be nil. They are called without store locks held.
type Hooks struct {
	StallStarted func(session string, stream uint32)
	StallEnded   func(session string, stream uint32, waited time.Duration)
	StreamFailed func(session string, stream uint32, reason policy.Reason)
	SessionEnded func(session string, reason policy.Reason)
	// EvictedBeforeAck fires if an event left a log while a client could still
	// ask for it. It never should.
	EvictedBeforeAck func(session string, stream uint32, seq uint64)
}

// Options configure a memory store.
type Options struct {
	Limits Limits
	Hooks  Hooks
	// SweepInterval is how often eviction and idle expiry run. Default 500ms,
	// so memory returns within about a second of becoming evictable.
	SweepInterval time.Duration
	// TombstoneTTL is how long ended sessions are remembered. Default 1h.
	TombstoneTTL time.Duration
	// Now is the clock; tests replace it. Default time.Now.
	Now func() time.Time
}

// MemoryStore is the in-process Store.
type MemoryStore struct {
	opts     Options
	now      func() time.Time
	counters Counters

	ctx       context.Context
	cancel    context.CancelFunc
	wg        sync.WaitGroup
	closeOnce sync.Once

	mu       sync.RWMutex
	sessions map[string]*memSession
	limits   Limits
	tombs    *ristretto.Cache[string, Tombstone]

	// bmu guards byte accounting across all logs, so a bound check and the
	// reservation that follows are one step.
	bmu     sync.Mutex
	total   int64
	holding int           // sessions with bytes > 0
	freed   chan struct{} // closed (and replaced) whenever bytes are released
}

var _ Store = (*MemoryStore)(nil)

// NewMemoryStore starts a store and its sweeper.
func NewMemoryStore(opts Options) *MemoryStore {
	if opts.SweepInterval <= 0 {
		opts.SweepInterval = 500 * time.Millisecond
	}
	if opts.TombstoneTTL <= 0 {
		opts.TombstoneTTL = time.Hour
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	tombs, err := ristretto.NewCache(&ristretto.Config[string, Tombstone]{
		NumCounters: 1 << 17, // ~10x the entries it keeps
		MaxCost:     1 << 14, // entries (cost 1 each): losing one only makes a late answer less precise
		BufferItems: 64,
	})
	if err != nil {
		panic(err) // only on an invalid static config
	}
	ctx, cancel := context.WithCancel(context.Background())
	st := &MemoryStore{
		opts:     opts,
		now:      opts.Now,
		ctx:      ctx,
		cancel:   cancel,
		sessions: make(map[string]*memSession),
		limits:   opts.Limits,
		tombs:    tombs,
		freed:    make(chan struct{}),
	}
	st.wg.Add(1)
	go st.sweepLoop()
	return st
}

func (st *MemoryStore) sweepLoop() {
	defer st.wg.Done()
	t := time.NewTicker(st.opts.SweepInterval)
	defer t.Stop()
	for {
		select {
		case <-st.ctx.Done():
			return
		case <-t.C:
			st.Sweep()
		}
	}
}

// Sweep evicts what has become evictable and expires idle sessions. The
// sweeper calls it periodically; tests call it after moving their clock.
func (st *MemoryStore) Sweep() {
	now := st.now()
	lim := st.Limits()
	st.mu.RLock()
	list := make([]*memSession, 0, len(st.sessions))
	for _, s := range st.sessions {
		list = append(list, s)
	}
	st.mu.RUnlock()
	for _, s := range list {
		if lim.SessionIdleTimeout > 0 && s.connected.Load() == 0 &&
			now.Sub(time.Unix(0, s.lastActive.Load())) >= lim.SessionIdleTimeout {
			st.Delete(s.id, policy.ReasonExpired)
			continue
		}
		for _, str := range s.streamList() {
			str.evict(now, lim.ResumeWindow)
		}
	}
}

// Counters returns the store's counters.
func (st *MemoryStore) Counters() *Counters { return &st.counters }

// Limits returns the current limits.
func (st *MemoryStore) Limits() Limits {
	st.mu.RLock()
	defer st.mu.RUnlock()
	return st.limits
}

// SetLimits applies new limits (on config reload) to existing and new logs.
func (st *MemoryStore) SetLimits(l Limits) {
	st.mu.Lock()
	st.limits = l
	st.mu.Unlock()
	st.release(0) // wake appenders: a bound may have grown
}

// NewSession implements Store.
func (st *MemoryStore) NewSession(id string, meta SessionMeta) (Session, error) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if _, ok := st.sessions[id]; ok {
		return nil, ErrSessionExists
	}
	if st.limits.MaxSessions > 0 && len(st.sessions) >= st.limits.MaxSessions {
		return nil, ErrTooManySessions
	}
	ctx, cancel := context.WithCancel(st.ctx)
	s := &memSession{
		store:   st,
		id:      id,
		epoch:   eventid.NewEpoch(),
		meta:    meta,
		created: st.now(),
		ctx:     ctx,
		cancel:  cancel,
		streams: make(map[uint32]*memStream),
	}
	s.lastActive.Store(s.created.UnixNano())
	st.sessions[id] = s
	st.tombs.Del(id)
	return s, nil
}

// Session implements Store.
func (st *MemoryStore) Session(id string) (Session, bool) {
	st.mu.RLock()
	s, ok := st.sessions[id]
	st.mu.RUnlock()
	if !ok {
		return nil, false
	}
	return s, true
}

// Tombstone implements Store.
func (st *MemoryStore) Tombstone(id string) (Tombstone, bool) {
	return st.tombs.Get(id)
}

// Delete implements Store.
func (st *MemoryStore) Delete(id string, reason policy.Reason) bool {
	st.mu.Lock()
	s, ok := st.sessions[id]
	if ok {
		delete(st.sessions, id)
	}
	st.mu.Unlock()
	if !ok {
		return false
	}
	st.tombs.SetWithTTL(id, Tombstone{Epoch: s.epoch, Fingerprint: s.meta.Fingerprint, Reason: reason}, 1, st.opts.TombstoneTTL)
	st.tombs.Wait()
	s.end(reason)
	if h := st.opts.Hooks.SessionEnded; h != nil {
		h(id, reason)
	}
	return true
}

// Close implements Store. It may be called more than once.
func (st *MemoryStore) Close() { st.closeOnce.Do(st.close) }

func (st *MemoryStore) close() {
	st.mu.RLock()
	ids := make([]string, 0, len(st.sessions))
	for id := range st.sessions {
		ids = append(ids, id)
	}
	st.mu.RUnlock()
	for _, id := range ids {
		st.Delete(id, policy.ReasonDeleted)
	}
	st.cancel()
	st.wg.Wait()
	st.tombs.Close()
}

// Sessions implements Store.
func (st *MemoryStore) Sessions() []SessionInfo {
	st.mu.RLock()
	list := make([]*memSession, 0, len(st.sessions))
	for _, s := range st.sessions {
		list = append(list, s)
	}
	st.mu.RUnlock()
	out := make([]SessionInfo, 0, len(list))
	for _, s := range list {
		out = append(out, s.Info())
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Created.Before(out[j].Created) })
	return out
}

// Stats implements Store.
func (st *MemoryStore) Stats() Stats {
	st.mu.RLock()
	list := make([]*memSession, 0, len(st.sessions))
	for _, s := range st.sessions {
		list = append(list, s)
	}
	st.mu.RUnlock()
	var out Stats
	out.Sessions = len(list)
	for _, s := range list {
		out.Connected += int(s.connected.Load())
		for _, str := range s.streamList() {
			out.Streams++
			if str.producing.Load() {
				out.Producing++
				str.mu.Lock()
				if str.reader == nil {
					out.Detached++
				}
				str.mu.Unlock()
			}
			if str.stalled.Load() {
				out.StalledStreams++
			}
		}
	}
	st.bmu.Lock()
	out.RetainedBytes = st.total
	st.bmu.Unlock()
	return out
}

// reserve takes size bytes for a stream, blocking while the policy says so.
func (st *MemoryStore) reserve(ctx context.Context, s *memStream, size int64) error {
	var stallStart time.Time
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
		if !stallStart.IsZero() {
			waited := st.now().Sub(stallStart)
			s.stalled.Store(false)
			st.counters.StallNanos.Add(uint64(waited))
			if h := st.opts.Hooks.StallEnded; h != nil {
				h(s.sess.id, s.num, waited)
			}
		}
	}()
	for {
		lim := st.Limits()
		var stalledFor time.Duration
		if !stallStart.IsZero() {
			stalledFor = st.now().Sub(stallStart)
		}
		st.bmu.Lock()
		b := policy.Budget{
			StreamBytes: s.bytes, StreamMax: lim.MaxStreamBytes,
			SessionBytes: s.sess.bytes, SessionMax: lim.MaxSessionBytes,
			TotalBytes: st.total, TotalMax: lim.MaxTotalBytes,
			Sessions: st.holding,
		}
		if s.sess.bytes == 0 {
			b.Sessions++ // this session is about to hold bytes
		}
		switch policy.DecideAppend(b, size, stalledFor, lim.StallTimeout) {
		case policy.Append:
			if s.sess.bytes == 0 {
				st.holding++
			}
			s.bytes += size
			s.sess.bytes += size
			st.total += size
			st.bmu.Unlock()
			return nil
		case policy.FailTooLarge:
			st.bmu.Unlock()
			return &FailedError{Reason: policy.ReasonTooLarge}
		case policy.FailStalled:
			st.bmu.Unlock()
			return &FailedError{Reason: policy.ReasonStalled}
		}
		freed := st.freed
		st.bmu.Unlock()
		// Room may be owed already: events whose window passed since the
		// last sweep. Take it now rather than wait for the sweeper, so a
		// stream sustains max_stream_bytes per resume_window, not less.
		if st.evictSession(s.sess, lim.ResumeWindow) > 0 {
			continue
		}
		if stallStart.IsZero() {
			stallStart = st.now()
			s.stalled.Store(true)
			st.counters.Stalls.Add(1)
			if h := st.opts.Hooks.StallStarted; h != nil {
				h(s.sess.id, s.num)
			}
			timer = time.NewTimer(lim.StallTimeout)
		}
		select {
		case <-freed:
		case <-timer.C:
			timer.Reset(time.Millisecond) // re-decide promptly; the policy fails it
		case <-ctx.Done():
			return ctx.Err()
		case <-s.done:
			return ErrStreamEnded
		}
	}
}

// release returns bytes to the budget and wakes blocked appenders.
func (st *MemoryStore) release(n int64, owners ...*memStream) {
	st.bmu.Lock()
	for _, s := range owners {
		s.bytes -= n
		before := s.sess.bytes
		s.sess.bytes -= n
		if before > 0 && s.sess.bytes == 0 {
			st.holding--
		}
	}
	if len(owners) > 0 {
		st.total -= n
	}
	close(st.freed)
	st.freed = make(chan struct{})
	st.bmu.Unlock()
}

// ---- sessions ------------------------------------------------------------

type memSession struct {
	store   *MemoryStore
	id      string
	epoch   string
	meta    SessionMeta
	created time.Time
	ctx     context.Context
	cancel  context.CancelFunc

	lastActive atomic.Int64 // unix nanos
	connected  atomic.Int32 // attached readers

	bytes int64 // guarded by store.bmu

	mu         sync.Mutex
	streams    map[uint32]*memStream
	nextStream uint32
	standalone *memStream
	ended      bool
}

func (s *memSession) ID() string               { return s.id }
func (s *memSession) Epoch() string            { return s.epoch }
func (s *memSession) Meta() SessionMeta        { return s.meta }
func (s *memSession) Context() context.Context { return s.ctx }
func (s *memSession) Touch()                   { s.lastActive.Store(s.store.now().UnixNano()) }

func (s *memSession) streamList() []*memStream {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]*memStream, 0, len(s.streams))
	for _, str := range s.streams {
		out = append(out, str)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].num < out[j].num })
	return out
}

func (s *memSession) NewStream(kind policy.StreamKind, requestIDs []string) (Stream, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.newStreamLocked(kind, requestIDs)
}

func (s *memSession) newStreamLocked(kind policy.StreamKind, requestIDs []string) (*memStream, error) {
	if s.ended {
		return nil, ErrSessionGone
	}
	if max := s.store.Limits().MaxStreamsPerSession; max > 0 {
		active := 0
		for _, str := range s.streams {
			if str.active() {
				active++
			}
		}
		if active >= max {
			return nil, ErrTooManyStreams
		}
	}
	s.nextStream++
	str := &memStream{
		sess:       s,
		num:        s.nextStream,
		kind:       kind,
		requestIDs: requestIDs,
		floor:      1,
		notify:     make(chan struct{}),
		done:       make(chan struct{}),
	}
	s.streams[str.num] = str
	return str, nil
}

func (s *memSession) Stream(num uint32) (Stream, bool) {
	s.mu.Lock()
	str, ok := s.streams[num]
	s.mu.Unlock()
	if !ok {
		return nil, false
	}
	return str, true
}

func (s *memSession) ActiveStreams() int {
	n := 0
	for _, str := range s.streamList() {
		if str.active() {
			n++
		}
	}
	return n
}

func (s *memSession) Standalone() (Stream, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.standalone != nil && s.standalone.View().State != policy.Failed {
		return s.standalone, nil
	}
	str, err := s.newStreamLocked(policy.StandaloneStream, nil)
	if err != nil {
		return nil, err
	}
	s.standalone = str
	return str, nil
}

func (s *memSession) Info() SessionInfo {
	info := SessionInfo{
		ID:           s.id,
		Epoch:        s.epoch,
		Version:      s.meta.Version,
		Created:      s.created,
		LastActivity: time.Unix(0, s.lastActive.Load()),
		Connected:    int(s.connected.Load()),
	}
	for _, str := range s.streamList() {
		si := str.info()
		info.Bytes += si.Bytes
		info.Streams = append(info.Streams, si)
	}
	return info
}

// end stops everything in the session and frees its events.
func (s *memSession) end(reason policy.Reason) {
	s.mu.Lock()
	s.ended = true
	s.mu.Unlock()
	s.cancel()
	for _, str := range s.streamList() {
		str.end(reason)
	}
}

// ---- streams ---------------------------------------------------------------

type entry struct {
	seq         uint64
	data        []byte
	deliveredAt int64 // unix nanos; 0 = not delivered
}

type memStream struct {
	sess       *memSession
	num        uint32
	kind       policy.StreamKind
	requestIDs []string

	producing atomic.Bool
	stalled   atomic.Bool

	bytes int64 // guarded by store.bmu

	mu          sync.Mutex
	events      []entry // events[0].seq == floor
	floor, head uint64
	acked       uint64
	delivered   uint64 // highest seq delivered (and not un-delivered by an ack)
	responseSeq uint64
	state       policy.StreamState
	failReason  policy.Reason
	reader      *memReader
	waiting     bool          // a reader waits on notify
	notify      chan struct{} // closed when events arrive or the state changes
	done        chan struct{} // closed when the stream ends
}

func (s *memStream) Num() uint32             { return s.num }
func (s *memStream) Kind() policy.StreamKind { return s.kind }
func (s *memStream) RequestIDs() []string    { return s.requestIDs }

func (s *memStream) ClaimProducer() bool { return s.producing.CompareAndSwap(false, true) }
func (s *memStream) Producing() bool     { return s.producing.Load() }

func (s *memStream) ReleaseProducer() {
	s.mu.Lock()
	s.producing.Store(false)
	s.wakeLocked() // a caught-up standalone reader ends (ErrProducerGone)
	s.mu.Unlock()
}

// active streams count against MaxStreamsPerSession. Ended streams do not:
// what they still retain is bounded by the byte limits, and counting them
// would cap a session's call rate at the limit per resume window.
func (s *memStream) active() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.state == policy.Live
}

func (s *memStream) wakeLocked() {
	if s.waiting {
		close(s.notify)
		s.notify = make(chan struct{})
		s.waiting = false
	}
}

func (s *memStream) Append(ctx context.Context, data []byte, response bool) (uint64, error) {
	st := s.sess.store
	select {
	case <-s.done:
		return 0, ErrStreamEnded
	default:
	}
	size := int64(cap(data)) + EventOverhead
	if err := st.reserve(ctx, s, size); err != nil {
		if fe, ok := err.(*FailedError); ok {
			s.Fail(fe.Reason)
		}
		return 0, err
	}
	s.mu.Lock()
	if s.state != policy.Live {
		s.mu.Unlock()
		st.release(size, s)
		return 0, ErrStreamEnded
	}
	s.head++
	seq := s.head
	s.events = append(s.events, entry{seq: seq, data: data})
	if response && s.responseSeq == 0 {
		s.responseSeq = seq
	}
	s.wakeLocked()
	s.mu.Unlock()
	st.counters.EventsEnqueued.Add(1)
	return seq, nil
}

func (s *memStream) Complete() { s.finish(policy.Complete, "") }

func (s *memStream) Fail(reason policy.Reason) {
	if s.finish(policy.Failed, reason) {
		s.sess.store.counters.addFailed(reason)
		if h := s.sess.store.opts.Hooks.StreamFailed; h != nil {
			h(s.sess.id, s.num, reason)
		}
	}
}

func (s *memStream) finish(state policy.StreamState, reason policy.Reason) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.state != policy.Live {
		return false
	}
	s.state, s.failReason = state, reason
	close(s.done)
	s.wakeLocked()
	return true
}

// end drops a stream with its session: every event is evictable now.
func (s *memStream) end(reason policy.Reason) {
	if s.finish(policy.Failed, reason) {
		s.sess.store.counters.addFailed(reason)
	}
	s.mu.Lock()
	n := s.dropLocked(len(s.events), policy.EventView{SessionDeleted: true}, time.Time{}, 0)
	r := s.reader
	s.reader = nil
	s.mu.Unlock()
	if r != nil {
		r.close(ErrSessionGone)
	}
	if n > 0 {
		s.sess.store.release(n, s)
	}
}

func (s *memStream) View() policy.StreamView {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.viewLocked()
}

func (s *memStream) viewLocked() policy.StreamView {
	return policy.StreamView{Kind: s.kind, State: s.state, Floor: s.floor, Head: s.head, ResponseSeq: s.responseSeq}
}

func (s *memStream) Ack(seq uint64) {
	s.mu.Lock()
	n := s.ackLocked(seq)
	s.mu.Unlock()
	if n > 0 {
		s.sess.store.release(n, s)
	}
}

// ackLocked records the client's position and returns the bytes freed.
func (s *memStream) ackLocked(seq uint64) int64 {
	if seq > s.head {
		seq = s.head
	}
	if seq > s.acked {
		s.acked = seq
	}
	// The client says it holds nothing past seq: what was written to an
	// earlier connection past that point never arrived.
	if s.delivered > seq {
		for i := range s.events {
			if s.events[i].seq > seq {
				s.events[i].deliveredAt = 0
			}
		}
		s.delivered = seq
	}
	return s.evictLocked(s.sess.store.now(), s.sess.store.Limits().ResumeWindow)
}

func (s *memStream) Resume(cursor uint64, decide func(policy.StreamView) policy.Resume) (policy.Resume, Reader, error) {
	s.mu.Lock()
	d := decide(s.viewLocked())
	switch d.Kind {
	case policy.Noop, policy.Replay, policy.Gap:
	default:
		s.mu.Unlock()
		return d, nil, nil
	}
	freed := s.ackLocked(cursor)
	var r, old *memReader
	var err error
	if d.Kind != policy.Gap || d.Then != policy.ThenError {
		r, old, err = s.attachLocked(d.From)
	}
	s.mu.Unlock()
	if freed > 0 {
		s.sess.store.release(freed, s)
	}
	s.afterAttach(r, old)
	if r == nil {
		return d, nil, err
	}
	return d, r, nil
}

// evict drops the events at the front that policy allows to go.
func (s *memStream) evict(now time.Time, window time.Duration) int64 {
	s.mu.Lock()
	n := s.evictLocked(now, window)
	s.mu.Unlock()
	if n > 0 {
		s.sess.store.release(n, s)
	}
	return n
}

// evictSession evicts what policy allows from every stream of a session and
// returns the bytes freed.
func (st *MemoryStore) evictSession(sess *memSession, window time.Duration) int64 {
	now := st.now()
	var n int64
	for _, str := range sess.streamList() {
		n += str.evict(now, window)
	}
	return n
}

// SessionCount returns the number of sessions held, without walking them.
func (st *MemoryStore) SessionCount() int {
	st.mu.RLock()
	defer st.mu.RUnlock()
	return len(st.sessions)
}

func (s *memStream) evictLocked(now time.Time, window time.Duration) int64 {
	k := 0
	for k < len(s.events) {
		e := &s.events[k]
		v := policy.EventView{Seq: e.seq, Acked: s.acked}
		if e.deliveredAt != 0 {
			v.DeliveredAt = time.Unix(0, e.deliveredAt)
		}
		if !policy.Evictable(v, now, window) {
			break // in order: the floor only moves up
		}
		k++
	}
	return s.dropLocked(k, policy.EventView{Acked: s.acked}, now, window)
}

// dropLocked removes the first k events and returns the bytes they held. It
// re-checks each against the policy: an event that was not evictable is
// counted and reported, so a bug that loses history cannot stay silent.
func (s *memStream) dropLocked(k int, base policy.EventView, now time.Time, window time.Duration) int64 {
	var freed int64
	st := s.sess.store
	for i := 0; i < k; i++ {
		e := &s.events[i]
		v := base
		v.Seq = e.seq
		if e.deliveredAt != 0 {
			v.DeliveredAt = time.Unix(0, e.deliveredAt)
		}
		if !policy.Evictable(v, now, window) {
			st.counters.EventsEvictedBeforeAck.Add(1)
			if h := st.opts.Hooks.EvictedBeforeAck; h != nil {
				h(s.sess.id, s.num, e.seq)
			}
		}
		freed += int64(cap(e.data)) + EventOverhead
		e.data = nil // let the payload go even while the backing array lives
	}
	if k > 0 {
		s.events = s.events[k:]
		if len(s.events) == 0 {
			s.events = nil
		}
		s.floor += uint64(k)
		st.counters.EventsEvicted.Add(uint64(k))
	}
	return freed
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
		from = max(s.delivered+1, s.floor)
	}
	if from < s.floor {
		return nil, nil, ErrBelowFloor
	}
	if s.sess.ctx.Err() != nil {
		return nil, nil, ErrSessionGone
	}
	old = s.reader
	r = &memReader{s: s, next: from, done: make(chan struct{})}
	s.reader = r
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
		Floor: s.floor, Head: s.head, Acked: s.acked, Connected: s.reader != nil,
		Producing: s.producing.Load(), Stalled: s.stalled.Load(), RequestIDs: s.requestIDs,
	}
	s.mu.Unlock()
	s.sess.store.bmu.Lock()
	si.Bytes = s.bytes
	s.sess.store.bmu.Unlock()
	return si
}

// ---- readers ---------------------------------------------------------------

type memReader struct {
	s    *memStream
	next uint64

	once sync.Once
	done chan struct{}
	err  error // why done closed; set before close
}

func (r *memReader) Done() <-chan struct{} { return r.done }

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
	}
	s.mu.Unlock()
	r.close(io.ErrClosedPipe)
}

func (r *memReader) Read(ctx context.Context, buf []Event) ([]Event, error) {
	s := r.s
	buf = buf[:0]
	for {
		select {
		case <-r.done:
			return buf, r.err
		default:
		}
		s.mu.Lock()
		if r.next < s.floor {
			s.mu.Unlock()
			return buf, ErrBelowFloor
		}
		if r.next <= s.head {
			i := int(r.next - s.floor)
			for ; i < len(s.events) && len(buf) < cap(buf); i++ {
				buf = append(buf, Event{Seq: s.events[i].seq, Data: s.events[i].data})
			}
			r.next += uint64(len(buf))
			s.mu.Unlock()
			return buf, nil
		}
		switch s.state {
		case policy.Complete:
			s.mu.Unlock()
			return buf, io.EOF
		case policy.Failed:
			reason := s.failReason
			s.mu.Unlock()
			return buf, &FailedError{Reason: reason}
		}
		if s.kind == policy.StandaloneStream && !s.producing.Load() {
			s.mu.Unlock()
			return buf, ErrProducerGone
		}
		s.waiting = true
		ch := s.notify
		s.mu.Unlock()
		select {
		case <-ch:
		case <-r.done:
		case <-ctx.Done():
			return buf, ctx.Err()
		}
	}
}

func (r *memReader) Delivered(seq uint64) {
	s := r.s
	now := s.sess.store.now().UnixNano()
	s.mu.Lock()
	if s.reader == r && seq > s.delivered {
		start := s.delivered + 1
		if start < s.floor {
			start = s.floor
		}
		for q := start; q <= seq && q <= s.head; q++ {
			s.events[q-s.floor].deliveredAt = now
		}
		s.delivered = seq
	}
	s.mu.Unlock()
}
