package natsstore

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/mcpresume/caddy-mcp-resume/buffer"
	"github.com/mcpresume/caddy-mcp-resume/internal/eventid"
	"github.com/mcpresume/caddy-mcp-resume/policy"
)

// maxPast bounds the earlier incarnations a session remembers, as the
// memory store's does.
const maxPast = 4

// opTimeout bounds one store operation's NATS round trips (with retries).
const opTimeout = 10 * time.Second

func (st *Store) opCtx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(st.ctx, opTimeout)
}

// session returns the record of session id, if the zone holds it.
func (st *Store) sessionRecord(id string) (*sessionRecord, uint64, bool) {
	rec, rev, ok := st.sessions.get(sessionToken(id))
	if !ok || rec.ID != id {
		return nil, 0, false
	}
	return rec, rev, true
}

// sessionCounts counts the zone's sessions as admission needs them.
func (st *Store) sessionCounts() policy.SessionCounts {
	var c policy.SessionCounts
	if st.interest.whole() {
		c = st.tally.counts() // the sessions mirror holds the zone's
	} else {
		c, _ = st.zone.counts() // tally.go
	}
	c.MaxSessions = st.Limits().MaxSessions
	return c
}

// sessionTally keeps the sessions mirror's counts by origin as its records
// change (the mirror's index hook), so admission, asked twice for every
// session created, does not walk every session (issue 23: a walk per
// creation was 2% of the proxy's CPU in session churn, and grows with the
// sessions held).
type sessionTally struct {
	n [3]atomic.Int64 // Sessions, Adopted, Untapped
}

func tallySlot(r *sessionRecord) int {
	switch r.origin() {
	case policy.Adopted:
		return 1
	case policy.Untapped:
		return 2
	}
	return 0
}

// changed is the sessions mirror's index: old is replaced by cur (either
// nil), under the mirror's lock.
func (t *sessionTally) changed(_ string, old, cur *sessionRecord) {
	if old != nil {
		t.n[tallySlot(old)].Add(-1)
	}
	if cur != nil {
		t.n[tallySlot(cur)].Add(1)
	}
}

func (t *sessionTally) counts() policy.SessionCounts {
	return policy.SessionCounts{Sessions: int(t.n[0].Load()), Adopted: int(t.n[1].Load()), Untapped: int(t.n[2].Load())}
}

// admissions counts this replica's session creations in flight, so that
// concurrent creates here cannot all pass admission on the same counts
// before any of them reaches the mirror.
type admissions struct {
	mu      sync.Mutex
	pending [4]int // by policy.SessionOrigin
}

// reserve decides admission on counts plus the creations in flight, and
// holds a place if admitted.
func (a *admissions) reserve(o policy.SessionOrigin, counts func() policy.SessionCounts) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	c := counts()
	c.Sessions += a.pending[policy.Initialized] + a.pending[policy.Resumed]
	c.Adopted += a.pending[policy.Adopted]
	c.Untapped += a.pending[policy.Untapped]
	if !policy.AdmitSession(o, c) {
		return false
	}
	a.pending[o]++
	return true
}

// release gives the place back once the session is in the mirror (or not
// created after all).
func (a *admissions) release(o policy.SessionOrigin) {
	a.mu.Lock()
	a.pending[o]--
	a.mu.Unlock()
}

// Admit implements buffer.Store. Across replicas it is as exact as the
// mirrors are current: two replicas may admit the last place at once.
func (st *Store) Admit(o policy.SessionOrigin) bool {
	return policy.AdmitSession(o, st.sessionCounts())
}

// CreateSession implements buffer.Store. The KV create decides between
// concurrent creates of one ID on any replicas.
func (st *Store) CreateSession(id string, meta buffer.SessionMeta) (buffer.Session, error) {
	sh := sessionToken(id)
	if rec, _, ok := st.sessions.get(sh); ok {
		if rec.ID == id {
			return nil, buffer.ErrSessionExists
		}
		return nil, fmt.Errorf("natsstore: session ID hash collision")
	}
	if !st.admitting.reserve(meta.Origin, st.sessionCounts) {
		return nil, buffer.ErrTooManySessions
	}
	defer st.admitting.release(meta.Origin)
	ctx, cancel := st.opCtx()
	defer cancel()
	now := time.Now().UnixNano()
	rec := &sessionRecord{ID: id, Version: meta.Version,
		Fingerprint: meta.Fingerprint[:], Bind: meta.Bind, Endpoint: meta.Endpoint, Origin: meta.Origin,
		Created: now, LastActive: now, NextStream: 1}
	rec.setCredential(meta.Credential)
	tomb, tombRev, hasTomb := st.tombstoneOf(ctx, sh)
	var past []string // a new incarnation's epoch is none of these
	if hasTomb && tomb.ID == id {
		rec.Past = append([]buffer.Past{tomb.Past}, tomb.Earlier...)
		for _, p := range rec.Past {
			past = append(past, p.Epoch)
		}
		if len(rec.Past) > maxPast {
			rec.Past = rec.Past[:maxPast]
		}
	}
	rec.Epoch = eventid.NewEpoch(st.Key(), id, past...)
	// The interest first: the records written next are of interest from
	// the moment they are (review 28: a forgetting of what is not, at a
	// scan's end, between the writes and the handle lost them for good).
	// A session made again (a tombstone named it) may still have an
	// earlier incarnation's standalone lease, which its producer awaits:
	// that is loaded.
	again := hasTomb && tomb.ID == id
	begun := st.interestIn(sh, again)
	created, undo := st.reserved(meta.Origin)
	failed := func() {
		undo()
		if begun {
			st.dropInterest(sh)
		}
	}
	// The standalone stream's record first, so a session never lacks it.
	skey := streamKey(sh, rec.Epoch, policy.StandaloneNum)
	if _, err := st.streams.create(ctx, skey, &streamRecord{Kind: policy.StandaloneStream, Floor: 1, Created: now}); err != nil {
		failed()
		st.fault("create_session", err)
		return nil, err
	}
	if _, err := st.sessions.create(ctx, sh, rec); err != nil {
		st.streams.remove(ctx, skey, 0)
		if errors.Is(err, jetstream.ErrKeyExists) {
			// The session exists: a concurrent creation of it here (two
			// requests adopting it at once) shares the interest, which
			// ends with the session record; dropped, the winner's handle
			// heard of no other replica's writes again (review 41). Begun
			// here, it is loaded as the session's first request would
			// (review 42).
			undo()
			if begun {
				st.loadBegun(sh)
				// Deleted before this interest could hear of it (review
				// 43's guard, failing under load): nothing would end it.
				// Asked on a context of its own (the creation's may be spent)
				// and briefly: unanswered, the interest's next load asks
				// again (review 47).
				lctx, lcancel := context.WithTimeout(st.ctx, 2*time.Second)
				_, _, err := st.sessions.lookupErr(lctx, sh)
				lcancel()
				switch {
				case errors.Is(err, errNotFound):
					st.dropInterest(sh)
				case err != nil:
					st.interestUnsure(sh)
				}
			}
			return nil, buffer.ErrSessionExists
		}
		failed()
		st.fault("create_session", err)
		return nil, err
	}
	created(rec)
	if hasTomb && tomb.ID == id {
		if err := st.tombs.remove(ctx, sh, tombRev); err == nil {
			st.tombChanged(-1)
		} else if !isWrongLast(err) {
			st.fault("tombstone", err) // consumed anyway: it expires with its TTL
		}
	}
	return st.handle(rec, again), nil
}

// handle returns this replica's handle of a session incarnation.
// load: what the buckets hold of it is read in, unless this replica is
// interested in the session already (see interestIn).
func (st *Store) handle(rec *sessionRecord, load bool) *session {
	sh := sessionToken(rec.ID)
	st.mu.Lock()
	h := st.handles[sh]
	if h != nil && h.epoch == rec.Epoch && h.ctx.Err() == nil {
		st.mu.Unlock()
		return h
	}
	old := h
	h = newSession(st, rec)
	st.handles[sh] = h
	st.mu.Unlock()
	if old != nil {
		old.end(buffer.ErrSessionGone) // an earlier incarnation
	}
	st.interestIn(sh, load)
	return h
}

// Session implements buffer.Store. A session this replica's mirror does
// not hold yet (created elsewhere a moment ago) is read from KV.
func (st *Store) Session(id string) (buffer.Session, bool) {
	s, err := st.LookupSession(id)
	return s, err == nil && s != nil
}

// LookupSession implements buffer.SessionLookup: a failed read of the
// session's record is an error, counted and logged (op session_read), not
// an unknown session.
func (st *Store) LookupSession(id string) (buffer.Session, error) {
	ctx, cancel := context.WithTimeout(st.ctx, 2*time.Second)
	defer cancel()
	rec, _, err := st.sessions.lookupErr(ctx, sessionToken(id))
	switch {
	case errors.Is(err, errNotFound):
		return nil, nil
	case err != nil:
		st.fault(opSessionRead, err)
		return nil, err
	case rec.ID != id:
		return nil, nil
	}
	return st.handle(rec, true), nil
}

// opSessionRead is the failed read of a session record that made the
// session look unknown here (OnError's op).
const opSessionRead = "session_read" // caddymodule logs it at WARN

// Tombstone implements buffer.Store. It reads through to KV on a miss:
// the watch that brings a tombstone is not ordered with the one that
// brings its session's end.
func (st *Store) Tombstone(id string) (buffer.Tombstone, bool) {
	ctx, cancel := context.WithTimeout(st.ctx, 2*time.Second)
	defer cancel()
	t, _, ok := st.tombstoneOf(ctx, sessionToken(id))
	if !ok || t.ID != id || time.Since(t.Ended) >= st.opts.TombstoneTTL {
		return buffer.Tombstone{}, false
	}
	return t.Tombstone, true
}

// tombstoneOf reads the tombstone of session token sh: from the mirror on
// the sweeping replica, which watches the bucket whole (reading through
// on a miss: the watch of sessions is not ordered with it), else from KV,
// not kept (no watch would keep it current).
func (st *Store) tombstoneOf(ctx context.Context, sh string) (*tombRecord, uint64, bool) {
	if st.interest.whole() {
		return st.tombs.lookup(ctx, sh)
	}
	return st.tombs.read(ctx, sh)
}

// Delete implements buffer.Store. The tombstone is written first, so at
// every moment a replica finds the session or its tombstone; then the
// conditional delete of the session record decides between concurrent
// deletes, and the replica that wins clears the session's streams. Every
// replica ends its handle when its mirror sees the record go.
func (st *Store) Delete(id string, reason policy.Reason) bool {
	return st.deleteWhen(id, reason, nil)
}

// expire deletes the session as idle, if it still is by KV's record: a
// sweep judges on the record as this replica holds it, which may lag a
// touch another replica wrote (review 28: a replica cut off from NATS for
// longer than the idle timeout expired a session in use on another). A
// touch written since, even after this one read it, makes the delete
// give up, and the tombstone it wrote goes again.
func (st *Store) expire(id string, idle time.Duration) bool {
	ctx, cancel := st.opCtx()
	defer cancel()
	if _, _, err := st.sessions.fetch(ctx, sessionToken(id)); err != nil {
		return false
	}
	return st.deleteWhen(id, policy.ReasonExpired, func(r *sessionRecord) bool {
		return time.Since(time.Unix(0, r.LastActive)) >= idle+idle/10
	})
}

// deleteWhen is Delete, of a record for which still holds (nil: any).
func (st *Store) deleteWhen(id string, reason policy.Reason, still func(*sessionRecord) bool) bool {
	sh := sessionToken(id)
	ctx, cancel := st.opCtx()
	defer cancel()
	// Read through: a session made elsewhere a moment ago may not have
	// reached this replica's watch yet.
	if rec, _, ok := st.sessions.lookup(ctx, sh); !ok || rec.ID != id {
		return false
	}
	st.interestIn(sh, true) // its streams are cleared by the replica that deletes it
	st.mu.Lock()
	h := st.handles[sh]
	st.mu.Unlock()
	if h != nil && h.id == id {
		h.flush() // what its producers here accepted counts in the end
	}
	var rec *sessionRecord
	var end sessionEnd
	var tombRev uint64 // the tombstone this wrote, while it is the last
	for round := 0; ; round++ {
		r, rev, ok := st.sessionRecord(id)
		if !ok {
			return false
		}
		if still != nil && !still(r) {
			if tombRev != 0 && st.tombs.remove(ctx, sh, tombRev) == nil {
				st.tombChanged(-1)
			}
			return false
		}
		end = st.ending(ctx, r, reason)
		if err := st.tombs.put(ctx, sh, end.tomb); err != nil {
			st.fault("tombstone", err)
			tombRev = 0
		} else {
			if tombRev == 0 {
				st.tombChanged(1)
			}
			_, tombRev, _ = st.tombs.get(sh)
		}
		err := st.sessions.remove(ctx, sh, rev)
		if err == nil {
			rec = r
			break
		}
		if !isWrongLast(err) || round > 20 {
			st.fault("delete_session", err)
			return false
		}
		// It changed meanwhile (a touch, a new stream): read it again.
		if _, _, err := st.sessions.fetch(ctx, sh); errors.Is(err, errNotFound) {
			return false
		}
	}
	st.counters.EventsEvicted.Add(end.evicted)
	for i := 0; i < end.failed; i++ {
		st.counters.AddFailed(reason)
	}
	st.tallyChanged(rec, -1)
	st.dropTombstones(ctx)
	if h != nil && h.epoch != rec.Epoch {
		h = nil
	}
	st.mu.Lock()
	if st.handles[sh] == h {
		delete(st.handles, sh)
	}
	st.mu.Unlock()
	if h != nil {
		h.end(buffer.ErrSessionGone)
	}
	st.clearIncarnation(ctx, sh+"."+rec.Epoch, end.keys, end.leases)
	if hk := st.opts.Hooks.SessionEnded; hk != nil {
		hk(id, reason)
	}
	return true
}

// sessionEnd is what ending a session leaves and counts.
type sessionEnd struct {
	tomb    *tombRecord
	keys    []string // its stream records
	leases  []string // and leases (the mirror forgets them with the session)
	evicted uint64   // events that go with it
	failed  int      // live request streams that fail with it
}

// ending works out what ending the session of rec leaves: the tombstone
// (its request streams whose answers a client may lack, newest first) and
// what goes.
func (st *Store) ending(ctx context.Context, rec *sessionRecord, reason policy.Reason) sessionEnd {
	sh := sessionToken(rec.ID)
	keys := st.streams.keysOf(sh + "." + rec.Epoch)
	sort.Slice(keys, func(i, j int) bool { return keyNum(keys[i]) > keyNum(keys[j]) })
	e := sessionEnd{keys: keys, leases: st.leases.keysOf(sh + "." + rec.Epoch)}
	past := buffer.Past{Epoch: rec.Epoch, Reason: reason, Streams: make(map[uint32]policy.StreamView)}
	for _, key := range keys {
		srec, _, ok := st.streams.get(key)
		if !ok {
			continue
		}
		head := srec.Head
		if srec.State == policy.Live {
			if last, err := st.lastMsg(ctx, st.names.subject(key)); err == nil && last != nil {
				head = max(head, last.last())
			}
			// A producer here knows what it stored (the record may lag it;
			// after a loss of NATS's data nothing else does).
			if v, ok := st.byKey.Load(key); ok {
				if h, ok := v.(*stream).currentWriter().storedHead(); ok {
					head = max(head, h)
				}
			}
			if srec.Kind == policy.RequestStream {
				e.failed++
			}
		}
		if head >= srec.Floor {
			e.evicted += head - srec.Floor + 1
		}
		if srec.Kind == policy.RequestStream && len(past.Streams) < buffer.MaxPastStreams {
			c := *srec
			c.Head = head
			if v, owed := c.owed(); owed {
				past.Streams[keyNum(key)] = v
			}
		}
	}
	earlier := rec.Past
	if len(earlier) > maxPast-1 {
		earlier = earlier[:maxPast-1]
	}
	meta := rec.meta()
	e.tomb = &tombRecord{ID: rec.ID, Tombstone: buffer.Tombstone{Past: past, Fingerprint: meta.Fingerprint,
		Bind: rec.Bind, Credential: meta.Credential, Endpoint: rec.Endpoint, Version: rec.Version, Ended: time.Now(), Earlier: earlier}}
	return e
}

// clearIncarnation removes what a deleted session incarnation left: its
// events, stream records and leases.
func (st *Store) clearIncarnation(ctx context.Context, inc string, keys, leases []string) {
	if err := st.purge(ctx, st.names.evPrefix+inc+".>", 0); err != nil {
		st.fault("purge", err)
	}
	for _, key := range keys {
		if err := st.streams.remove(ctx, key, 0); err != nil {
			st.fault("delete_stream", err)
		}
	}
	for _, key := range leases {
		if isStandaloneKey(key) {
			// Its holder releases it once its GET is closed (producer.go):
			// the next incarnation's producer waits for that.
			continue
		}
		st.release(key) // ours: stop renewing
		st.leases.remove(ctx, key, 0)
	}
	st.total.freed()
	st.freed.fire()
}

// dropTombstones forgets the oldest tombstones beyond MaxTombstones,
// counting each: they went before their time.
func (st *Store) dropTombstones(ctx context.Context) {
	bound := st.opts.maxTombstones(st.Limits())
	if !st.interest.whole() || st.tombs.count() <= bound {
		return // the sweeping replica holds the zone's tombstones, and bounds them
	}
	type tomb struct {
		key   string
		id    string
		ended time.Time
		rev   uint64
	}
	var list []tomb
	st.tombs.each(func(k string, t *tombRecord, rev uint64) { list = append(list, tomb{k, t.ID, t.Ended, rev}) })
	sort.Slice(list, func(i, j int) bool { return list[i].ended.Before(list[j].ended) })
	for _, t := range list[:max(len(list)-bound, 0)] {
		if err := st.tombs.remove(ctx, t.key, t.rev); err != nil {
			continue // changed meanwhile: consumed or replaced
		}
		st.counters.TombstonesDropped.Add(1)
		if h := st.opts.Hooks.TombstoneDropped; h != nil {
			h(t.id)
		}
	}
}

// SessionInfo implements buffer.Inspector.
func (st *Store) SessionInfo(id string) (buffer.SessionInfo, bool) {
	s, ok := st.Session(id)
	if !ok {
		return buffer.SessionInfo{}, false
	}
	return s.(*session).info(), true
}

// Sessions implements buffer.Inspector: the zone's sessions.
// A replica that does not sweep holds the stream records of the sessions
// it serves only: it reads the zone's for the list (one watch's initial
// values), an operator's request, not a call's.
func (st *Store) Sessions() []buffer.SessionInfo {
	sessions, recs := st.sessions, st.streams
	if !st.interest.whole() {
		ctx, cancel := st.opCtx()
		defer cancel()
		allSessions := newMirror[sessionRecord](st.sessions.kv, nil, nil)
		all := newMirror[streamRecord](st.streams.kv, incarnationOf, nil)
		if err := allSessions.loadAll(ctx); err != nil {
			st.fault("sessions", err) // the records this replica holds, then
		} else if err := all.loadAll(ctx); err != nil {
			st.fault("sessions", err)
		} else {
			sessions, recs = allSessions, all
		}
	}
	var out []buffer.SessionInfo
	sessions.each(func(_ string, r *sessionRecord, _ uint64) {
		out = append(out, st.sessionInfoFrom(r, recs))
	})
	sort.Slice(out, func(i, j int) bool { return out[i].Created.Before(out[j].Created) })
	return out
}

// Stats implements buffer.Inspector. Sessions and tombstones are the
// zone's: as the sweeper's last scan counted them (tally.go), with the
// changes made since here (and, near the bound, elsewhere). Streams,
// retained bytes and connections are those of the sessions this replica
// serves (interest.go), and Producing, Detached and StalledStreams its own
// upstream reads.
func (st *Store) Stats() buffer.Stats {
	var out buffer.Stats
	c, tombs := st.zone.counts()
	if st.interest.whole() {
		c, tombs = st.tally.counts(), st.tombs.count()
	}
	out.Sessions, out.Tombstones = c.Sessions+c.Adopted+c.Untapped, tombs
	out.Streams, out.RetainedBytes, out.Connected = st.streamStats(time.Now())
	for _, s := range st.handleList() {
		for _, str := range s.streamList() {
			if str.producing.Load() {
				out.Producing++
				if !str.Connected() {
					out.Detached++
				}
			}
			if str.stalled.Load() {
				out.StalledStreams++
			}
		}
	}
	return out
}

// streamStats counts the opened streams the mirrors hold, their retained
// bytes and those a client reads.
func (st *Store) streamStats(now time.Time) (streams int, retained int64, connected int) {
	st.streams.each(func(key string, r *streamRecord, _ uint64) {
		if !r.Opened {
			return
		}
		streams++
		retained += st.retainedOf(key, r)
		if r.readerAt(now, st.opts.LeaseTTL) != nil {
			connected++
		}
	})
	return streams, retained, connected
}

// retainedOf is what a stream holds against the bounds: exact if this
// replica produces it, else as its producer last recorded it.
func (st *Store) retainedOf(key string, r *streamRecord) int64 {
	if r.State != policy.Live {
		return r.retained() // its end wrote its exact head
	}
	if v, ok := st.byKey.Load(key); ok {
		if w := v.(*stream).currentWriter(); w != nil {
			if n, ok := w.retained(r); ok {
				return n
			}
		}
	}
	return r.retained()
}

func (st *Store) sessionInfo(r *sessionRecord) buffer.SessionInfo {
	return st.sessionInfoFrom(r, st.streams)
}

// sessionInfoFrom is sessionInfo with the stream records of recs.
func (st *Store) sessionInfoFrom(r *sessionRecord, recs *mirror[streamRecord]) buffer.SessionInfo {
	info := buffer.SessionInfo{ID: r.ID, Epoch: r.Epoch, Version: r.Version, Origin: r.origin().String(),
		Created: time.Unix(0, r.Created), LastActivity: time.Unix(0, r.LastActive)}
	inc := sessionToken(r.ID) + "." + r.Epoch
	keys := recs.keysOf(inc)
	sort.Slice(keys, func(i, j int) bool { return keyNum(keys[i]) < keyNum(keys[j]) })
	now := time.Now()
	for _, key := range keys {
		sr, _, ok := recs.get(key)
		if !ok || !sr.Opened {
			continue // a standalone stream no one used
		}
		si := st.streamInfo(key, sr, now)
		if si.Connected {
			info.Connected++
		}
		info.Bytes += si.Bytes
		info.Streams = append(info.Streams, si)
	}
	return info
}

func (st *Store) streamInfo(key string, r *streamRecord, now time.Time) buffer.StreamInfo {
	num := keyNum(key)
	si := buffer.StreamInfo{Num: num, Kind: r.Kind.String(), State: r.State.String(),
		FailReason: string(r.FailReason), Floor: r.Floor, Head: max(r.Head, r.Floor-1), Acked: r.Acked,
		Bytes: st.retainedOf(key, r), Connected: r.readerAt(now, st.opts.LeaseTTL) != nil}
	if v, ok := st.byKey.Load(key); ok {
		s := v.(*stream)
		si.Producing, si.Stalled, si.Stalls = s.producing.Load(), s.stalled.Load(), s.stalls.Load()
		if w := s.currentWriter(); w != nil {
			if h, ok := w.assigned(); ok {
				si.Head = max(si.Head, h)
			}
		}
	}
	if _, _, ok := st.leases.get(key); ok && r.Kind == policy.StandaloneStream {
		si.Producing = true
	}
	for _, q := range r.Requests {
		si.RequestIDs = append(si.RequestIDs, q.ID)
	}
	return si
}

func keyNum(key string) uint32 {
	_, n, _ := splitStreamKey(key)
	return n
}

// ---- reactions to the mirrors -----------------------------------------

// sessionChanged ends this replica's handle of a session that ended (or
// was replaced by a new incarnation) anywhere.
func (st *Store) sessionChanged(sh string, cur *sessionRecord) {
	if cur == nil {
		st.dropInterest(sh)
	}
	st.mu.Lock()
	h := st.handles[sh]
	if h == nil || cur != nil && cur.Epoch == h.epoch {
		st.mu.Unlock()
		return
	}
	delete(st.handles, sh)
	st.mu.Unlock()
	go h.end(buffer.ErrSessionGone) // not under the caller's locks
}

// streamChanged tells this replica's handle of a stream that its record
// changed: readers look for a takeover or the end, blocked appends decide
// again.
func (st *Store) streamChanged(key string, cur *streamRecord) {
	if v, ok := st.byKey.Load(key); ok {
		str := v.(*stream)
		str.recordChanged(cur)
		if cur == nil {
			str.sess.forget(str) // retired, or its session ended: the handle goes too
		}
	}
	st.freed.fire()
}

func (st *Store) leaseChanged(key string, _ *leaseRecord) {
	if v, ok := st.byKey.Load(key); ok {
		v.(*stream).leaseGen.Add(1)
		v.(*stream).changed.fire()
	}
}
