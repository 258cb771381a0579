package buffer

import (
	"context"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/policy"
)

// Bounds on what a session remembers besides its retained events.
const (
	// EndedStreamsKept is how many ended request streams with nothing left
	// retained a session keeps the record of (their requests and answers),
	// so a late resume of one gets a precise answer. Older ones are retired;
	// a resume of a retired stream gets a gap.
	EndedStreamsKept = 64
	// MaxPastStreams bounds the request streams a tombstone remembers.
	MaxPastStreams = 64
	// maxPast bounds the earlier incarnations a session remembers.
	maxPast = 4
)

// memSession is one session of a MemoryStore.
type memSession struct {
	store   *MemoryStore
	id      string
	epoch   string
	meta    SessionMeta
	created time.Time
	ctx     context.Context
	cancel  context.CancelFunc

	adopted    atomic.Bool                // policy.Adopted until a resume confirms it
	lastActive atomic.Int64               // unix nanos
	connected  atomic.Int32               // attached readers
	cred       atomic.Pointer[Credential] // meta.Credential as Rebind left it; nil: as created

	bytes int64 // capacity held by its logs, guarded by store.budget.mu

	mu         sync.Mutex
	standalone *memStream
	streams    map[uint32]*memStream // request streams held
	byKey      map[[32]byte]*memStream
	ended      []*memStream // ended request streams still held, oldest first
	nextStream uint32       // the next request stream's number (from 1)
	live       int          // live request streams
	past       []Past       // earlier incarnations, newest first
	closed     bool
}

func (s *memSession) ID() string               { return s.id }
func (s *memSession) Epoch() string            { return s.epoch }
func (s *memSession) Context() context.Context { return s.ctx }
func (s *memSession) Standalone() Stream       { return s.standalone }
func (s *memSession) Touch()                   { s.lastActive.Store(s.store.now().UnixNano()) }

func (s *memSession) Meta() SessionMeta {
	m := s.meta
	if c := s.cred.Load(); c != nil {
		m.Credential = *c
	}
	if m.Origin == policy.Adopted && !s.adopted.Load() {
		m.Origin = policy.Resumed
	}
	return m
}

func (s *memSession) Rebind(c Credential) error {
	if s.ctx.Err() != nil {
		return ErrSessionGone
	}
	s.cred.Store(&c)
	return nil
}

func (s *memSession) Past(epoch string) (Past, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, p := range s.past {
		if p.Epoch == epoch {
			return p, true
		}
	}
	return Past{}, false
}

func (s *memSession) Confirm() {
	if s.adopted.CompareAndSwap(true, false) {
		s.store.confirmed()
	}
}

func (s *memSession) NextStream() uint32 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.nextStream
}

// dueStreams appends to dst the session's streams the sweeper may find
// something to evict in at now with window (in no order).
func (s *memSession) dueStreams(dst []*memStream, now int64, window time.Duration) []*memStream {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.standalone.sweepDue(now, window) {
		dst = append(dst, s.standalone)
	}
	for _, str := range s.streams {
		if str.sweepDue(now, window) {
			dst = append(dst, str)
		}
	}
	return dst
}

// streamList returns the session's streams, the standalone stream first.
func (s *memSession) streamList() []*memStream {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]*memStream, 0, len(s.streams)+1)
	for _, str := range s.streams {
		out = append(out, str)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].num < out[j].num })
	return append([]*memStream{s.standalone}, out...)
}

func (s *memSession) NewStream(ids []string, key [32]byte) (Stream, error) {
	lim := s.store.Limits()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, ErrSessionGone
	}
	if !policy.AdmitStream(s.live, lim.MaxStreamsPerSession) {
		return nil, ErrTooManyStreams
	}
	str := newStream(s, s.nextStream, policy.RequestStream, ids, key, maxChunk(lim))
	s.nextStream++
	s.live++
	s.streams[str.num] = str
	s.byKey[key] = str
	return str, nil
}

func (s *memSession) AdmitStream() bool {
	lim := s.store.Limits()
	s.mu.Lock()
	defer s.mu.Unlock()
	return policy.AdmitStream(s.live, lim.MaxStreamsPerSession)
}

func (s *memSession) Stream(num uint32) (Stream, bool) {
	if num == policy.StandaloneNum {
		return s.standalone, true
	}
	s.mu.Lock()
	str, ok := s.streams[num]
	s.mu.Unlock()
	if !ok {
		return nil, false
	}
	return str, true
}

func (s *memSession) StreamByKey(key [32]byte) (Stream, bool) {
	s.mu.Lock()
	str, ok := s.byKey[key]
	s.mu.Unlock()
	if !ok {
		return nil, false
	}
	return str, true
}

// streamEnded moves a request stream from the live ones to the ended ones.
func (s *memSession) streamEnded(str *memStream) {
	s.mu.Lock()
	if _, held := s.streams[str.num]; held && !s.closed {
		s.live--
		s.ended = append(s.ended, str)
	}
	s.mu.Unlock()
}

// retire drops the records of ended streams with EndedStreamsKept or more
// ended after them that hold nothing a client could still get: never one
// of the newest EndedStreamsKept, also while an older one cannot go yet.
func (s *memSession) retire() {
	s.mu.Lock()
	defer s.mu.Unlock()
	keep := s.ended[:0]
	mayRetire := len(s.ended) - EndedStreamsKept // s.ended is in end order
	for i, str := range s.ended {
		if i < mayRetire && str.retirable() {
			delete(s.streams, str.num)
			if s.byKey[str.key] == str {
				delete(s.byKey, str.key)
			}
			continue
		}
		keep = append(keep, str)
	}
	clear(s.ended[len(keep):])
	s.ended = keep
}

func (s *memSession) info() SessionInfo {
	info := SessionInfo{
		ID:           s.id,
		Epoch:        s.epoch,
		Version:      s.meta.Version,
		Origin:       s.Meta().Origin.String(),
		Created:      s.created,
		LastActivity: time.Unix(0, s.lastActive.Load()),
		Connected:    int(s.connected.Load()),
	}
	for _, str := range s.streamList() {
		if !str.opened.Load() {
			continue // a standalone stream no client ever asked for
		}
		si := str.info()
		info.Bytes += si.Bytes
		info.Streams = append(info.Streams, si)
	}
	return info
}

// end stops everything in the session, frees its events and returns what a
// tombstone should remember of it.
func (s *memSession) end(reason policy.Reason) Past {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	s.cancel()
	p := Past{Epoch: s.epoch, Reason: reason, Streams: make(map[uint32]policy.StreamView)}
	list := s.streamList()
	for i := len(list) - 1; i >= 0; i-- {
		str := list[i]
		if str.kind == policy.RequestStream && len(p.Streams) < MaxPastStreams {
			if v, owed := str.owed(); owed {
				p.Streams[str.num] = v
			}
		}
		str.end(reason)
	}
	return p
}

// owed returns the stream's view if a client may lack an answer from it:
// one is pending, or was sent after what the client acknowledged.
func (s *memStream) owed() (policy.StreamView, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, r := range s.requests {
		if r.AnsweredAt == 0 || r.AnsweredAt > s.acked {
			v := s.viewLocked()
			v.Floor = v.Head + 1 // nothing of it is retained any more
			return v, true
		}
	}
	return policy.StreamView{}, false
}

// maxChunk sizes a stream's chunks for the stream bound: at most an eighth
// of it, at most 64 KiB.
func maxChunk(l Limits) int {
	return int(min(max(l.MaxStreamBytes/8, minChunk), 64<<10))
}
