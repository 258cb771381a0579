package natsstore

import (
	"cmp"
	"context"
	"errors"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/buffer"
	"github.com/mcpresume/caddy-mcp-resume/policy"
)

// session is this replica's handle of one session incarnation. What it
// knows lives in the zone's records; the handle holds what is local: the
// context detached upstream reads use, and the stream handles.
type session struct {
	st      *Store
	id      string
	sh      string // subject token
	epoch   string
	inc     string // <sh>.<epoch>: keys of its streams begin with it
	meta    buffer.SessionMeta
	created time.Time
	ctx     context.Context
	cancel  context.CancelFunc

	touched atomic.Int64 // unix nanos of the last activity written

	mu      sync.Mutex
	streams map[uint32]*stream
	writers map[*stream]struct{} // streams with a writer here, until they end
}

var _ buffer.Session = (*session)(nil)

func newSession(st *Store, rec *sessionRecord) *session {
	s := &session{st: st, id: rec.ID, sh: sessionToken(rec.ID), epoch: rec.Epoch, meta: rec.meta(),
		created: time.Unix(0, rec.Created), streams: make(map[uint32]*stream), writers: make(map[*stream]struct{})}
	s.inc = s.sh + "." + s.epoch
	s.ctx, s.cancel = context.WithCancel(st.ctx)
	s.touched.Store(rec.LastActive)
	return s
}

func (s *session) ID() string               { return s.id }
func (s *session) Epoch() string            { return s.epoch }
func (s *session) Context() context.Context { return s.ctx }

// record is the session's record, if the zone still holds this incarnation.
func (s *session) record() (*sessionRecord, bool) {
	r, _, ok := s.st.sessions.get(s.sh)
	if !ok || r.Epoch != s.epoch {
		return nil, false
	}
	return r, true
}

func (s *session) gone() bool {
	if s.ctx.Err() != nil {
		return true
	}
	_, ok := s.record()
	return !ok
}

// goneInKV is gone, asking KV when the mirror still holds the record: a
// deletion under way on another replica may not have reached this one's
// watch yet.
func (s *session) goneInKV(ctx context.Context) bool {
	if s.gone() {
		return true
	}
	_, _, err := s.st.sessions.fetch(ctx, s.sh)
	if errors.Is(err, errNotFound) {
		return true
	}
	return err == nil && s.gone() // a new incarnation replaced it
}

func (s *session) Meta() buffer.SessionMeta {
	if r, ok := s.record(); ok {
		return r.meta()
	}
	return s.meta
}

func (s *session) Past(epoch string) (buffer.Past, bool) {
	if r, ok := s.record(); ok {
		for _, p := range r.Past {
			if p.Epoch == epoch {
				return p, true
			}
		}
	}
	return buffer.Past{}, false
}

func (s *session) NextStream() uint32 {
	if r, ok := s.record(); ok {
		return r.NextStream
	}
	return 1
}

func (s *session) Standalone() buffer.Stream {
	return s.stream(policy.StandaloneNum, policy.StandaloneStream)
}

// stream returns the handle of stream num (made on first use).
func (s *session) stream(num uint32, kind policy.StreamKind) *stream {
	s.mu.Lock()
	defer s.mu.Unlock()
	if str := s.streams[num]; str != nil {
		return str
	}
	str := newStream(s, num, kind)
	s.streams[num] = str
	s.st.byKey.Store(str.key, str)
	if s.ctx.Err() != nil {
		str.end(buffer.ErrSessionGone)
	}
	return str
}

// addWriter records that str has a writer here.
func (s *session) addWriter(str *stream) {
	s.mu.Lock()
	s.writers[str] = struct{}{}
	s.mu.Unlock()
}

// liveWriters returns the streams with a writer here whose records say
// they are live; the others it forgets.
func (s *session) liveWriters() []*stream {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]*stream, 0, len(s.writers))
	for str := range s.writers {
		if rec, ok := str.record(); ok && rec.State == policy.Live {
			out = append(out, str)
		} else {
			delete(s.writers, str)
		}
	}
	return out
}

// forget drops the handle of a stream whose record is gone, so a session
// making calls for hours does not keep a handle for each.
func (s *session) forget(str *stream) {
	s.mu.Lock()
	if s.streams[str.num] == str {
		delete(s.streams, str.num)
	}
	delete(s.writers, str)
	s.mu.Unlock()
	s.st.byKey.CompareAndDelete(str.key, str)
}

// streamList returns the stream handles made here, standalone first.
func (s *session) streamList() []*stream {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.SortedFunc(maps.Values(s.streams), func(a, b *stream) int { return cmp.Compare(a.num, b.num) })
}

// liveRequests counts the session's live request streams, on any replica.
func (s *session) liveRequests() int {
	return s.st.incs.liveRequests(s.inc)
}

func (s *session) AdmitStream() bool {
	return policy.AdmitStream(s.liveRequests(), s.st.Limits().MaxStreamsPerSession)
}

// NewStream implements buffer.Session. The stream's number comes from a
// compare-and-set on the session record, so replicas never hand out one
// twice; its producer lease is taken before its record exists, so no
// sweeper takes it for a stream whose producer died.
func (s *session) NewStream(ids []string, key [32]byte) (buffer.Stream, error) {
	str, _, err := s.newStream(ids, key, false)
	if err != nil {
		return nil, err
	}
	return str, nil
}

// OpenCall implements buffer.CallOpener: NewStream, TakeProducer and
// Attach(1) in turn, the reader entered in the stream record as it is
// created (one write where NewStream and Attach made two: issue 23).
func (s *session) OpenCall(ctx context.Context, ids []string, key [32]byte) (buffer.Stream, buffer.Producer, buffer.Reader, error) {
	str, r, err := s.newStream(ids, key, true)
	if err != nil {
		return nil, nil, nil, err
	}
	p, err := str.TakeProducer(ctx)
	if err != nil {
		// The record names a reader no one will read: it leaves.
		str.attached(r)
		r.Close()
		return str, nil, nil, err
	}
	// Attached with its producer here: the writer feeds it, as Attach after
	// TakeProducer does.
	str.attached(r)
	return str, p, r, nil
}

// newStream is NewStream; with attach, the record it creates names a
// reader from seq 1, returned (not yet attached here: see attached).
func (s *session) newStream(ids []string, key [32]byte, attach bool) (*stream, *reader, error) {
	st := s.st
	if s.gone() {
		return nil, nil, buffer.ErrSessionGone
	}
	if !policy.AdmitStream(s.liveRequests(), st.Limits().MaxStreamsPerSession) {
		return nil, nil, buffer.ErrTooManyStreams
	}
	ctx, cancel := st.opCtx()
	defer cancel()
	var num uint32
	_, err := st.sessions.update(ctx, s.sh, func(r *sessionRecord) error {
		if r.Epoch != s.epoch {
			return errNotFound
		}
		num = r.NextStream
		r.NextStream++
		return nil
	})
	if errors.Is(err, errNotFound) {
		return nil, nil, buffer.ErrSessionGone
	}
	if err != nil {
		st.fault("new_stream", err)
		return nil, nil, err
	}
	skey := streamKey(s.sh, s.epoch, num)
	if ok, err := st.acquire(skey, nil); !ok {
		if err == nil {
			err = errors.New("natsstore: the new stream's lease is taken")
		}
		return nil, nil, err
	}
	rec := &streamRecord{Kind: policy.RequestStream, Floor: 1, Key: key[:], Opened: true, Created: time.Now().UnixNano(),
		Producer: st.opts.ReplicaID}
	for _, id := range ids {
		rec.Requests = append(rec.Requests, policy.RequestView{ID: id})
	}
	str := s.stream(num, policy.RequestStream)
	var r *reader
	if attach {
		if r, err = str.attachTo(rec, 1); err != nil {
			st.release(skey)
			s.forget(str)
			return nil, nil, err
		}
	}
	if _, err := st.streams.create(ctx, skey, rec); err != nil {
		st.release(skey)
		s.forget(str)
		st.fault("new_stream", err)
		return nil, nil, err
	}
	str.fresh.Store(true)
	st.keepLease(skey, str.producing.Load)
	if s.gone() {
		return nil, nil, buffer.ErrSessionGone
	}
	return str, r, nil
}

func (s *session) Stream(num uint32) (buffer.Stream, bool) {
	str, err := s.LookupStream(num)
	return str, err == nil && str != nil
}

// LookupStream implements buffer.StreamLookup.
func (s *session) LookupStream(num uint32) (buffer.Stream, error) {
	if num == policy.StandaloneNum {
		return s.Standalone(), nil
	}
	key := streamKey(s.sh, s.epoch, num)
	if _, _, ok := s.st.streams.get(key); !ok {
		// Opened on another replica a moment ago, or retired.
		ctx, cancel := context.WithTimeout(s.st.ctx, 2*time.Second)
		_, _, err := s.st.streams.lookupErr(ctx, key)
		cancel()
		switch {
		case errors.Is(err, errNotFound):
			return nil, nil
		case err != nil:
			s.st.fault(opStreamRead, err)
			return nil, err
		}
	}
	return s.stream(num, policy.RequestStream), nil
}

// opStreamRead is the failed read of a stream record a resume named
// (OnError's op).
const opStreamRead = "stream_read"

// StreamByKey implements buffer.Session: the latest stream of the request.
func (s *session) StreamByKey(key [32]byte) (buffer.Stream, bool) {
	found := s.st.incs.latest(s.inc, key[:])
	if found == 0 {
		return nil, false
	}
	return s.stream(found, policy.RequestStream), true
}

func (s *session) Confirm() {
	r, ok := s.record()
	if !ok || r.Origin != policy.Adopted || r.Confirmed {
		return
	}
	ctx, cancel := s.st.opCtx()
	defer cancel()
	confirmed := false
	_, err := s.st.sessions.update(ctx, s.sh, func(r *sessionRecord) error {
		confirmed = false
		if r.Epoch != s.epoch || r.Confirmed {
			return errUnchanged
		}
		r.Confirmed, confirmed = true, true
		return nil
	})
	s.st.fault("confirm", err)
	if err == nil && confirmed {
		// It moves to the others' share of max_sessions.
		now := *r
		now.Confirmed = true
		s.st.tallyChanged(r, -1)
		s.st.tallyChanged(&now, 1)
	}
}

// Rebind implements buffer.Session: the record every replica mirrors
// carries the new binding.
func (s *session) Rebind(c buffer.Credential) error {
	ctx, cancel := s.st.opCtx()
	defer cancel()
	_, err := s.st.sessions.update(ctx, s.sh, func(r *sessionRecord) error {
		if r.Epoch != s.epoch {
			return errNotFound
		}
		r.setCredential(c)
		return nil
	})
	switch {
	case errors.Is(err, errNotFound):
		return buffer.ErrSessionGone
	case err != nil:
		s.st.fault("rebind", err)
	}
	return err
}

// Touch implements buffer.Session. It writes at most once per tenth of the
// idle timeout; the sweeper allows for that before it expires a session,
// so a session never expires early.
func (s *session) Touch() {
	now := time.Now().UnixNano()
	slack := int64(s.st.Limits().SessionIdleTimeout / 10)
	if last := s.touched.Load(); now-last < slack || !s.touched.CompareAndSwap(last, now) {
		return
	}
	ctx, cancel := s.st.opCtx()
	defer cancel()
	_, err := s.st.sessions.update(ctx, s.sh, func(r *sessionRecord) error {
		if r.Epoch != s.epoch {
			return errUnchanged
		}
		r.LastActive = max(r.LastActive, now)
		return nil
	})
	if err != nil && !errors.Is(err, errNotFound) {
		s.st.fault("touch", err)
	}
}

func (s *session) info() buffer.SessionInfo {
	if r, ok := s.record(); ok {
		return s.st.sessionInfo(r)
	}
	return buffer.SessionInfo{ID: s.id, Epoch: s.epoch, Version: s.meta.Version, Origin: s.meta.Origin.String(),
		Created: s.created}
}

// producing reports whether this replica still feeds a stream of it.
func (s *session) producing() bool {
	for _, str := range s.streamList() {
		if str.producing.Load() {
			return true
		}
	}
	return false
}

// flush waits until the producers here have stored what they accepted.
func (s *session) flush() {
	for _, str := range s.streamList() {
		str.currentWriter().waitStored(s.st.endTimeout())
	}
}

// end stops everything of the session here: it ended (err is
// ErrSessionGone). Readers end, appends stop, the context is cancelled.
func (s *session) end(err error) {
	s.cancel()
	for _, str := range s.streamList() {
		str.end(err)
	}
}

// leave is what a closing store does with a session that lives on: its
// producers are flushed, live request streams failed (their clients learn
// it on any replica), readers ended, leases released.
func (s *session) leave() {
	for _, str := range s.streamList() {
		str.leave()
	}
	s.cancel()
	for _, str := range s.streamList() {
		str.end(buffer.ErrSessionGone)
	}
}
