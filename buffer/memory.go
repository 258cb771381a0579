package buffer

import (
	"context"
	"crypto/rand"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/internal/eventid"
	"github.com/mcpresume/caddy-mcp-resume/policy"
)

// Options configure a memory store.
type Options struct {
	Limits Limits
	Hooks  Hooks
	// Key keys credential fingerprints and epochs. If empty, a random key is
	// made: epochs minted before a restart then no longer verify.
	Key []byte
	// SweepInterval is how often eviction, idle expiry and tombstone expiry
	// run. Default 500ms, so memory returns within about a second of becoming
	// evictable.
	SweepInterval time.Duration
	// TombstoneTTL is how long ended sessions are remembered. Default 1h.
	TombstoneTTL time.Duration
	// MaxTombstones bounds how many ended sessions are remembered at once;
	// beyond it the oldest is forgotten early (and counted). Default
	// 4 x MaxSessions, at least 1024.
	MaxTombstones int
	// Now is the clock; tests replace it. Default time.Now.
	Now func() time.Time

	chunkSize int // tests: fixed chunk capacity (1: one chunk per event), for exact byte counts
}

// MemoryStore is the in-process Store.
//
// Lock order: MemoryStore.mu, then memSession.mu, then memStream.mu, then
// budget.mu. Hooks are called with no lock held. Byte counts (budget,
// memSession.bytes, memStream.bytes) are guarded by budget.mu alone.
type MemoryStore struct {
	opts     Options
	now      func() time.Time
	key      []byte
	counters Counters
	budget   budget
	// producers hold the producer roles (producer.go).
	producers producers

	reserveRounds atomic.Uint64 // decisions taken by blocked appends (tests watch for spinning)

	ctx       context.Context
	cancel    context.CancelFunc
	wg        sync.WaitGroup
	closeOnce sync.Once

	mu        sync.RWMutex
	sessions  map[string]*memSession
	counts    policy.SessionCounts // Sessions and Adopted held; MaxSessions from limits
	limits    Limits
	tombs     map[string]*Tombstone
	tombOrder []tombRef // tombstones by end time, oldest first; may hold stale refs
	// ending holds the sessions a Delete removed and has not yet given
	// their tombstone (it ends their streams meanwhile): closed when it has.
	ending map[string]chan struct{}
}

type tombRef struct {
	id    string
	ended time.Time
}

var _ Backend = (*MemoryStore)(nil)

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
	key := opts.Key
	if len(key) == 0 {
		key = make([]byte, 32)
		rand.Read(key)
	}
	ctx, cancel := context.WithCancel(context.Background())
	st := &MemoryStore{
		opts:     opts,
		now:      opts.Now,
		key:      key,
		budget:   newBudget(),
		ctx:      ctx,
		cancel:   cancel,
		sessions: make(map[string]*memSession),
		limits:   opts.Limits,
		tombs:    make(map[string]*Tombstone),
		ending:   make(map[string]chan struct{}),
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
			st.sweep()
		}
	}
}

// sweep evicts what has become evictable, retires spent stream records,
// expires idle sessions and old tombstones.
func (st *MemoryStore) sweep() {
	now := st.now()
	lim := st.Limits()
	var due []*memStream
	for _, s := range st.snapshot() {
		if lim.SessionIdleTimeout > 0 && s.connected.Load() == 0 &&
			now.Sub(time.Unix(0, s.lastActive.Load())) >= lim.SessionIdleTimeout {
			st.Delete(s.id, policy.ReasonExpired)
			continue
		}
		due = s.dueStreams(due[:0], now.UnixNano(), lim.ResumeWindow)
		for _, str := range due {
			str.evict(now, lim.ResumeWindow)
		}
		s.retire()
	}
	st.mu.Lock()
	st.dropTombstonesLocked(now, 0)
	st.mu.Unlock()
}

// snapshot returns the sessions held now.
func (st *MemoryStore) snapshot() []*memSession {
	st.mu.RLock()
	defer st.mu.RUnlock()
	list := make([]*memSession, 0, len(st.sessions))
	for _, s := range st.sessions {
		list = append(list, s)
	}
	return list
}

// Counters implements Inspector.
func (st *MemoryStore) Counters() *Counters { return &st.counters }

// Key implements Store.
func (st *MemoryStore) Key() []byte { return st.key }

// Limits returns the current limits.
func (st *MemoryStore) Limits() Limits {
	st.mu.RLock()
	defer st.mu.RUnlock()
	return st.limits
}

// SetLimits implements Store.
func (st *MemoryStore) SetLimits(l Limits) {
	st.mu.Lock()
	st.limits = l
	st.mu.Unlock()
	st.budget.wake() // a bound may have grown, a stall deadline moved
}

// deliveryQuantum is how finely delivery times are kept: a stream holds
// about 256 delivery records, and an event may stay up to a quantum longer
// than its window.
func (st *MemoryStore) deliveryQuantum() time.Duration {
	return max(st.Limits().ResumeWindow/256, time.Millisecond)
}

// CreateSession implements Store.
func (st *MemoryStore) CreateSession(id string, meta SessionMeta) (Session, error) {
	// A new incarnation takes the tombstone of the last one as its past:
	// the whole tombstone, so it waits for a Delete still ending it.
	st.mu.Lock()
	for ending := st.ending[id]; ending != nil; ending = st.ending[id] {
		st.mu.Unlock()
		<-ending
		st.mu.Lock()
	}
	defer st.mu.Unlock()
	if _, ok := st.sessions[id]; ok {
		return nil, ErrSessionExists
	}
	counts := st.counts
	counts.MaxSessions = st.limits.MaxSessions
	if !policy.AdmitSession(meta.Origin, counts) {
		return nil, ErrTooManySessions
	}
	var past []string // a new incarnation's epoch is none of these
	if t, ok := st.tombs[id]; ok {
		past = append(past, t.Past.Epoch)
		for _, p := range t.Earlier {
			past = append(past, p.Epoch)
		}
	}
	ctx, cancel := context.WithCancel(st.ctx)
	s := &memSession{
		store:      st,
		id:         id,
		epoch:      eventid.NewEpoch(st.key, id, past...),
		meta:       meta,
		created:    st.now(),
		ctx:        ctx,
		cancel:     cancel,
		streams:    make(map[uint32]*memStream),
		byKey:      make(map[[32]byte]*memStream),
		nextStream: 1,
	}
	s.standalone = newStream(s, policy.StandaloneNum, policy.StandaloneStream, nil, [32]byte{}, maxChunk(st.limits))
	s.adopted.Store(meta.Origin == policy.Adopted)
	s.lastActive.Store(s.created.UnixNano())
	if t, ok := st.tombs[id]; ok {
		delete(st.tombs, id)
		s.past = append([]Past{t.Past}, t.Earlier...)
		if len(s.past) > maxPast {
			s.past = s.past[:maxPast]
		}
	}
	st.sessions[id] = s
	st.countLocked(s.Meta().Origin, 1)
	return s, nil
}

// countLocked adds d to the count of sessions of origin o.
func (st *MemoryStore) countLocked(o policy.SessionOrigin, d int) {
	switch o {
	case policy.Adopted:
		st.counts.Adopted += d
	case policy.Untapped:
		st.counts.Untapped += d
	default:
		st.counts.Sessions += d
	}
}

// Admit implements Store.
func (st *MemoryStore) Admit(o policy.SessionOrigin) bool {
	st.mu.RLock()
	defer st.mu.RUnlock()
	c := st.counts
	c.MaxSessions = st.limits.MaxSessions
	return policy.AdmitSession(o, c)
}

// confirmed moves a session from the adopted share to the others.
func (st *MemoryStore) confirmed() {
	st.mu.Lock()
	st.countLocked(policy.Adopted, -1)
	st.countLocked(policy.Resumed, 1)
	st.mu.Unlock()
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

// StandaloneClosed implements Store.
func (st *MemoryStore) StandaloneClosed(ctx context.Context, id string) error {
	return st.producers.await(ctx, id)
}

// SessionInfo implements Inspector.
func (st *MemoryStore) SessionInfo(id string) (SessionInfo, bool) {
	st.mu.RLock()
	s, ok := st.sessions[id]
	st.mu.RUnlock()
	if !ok {
		return SessionInfo{}, false
	}
	return s.info(), true
}

// Tombstone implements Store. A session a Delete is ending has its
// tombstone once its streams ended, in a moment: Tombstone waits for it, so
// a request in between finds the session ended with what its streams owed
// (a resume gets the errors of the calls it lost), never unknown, nor ended
// with nothing remembered.
func (st *MemoryStore) Tombstone(id string) (Tombstone, bool) {
	st.mu.RLock()
	if ending := st.ending[id]; ending != nil {
		st.mu.RUnlock()
		<-ending
		st.mu.RLock()
	}
	defer st.mu.RUnlock()
	t, ok := st.tombs[id]
	if !ok {
		return Tombstone{}, false
	}
	return *t, true
}

// Delete implements Store.
func (st *MemoryStore) Delete(id string, reason policy.Reason) bool {
	st.mu.Lock()
	s, ok := st.sessions[id]
	var ending chan struct{}
	if ok {
		delete(st.sessions, id)
		st.countLocked(s.Meta().Origin, -1)
		// Until the tombstone below: a request in between must find the
		// session ended, never unknown (adopted under any credential), and
		// with its streams' past (Tombstone and CreateSession wait).
		ending = make(chan struct{})
		st.ending[id] = ending
	}
	st.mu.Unlock()
	if !ok {
		return false
	}
	p := s.end(reason)
	s.mu.Lock()
	earlier := append([]Past(nil), s.past...)
	s.mu.Unlock()
	if len(earlier) > maxPast-1 {
		earlier = earlier[:maxPast-1]
	}
	now := st.now()
	m := s.Meta()
	t := &Tombstone{Past: p, Fingerprint: m.Fingerprint, Bind: m.Bind, Credential: m.Credential, Endpoint: m.Endpoint,
		Version: m.Version, Ended: now, Earlier: earlier}
	st.mu.Lock()
	st.tombs[id] = t
	st.tombOrder = append(st.tombOrder, tombRef{id: id, ended: now})
	st.dropTombstonesLocked(now, st.maxTombstones())
	delete(st.ending, id)
	close(ending)
	st.mu.Unlock()
	if h := st.opts.Hooks.SessionEnded; h != nil {
		h(id, reason)
	}
	return true
}

func (st *MemoryStore) maxTombstones() int {
	if st.opts.MaxTombstones > 0 {
		return st.opts.MaxTombstones
	}
	return max(4*st.limits.MaxSessions, 1024)
}

// dropTombstonesLocked forgets tombstones older than the TTL and, when
// bound > 0, the oldest beyond bound (counted: they went before their time).
func (st *MemoryStore) dropTombstonesLocked(now time.Time, bound int) {
	i := 0
	for ; i < len(st.tombOrder); i++ {
		ref := st.tombOrder[i]
		t, ok := st.tombs[ref.id]
		if !ok || !t.Ended.Equal(ref.ended) {
			continue // consumed or replaced: a stale reference
		}
		expired := now.Sub(t.Ended) >= st.opts.TombstoneTTL
		if !expired && (bound <= 0 || len(st.tombs) <= bound) {
			break
		}
		delete(st.tombs, ref.id)
		if !expired {
			st.counters.TombstonesDropped.Add(1)
			if h := st.opts.Hooks.TombstoneDropped; h != nil {
				go h(ref.id) // hooks run without locks
			}
		}
	}
	st.tombOrder = st.tombOrder[i:]
	if len(st.tombOrder) > 2*len(st.tombs)+1024 { // stale references pile up: compact
		live := make([]tombRef, 0, len(st.tombs))
		for _, ref := range st.tombOrder {
			if t, ok := st.tombs[ref.id]; ok && t.Ended.Equal(ref.ended) {
				live = append(live, ref)
			}
		}
		st.tombOrder = live
	}
}

// Close implements Store. It may be called more than once.
func (st *MemoryStore) Close() { st.closeOnce.Do(st.close) }

func (st *MemoryStore) close() {
	for _, s := range st.snapshot() {
		st.Delete(s.id, policy.ReasonDeleted)
	}
	st.cancel()
	st.wg.Wait()
}

// Sessions implements Inspector.
func (st *MemoryStore) Sessions() []SessionInfo {
	list := st.snapshot()
	out := make([]SessionInfo, 0, len(list))
	for _, s := range list {
		out = append(out, s.info())
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Created.Before(out[j].Created) })
	return out
}

// Stats implements Inspector.
func (st *MemoryStore) Stats() Stats {
	list := st.snapshot()
	var out Stats
	out.Sessions = len(list)
	for _, s := range list {
		out.Connected += int(s.connected.Load())
		for _, str := range s.streamList() {
			if !str.opened.Load() {
				continue
			}
			out.Streams++
			if str.producing.Load() {
				out.Producing++
				if !str.attached.Load() {
					out.Detached++
				}
			}
			if str.stalled.Load() {
				out.StalledStreams++
			}
		}
	}
	st.budget.mu.Lock()
	out.RetainedBytes = st.budget.total
	st.budget.mu.Unlock()
	st.mu.RLock()
	out.Tombstones = len(st.tombs)
	st.mu.RUnlock()
	return out
}
