package natsstore

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// mirror is this replica's copy of one KV bucket, kept by a watch: reads
// are local, and every replica learns of every change within about a
// millisecond. Writes go to KV by compare-and-set (see update) and are
// applied here as soon as they succeed, so a replica reads its own writes.
// An entry only ever moves to a higher revision, so a late watch delivery
// never undoes a newer write.
type mirror[T any] struct {
	kv jetstream.KeyValue
	// group, if set, indexes keys by a prefix (streams by incarnation).
	group func(key string) string
	// changed is told of every applied change (cur nil: deleted). It runs
	// with no mirror lock held and must not block.
	changed func(key string, cur *T)
	// write, if set, is the compare-and-set of update (KeyValue.Update
	// otherwise): the store's, which reads acknowledgements cheaply, and
	// marks the message with tag (if not empty).
	write func(ctx context.Context, key string, value []byte, rev uint64, tag string) (uint64, error)
	// lastTag, if set, reads the tag and revision of the key's last write
	// (tag "" and rev 0: none): with write's tags, an update whose
	// acknowledgement was lost tells its own write from another's.
	lastTag func(ctx context.Context, key string) (string, uint64, error)
	// conn, if set, is done once the connection that writes go by now is
	// lost: a write's attempt then ends at once (see attempt). Unset on an
	// in-process connection, where updates and removals are not bounded.
	conn func() context.Context
	// createTTL and purge, if set, are createWithTTL's and remove's
	// writes (KeyValue.Create with a TTL and KeyValue.Purge otherwise),
	// the store's too.
	createTTL func(ctx context.Context, key string, value []byte, ttl time.Duration) (uint64, error)
	purge     func(ctx context.Context, key string, rev uint64, ttl time.Duration) (uint64, error)
	// notify, if set, is told of each write of this replica once it
	// succeeded and the mirror shows it (raw nil: a deletion, at the
	// marker's revision): the replicas interested in the key learn of it
	// from the store (interest.go), not from a watch of the whole bucket.
	notify func(key string, rev uint64, raw []byte)
	// unsure, if set, is told of a write whose outcome was unknown for a
	// while (an attempt failed other than by compare-and-set: a timeout,
	// a lost connection): it may have been stored without this replica
	// learning it, so without a notification (interest.go renotifies).
	unsure func(key string)
	// index, if set, is told of every applied change with the value it
	// replaces (nil: none), under the mirror's lock and in revision order:
	// it must be quick and use no mirror.
	index func(key string, old, cur *T)

	// markerTTL, if set, is how long JetStream keeps a deletion's marker
	// (the bucket has LimitMarkerTTL): deletions are purges that expire,
	// and leave nothing for tidy to remove (but a plain delete's marker,
	// from a replica of an earlier version).
	markerTTL time.Duration

	turns keyTurns // this replica's updates of a key, one at a time

	mu      sync.RWMutex
	entries map[string]*entry[T]
	// writing are this replica's writes under way, by key: a watch that
	// brings one back before its acknowledgement does takes the value
	// written instead of decoding it.
	writing map[string]written[T]
	groups  map[string]map[string]struct{}
	// bySession is every key held (deleted ones too) by the session token
	// it begins with: what a session's end forgets, without a walk of all.
	bySession map[string]map[string]struct{}
	live      int         // entries not deleted
	gone      []goneEntry // deletions, oldest first: what tidy forgets (and purges) in turn
}

type written[T any] struct {
	raw []byte
	val *T
	// counts: the write has an updateThen hook (what counts the change),
	// which must run before the mirror shows the change: its own
	// acknowledgement applies it, not a watch that brings it back first
	// (nor another replica's identical write).
	counts bool
}

// goneEntry is a key deleted at a time: tidy's queue.
type goneEntry struct {
	key string
	at  int64
}

type entry[T any] struct {
	rev  uint64
	val  *T     // nil: deleted
	raw  []byte // the value as stored, decoded afresh for each write
	gone int64  // unix nanos of the deletion
	seen int64  // unix nanos when this revision reached the mirror
	// Of a deletion: the value deleted, and whether the key went by its
	// TTL's expiry (or was found gone unseen) rather than a delete.
	prev    *T
	expired bool
	// byDelete: the marker is a plain delete's (a replica without
	// markerTTL made it), which stays in the bucket until tidy purges it.
	byDelete bool
}

func newMirror[T any](kv jetstream.KeyValue, group func(string) string, changed func(string, *T)) *mirror[T] {
	return &mirror[T]{kv: kv, group: group, changed: changed,
		entries: make(map[string]*entry[T]), groups: make(map[string]map[string]struct{}),
		bySession: make(map[string]map[string]struct{}), writing: make(map[string]written[T])}
}

// get returns the value at key (shared: never modify it) and its revision.
func (m *mirror[T]) get(key string) (*T, uint64, bool) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	e := m.entries[key]
	if e == nil || e.val == nil {
		return nil, 0, false
	}
	return e.val, e.rev, true
}

// lookup is get, reading through to KV when the mirror lacks the key:
// another replica may have written it a moment ago, and watches of
// different buckets are not ordered with each other. A miss costs a round
// trip; a read that fails transiently is tried again within ctx.
func (m *mirror[T]) lookup(ctx context.Context, key string) (*T, uint64, bool) {
	v, rev, err := m.lookupErr(ctx, key)
	return v, rev, err == nil
}

// lookupErr is lookup telling a miss (errNotFound) from a failed read.
func (m *mirror[T]) lookupErr(ctx context.Context, key string) (*T, uint64, error) {
	if v, rev, ok := m.get(key); ok {
		return v, rev, nil
	}
	v, rev, raw, err := m.readErr(ctx, key)
	if err != nil {
		return nil, 0, err
	}
	m.apply(key, rev, raw, v)
	if v, rev, ok := m.get(key); ok {
		return v, rev, nil
	}
	// A deletion newer than what KV answered reached the mirror meanwhile.
	return nil, 0, errNotFound
}

// confirm is get for a key that must not be taken as present on a stale
// copy: one that has not changed for maxAge is read from KV again. A key
// that expired while this replica's watch was cut off never reaches the
// watch (JetStream keeps the expiry's marker for seconds only), so without
// this it would stay in the mirror for good. When KV cannot be read, the
// mirror's copy stands.
func (m *mirror[T]) confirm(ctx context.Context, key string, maxAge time.Duration) (*T, bool) {
	m.mu.RLock()
	e := m.entries[key]
	stale := e != nil && e.val != nil && time.Since(time.Unix(0, e.seen)) >= maxAge
	var rev uint64
	if e != nil {
		rev = e.rev
	}
	m.mu.RUnlock()
	if stale {
		e, err := m.kv.Get(ctx, key)
		switch {
		case errors.Is(err, jetstream.ErrKeyNotFound), errors.Is(err, jetstream.ErrKeyDeleted):
			// Gone since rev: its expiry or deletion left a marker, so
			// anything written later has a revision above rev+1. Gone
			// unseen, as far as this mirror knows: taken as expired.
			m.applyAs(key, rev+1, nil, nil, true)
		case err == nil && e.Revision() > rev:
			v := new(T)
			if json.Unmarshal(e.Value(), v) == nil {
				m.apply(key, e.Revision(), e.Value(), v)
			}
		default:
			// Unchanged, or KV out of reach: ask again in maxAge, not on
			// every call meanwhile.
			m.mu.Lock()
			if e := m.entries[key]; e != nil && e.rev == rev {
				e.seen = time.Now().UnixNano()
			}
			m.mu.Unlock()
		}
	}
	v, _, ok := m.get(key)
	return v, ok
}

// keysOf returns the keys of a group.
func (m *mirror[T]) keysOf(group string) []string {
	m.mu.RLock()
	defer m.mu.RUnlock()
	g := m.groups[group]
	out := make([]string, 0, len(g))
	for k := range g {
		out = append(out, k)
	}
	return out
}

// each calls fn for every live entry, on a snapshot.
func (m *mirror[T]) each(fn func(key string, val *T, rev uint64)) {
	type kv struct {
		k   string
		v   *T
		rev uint64
	}
	m.mu.RLock()
	list := make([]kv, 0, m.live)
	for k, e := range m.entries {
		if e.val != nil {
			list = append(list, kv{k, e.val, e.rev})
		}
	}
	m.mu.RUnlock()
	for _, x := range list {
		fn(x.k, x.v, x.rev)
	}
}

func (m *mirror[T]) count() int {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return m.live
}

// apply records the value at key as of rev (raw nil: deleted) unless the
// mirror already holds that revision or a newer one.
func (m *mirror[T]) apply(key string, rev uint64, raw []byte, val *T) bool {
	return m.applyAs(key, rev, raw, val, false)
}

// applyAs is apply; expired tells a deletion by expiry from a delete.
func (m *mirror[T]) applyAs(key string, rev uint64, raw []byte, val *T, expired bool) bool {
	m.mu.Lock()
	e := m.entries[key]
	if e != nil && e.rev >= rev {
		m.mu.Unlock()
		return false
	}
	if e == nil {
		e = &entry[T]{}
		m.entries[key] = e
		sh := sessionOfKey(key)
		if m.bySession[sh] == nil {
			m.bySession[sh] = make(map[string]struct{})
		}
		m.bySession[sh][key] = struct{}{}
	}
	was, old := e.val != nil, e.val
	if val == nil && was {
		e.prev = e.val
	}
	if val != nil {
		e.prev = nil
	}
	e.expired = val == nil && expired
	e.byDelete = false
	e.rev, e.val, e.raw, e.seen = rev, val, raw, time.Now().UnixNano()
	if m.index != nil && (old != nil || val != nil) {
		m.index(key, old, val)
	}
	switch {
	case val != nil && !was:
		m.live++
		if m.group != nil {
			g := m.group(key)
			if m.groups[g] == nil {
				m.groups[g] = make(map[string]struct{})
			}
			m.groups[g][key] = struct{}{}
		}
	case val == nil && was:
		m.live--
		m.gone = append(m.gone, goneEntry{key, time.Now().UnixNano()})
		if m.group != nil {
			g := m.group(key)
			delete(m.groups[g], key)
			if len(m.groups[g]) == 0 {
				delete(m.groups, g)
			}
		}
	}
	if val == nil {
		e.gone = time.Now().UnixNano()
	}
	m.mu.Unlock()
	if m.changed != nil {
		m.changed(key, val)
	}
	return true
}

// due takes the deletions older than age off tidy's queue (at most max),
// forgetting them: until then they keep a late delivery of an older
// revision from bringing a key back. It returns those still deleted whose
// marker tidy must purge, with the revision of their delete marker as the
// mirror knows it; a key written again since is not among them, nor (with
// markerTTL) a marker that goes by itself: only a plain delete's.
func (m *mirror[T]) due(age time.Duration, max int) []keyRev {
	cut := time.Now().Add(-age).UnixNano()
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []keyRev
	n := 0
	for n < len(m.gone) && n < max && m.gone[n].at < cut {
		g := m.gone[n]
		n++
		if e := m.entries[g.key]; e != nil && e.val == nil {
			if m.markerTTL == 0 || e.byDelete {
				out = append(out, keyRev{g.key, e.rev})
			}
			m.drop(g.key)
		}
	}
	clear(m.gone[:n])
	m.gone = m.gone[n:]
	if len(m.gone) == 0 {
		m.gone = nil // let the array go
	}
	return out
}

type keyRev struct {
	key string
	rev uint64
}

// reset forgets every entry, as if each had been deleted (changed is told
// of each live one): the bucket lost them (see recover.go). Its watch must
// be stopped first, and started again after.
func (m *mirror[T]) reset() {
	m.mu.Lock()
	var live []string
	for k, e := range m.entries {
		if e.val != nil {
			live = append(live, k)
			if m.index != nil {
				m.index(k, e.val, nil)
			}
		}
	}
	m.entries, m.groups, m.live, m.gone = make(map[string]*entry[T]), make(map[string]map[string]struct{}), 0, nil
	m.mu.Unlock()
	if m.changed != nil {
		for _, k := range live {
			m.changed(k, nil)
		}
	}
}

// watch keeps the mirror until ctx ends; ready is closed once the bucket's
// initial values are in, done once the watch has stopped.
func (m *mirror[T]) watch(ctx context.Context, onErr func(error)) (ready, done <-chan struct{}, err error) {
	w, err := m.kv.WatchAll(ctx)
	if err != nil {
		return nil, nil, err
	}
	r, d := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(d)
		defer w.Stop()
		initial := true
		for {
			select {
			case <-ctx.Done():
				return
			case e, ok := <-w.Updates():
				if !ok {
					return
				}
				if e == nil {
					if initial {
						initial = false
						close(r)
					}
					continue
				}
				m.take(e, onErr)
			}
		}
	}()
	return r, d, nil
}

// take applies one watched entry.
func (m *mirror[T]) take(e jetstream.KeyValueEntry, onErr func(error)) {
	if e.Key() == probeKey {
		return // a replica's health probe, not a record
	}
	if e.Operation() != jetstream.KeyValuePut {
		// A key's TTL expiry reaches the watch as a purge marker (the
		// store never purges keys itself); a delete as a delete.
		m.applyAs(e.Key(), e.Revision(), nil, nil, e.Operation() == jetstream.KeyValuePurge)
		if e.Operation() == jetstream.KeyValueDelete {
			m.mu.Lock()
			if cur := m.entries[e.Key()]; cur != nil && cur.rev == e.Revision() && cur.val == nil {
				cur.byDelete = true
			}
			m.mu.Unlock()
		}
		return
	}
	m.applyRaw(e.Key(), e.Revision(), e.Value(), onErr)
}

// applyRaw applies a value as stored at rev (a watch's, a notification's),
// decoding it only if the mirror has nothing as new.
func (m *mirror[T]) applyRaw(key string, rev uint64, raw []byte, onErr func(error)) {
	m.mu.RLock()
	var cur uint64
	if e := m.entries[key]; e != nil {
		cur = e.rev
	}
	w, mine := m.writing[key]
	m.mu.RUnlock()
	if cur >= rev {
		return // this replica's own write, applied when it succeeded: nothing to decode
	}
	if mine && bytes.Equal(w.raw, raw) {
		if w.counts {
			return // its acknowledgement applies it, once what counts it has
		}
		m.apply(key, rev, w.raw, w.val) // its own write, back before its acknowledgement
		return
	}
	v := new(T)
	if err := json.Unmarshal(raw, v); err != nil {
		onErr(err)
		return
	}
	m.apply(key, rev, raw, v)
}

// forget drops the entries whose keys keep refuses, as if they had never
// been seen (changed is told of none: no handle here reads them): what a
// replica held of sessions it no longer serves, once a watch of the whole
// bucket stopped or its interest ended.
func (m *mirror[T]) forget(keep func(key string) bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for k, e := range m.entries {
		if !keep(k) {
			m.forgetEntry(k, e)
		}
	}
}

// forgetSession is forget of the keys of session sh (its token, and those
// that begin with it and a dot), found by the session index.
func (m *mirror[T]) forgetSession(sh string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for k := range m.bySession[sh] {
		if e := m.entries[k]; e != nil {
			m.forgetEntry(k, e)
		}
	}
}

// forgetEntry drops key k, whose entry is e; m.mu is held.
func (m *mirror[T]) forgetEntry(k string, e *entry[T]) {
	if e.val != nil {
		if m.index != nil {
			m.index(k, e.val, nil)
		}
		m.live--
		if m.group != nil {
			g := m.group(k)
			delete(m.groups[g], k)
			if len(m.groups[g]) == 0 {
				delete(m.groups, g)
			}
		}
	}
	m.drop(k)
}

// drop deletes key k from the entries and the session index; m.mu is held.
func (m *mirror[T]) drop(k string) {
	delete(m.entries, k)
	sh := sessionOfKey(k)
	if keys := m.bySession[sh]; keys != nil {
		delete(keys, k)
		if len(keys) == 0 {
			delete(m.bySession, sh)
		}
	}
}

// sessionOfKey is the session token a record's key begins with (a session
// record's key is the token itself).
func sessionOfKey(key string) string {
	sh, _, _ := strings.Cut(key, ".")
	return sh
}

// ---- writes ------------------------------------------------------------

// errUnchanged, returned by an update's change function, skips the write.
var errUnchanged = errors.New("unchanged")

// errNotFound: the key does not exist (or was deleted).
var errNotFound = errors.New("record not found")

// maxCASRounds bounds compare-and-set retries of one update; each round
// means another writer changed the record meanwhile.
const maxCASRounds = 200

// update changes the value at key by compare-and-set: change gets a fresh
// copy to modify, and may be called again if another writer got there
// first. It returns the value written (or the current one, if change
// returned errUnchanged), and change's own errors.
func (m *mirror[T]) update(ctx context.Context, key string, change func(*T) error) (*T, error) {
	return m.updateThen(ctx, key, change, nil)
}

// updateThen is update, with done run once the write succeeded and
// before this replica's mirror shows it: what counts the change (eviction)
// is counted before anyone here can see it happened.
//
// An attempt is bounded (updateAttempt, each later one given that much
// more): a write whose acknowledgement is lost with its connection is
// never answered, and held its caller the whole of ctx (a call's end seen
// by its clients 10 s late). Where the store tags its writes, an attempt
// whose outcome is unknown is looked for before the change is made again:
// found, it is the write (made again, the change would apply twice).
func (m *mirror[T]) updateThen(ctx context.Context, key string, change func(*T) error, done func(*T)) (*T, error) {
	if err := m.turns.take(ctx, key); err != nil {
		return nil, err
	}
	defer m.turns.done(key)
	ambiguous := false
	defer m.settle(key, &ambiguous)
	m.mu.RLock()
	e := m.entries[key]
	var raw []byte
	var rev uint64
	var cur *T
	if e != nil && e.val != nil {
		raw, rev, cur = e.raw, e.rev, e.val
	}
	m.mu.RUnlock()
	// unknown is the last attempt, if its outcome is unknown: its value
	// stays in writing until known, so a watch bringing it back meanwhile
	// leaves it to done's count (see written).
	var unknown *unknownWrite[T]
	defer func() {
		if unknown != nil {
			m.doneWriting(key, unknown.val)
		}
	}()
	for round := 0; ; round++ {
		if unknown != nil {
			nrev, ok, err := m.stored(ctx, key, unknown.tag)
			if err != nil {
				return nil, err
			}
			m.doneWriting(key, unknown.val)
			if ok {
				if done != nil {
					done(unknown.val)
				}
				m.written(key, nrev, unknown.raw, unknown.val)
				return unknown.val, nil
			}
			unknown = nil
		}
		if raw == nil || round > 0 {
			var err error
			if raw, rev, err = m.fetch(ctx, key); err != nil {
				return nil, err
			}
			cur = nil
		}
		// A fresh copy to change: cloned from the mirror's value where the
		// type can (the hot records), else decoded from what was stored.
		var v *T
		if c, ok := any(cur).(interface{ clone() *T }); ok && cur != nil {
			v = c.clone()
		} else {
			v = new(T)
			if err := json.Unmarshal(raw, v); err != nil {
				return nil, err
			}
		}
		err := change(v)
		if errors.Is(err, errUnchanged) {
			return v, nil
		}
		if err != nil {
			return nil, err
		}
		b, err := json.Marshal(v)
		if err != nil {
			return nil, err
		}
		m.mu.Lock()
		m.writing[key] = written[T]{b, v, done != nil}
		m.mu.Unlock()
		var nrev uint64
		var tag string
		if m.write != nil && m.conn != nil {
			if m.lastTag != nil {
				tag = newWriteTag()
			}
			nrev, _, err = m.attempt(ctx, updateAttempt*time.Duration(round+1), func(ctx context.Context) (uint64, error) {
				return m.write(ctx, key, b, rev, tag)
			})
		} else if m.write != nil {
			nrev, err = m.write(ctx, key, b, rev, "") // in-process: no reply is lost
		} else {
			nrev, err = m.kv.Update(ctx, key, b, rev)
		}
		lost := tag != "" && err != nil && !errors.Is(err, jetstream.ErrKeyRevisionMismatch) && !errors.Is(err, jetstream.ErrKeyExists) && !isWrongLast(err)
		if !lost {
			m.doneWriting(key, v)
		}
		if err == nil {
			if done != nil {
				done(v)
			}
			m.written(key, nrev, b, v)
			return v, nil
		}
		if !errors.Is(err, jetstream.ErrKeyRevisionMismatch) && !errors.Is(err, jetstream.ErrKeyExists) && !isWrongLast(err) {
			ambiguous = true
			if lost {
				unknown = &unknownWrite[T]{tag: tag, raw: b, val: v}
			}
			if !transient(err) || round >= maxCASRounds {
				return nil, err
			}
			if !sleepCtx(ctx, backoff(round)) {
				return nil, ctx.Err()
			}
		} else if round >= maxCASRounds {
			return nil, err
		}
	}
}

// doneWriting ends the write of v to key under way.
func (m *mirror[T]) doneWriting(key string, v *T) {
	m.mu.Lock()
	if w, ok := m.writing[key]; ok && w.val == v {
		delete(m.writing, key)
	}
	m.mu.Unlock()
}

// attempt makes one attempt of a write, cut short after bound or when the
// connection is lost (conn): what is in flight then is never
// acknowledged. One cut short (cut, unless ctx itself ended) by the
// connection's loss fails as one cut by its bound does.
func (m *mirror[T]) attempt(ctx context.Context, bound time.Duration, write func(context.Context) (uint64, error)) (uint64, bool, error) {
	actx, cancel := context.WithTimeout(ctx, bound)
	defer cancel()
	if m.conn != nil {
		defer context.AfterFunc(m.conn(), cancel)()
	}
	rev, err := write(actx)
	cut := actx.Err() != nil && ctx.Err() == nil
	if cut && errors.Is(err, context.Canceled) {
		err = context.DeadlineExceeded
	}
	return rev, cut, err
}

// updateAttempt and removeAttempt bound an update's and a removal's first
// attempt, as createAttempt does a create's. A removal tried again after
// one whose outcome is unknown may find the key moved on by its own
// marker: its callers judge a key moved on, as they did when the attempt
// waited out its whole context and failed.
const (
	updateAttempt = createAttempt
	removeAttempt = createAttempt
)

// newWriteTag names an update's attempt uniquely across replicas: a
// random prefix per process, and a count.
func newWriteTag() string {
	return writeTagPrefix + strconv.FormatUint(writeTags.Add(1), 36)
}

var (
	writeTagPrefix = func() string {
		var b [8]byte
		rand.Read(b[:])
		return hex.EncodeToString(b[:]) + "."
	}()
	writeTags atomic.Uint64
)

// unknownWrite is an update's attempt whose outcome is unknown.
type unknownWrite[T any] struct {
	tag string
	raw []byte
	val *T
}

// stored reports whether the key's last write is the one tagged tag, and
// its revision; a read that fails for a moment is tried again within ctx.
// It may miss the write (review 48): one held while the connection was
// reconnecting reaches NATS with the read, which nats-server answers
// before the write leaves the stream's queue; or another write landed on
// top. The change is then made again (see natsstore/DESIGN.md).
func (m *mirror[T]) stored(ctx context.Context, key, tag string) (uint64, bool, error) {
	for round := 0; ; round++ {
		got, rev, err := m.lastTag(ctx, key)
		if err == nil {
			return rev, got == tag, nil
		}
		if !transient(err) || round >= 20 {
			return 0, false, err
		}
		if !sleepCtx(ctx, backoff(round)) {
			return 0, false, ctx.Err()
		}
	}
}

// fetch reads key from KV (not the mirror, which may lag) and applies it.
func (m *mirror[T]) fetch(ctx context.Context, key string) ([]byte, uint64, error) {
	v, rev, raw, err := m.readErr(ctx, key)
	if err != nil {
		return nil, 0, err
	}
	m.apply(key, rev, raw, v)
	return raw, rev, nil
}

// create writes a new key; jetstream.ErrKeyExists if it exists.
func (m *mirror[T]) create(ctx context.Context, key string, v *T, opts ...jetstream.KVCreateOpt) (uint64, error) {
	return m.createBy(ctx, key, v, func(ctx context.Context, b []byte) (uint64, error) {
		if m.write != nil && len(opts) == 0 {
			// A compare-and-set at revision 0 creates a key never written;
			// one deleted before is KeyValue.Create's to write.
			rev, err := m.write(ctx, key, b, 0, "")
			if isWrongLast(err) {
				rev, err = m.kv.Create(ctx, key, b)
			}
			return rev, err
		}
		return m.kv.Create(ctx, key, b, opts...)
	})
}

// createWithTTL is create of a key with a per-key TTL (a lease): by
// createTTL where set and the key was never written, else KeyValue.Create.
func (m *mirror[T]) createWithTTL(ctx context.Context, key string, v *T, ttl time.Duration) (uint64, error) {
	if m.createTTL == nil {
		return m.create(ctx, key, v, jetstream.KeyTTL(ttl))
	}
	return m.createBy(ctx, key, v, func(ctx context.Context, b []byte) (uint64, error) {
		rev, err := m.createTTL(ctx, key, b, ttl)
		if isWrongLast(err) {
			// Written before (a marker, or a holder): KeyValue.Create
			// tells a deleted key from one that exists.
			rev, err = m.kv.Create(ctx, key, b, jetstream.KeyTTL(ttl))
		}
		return rev, err
	})
}

// createAttempt bounds a create's first attempt (each later one is given
// that much more): a write whose acknowledgement is lost with its
// connection is never answered, and would hold its caller for the whole
// operation's time (review 43: a new call refused after 10 s); a slow
// NATS still has the time it had (review 44: KeyValue.Create over a
// marker is four round trips). Tried again, a create that finds its own
// bytes stored is done: nothing else writes exactly those (they carry the
// writer's time, and its replica or a random epoch).
const createAttempt = 3 * time.Second

// createBy is create, each attempt made by attempt.
func (m *mirror[T]) createBy(ctx context.Context, key string, v *T, attempt func(context.Context, []byte) (uint64, error)) (uint64, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return 0, err
	}
	ambiguous := false
	defer m.settle(key, &ambiguous)
	for round := 0; ; round++ {
		rev, cut, err := m.attempt(ctx, createAttempt*time.Duration(round+1), func(ctx context.Context) (uint64, error) {
			return attempt(ctx, b)
		})
		if err == nil {
			m.written(key, rev, b, v)
			return rev, nil
		}
		if errors.Is(err, jetstream.ErrKeyExists) && (ambiguous || cut) {
			// An earlier attempt's write, its acknowledgement lost? Or no
			// key at all: KeyValue.Create cut short in its read of a
			// deletion's marker says the key exists (review 44).
			e, gerr := m.kv.Get(ctx, key)
			switch {
			case gerr == nil && bytes.Equal(e.Value(), b):
				m.written(key, e.Revision(), b, v)
				return e.Revision(), nil
			case errors.Is(gerr, jetstream.ErrKeyNotFound), errors.Is(gerr, jetstream.ErrKeyDeleted):
				err = context.DeadlineExceeded // tried again below
			}
		}
		if errors.Is(err, jetstream.ErrKeyExists) {
			return 0, err
		}
		ambiguous = true
		if !transient(err) || round >= 20 {
			return 0, err
		}
		if !sleepCtx(ctx, backoff(round)) {
			return 0, ctx.Err()
		}
	}
}

// holds reports whether KV holds exactly raw at key, and at which revision.
func (m *mirror[T]) holds(ctx context.Context, key string, raw []byte) (uint64, bool) {
	e, err := m.kv.Get(ctx, key)
	if err != nil || !bytes.Equal(e.Value(), raw) {
		return 0, false
	}
	return e.Revision(), true
}

// put writes key whatever it holds.
func (m *mirror[T]) put(ctx context.Context, key string, v *T) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	ambiguous := false
	defer m.settle(key, &ambiguous)
	for round := 0; ; round++ {
		rev, err := m.kv.Put(ctx, key, b)
		if err == nil {
			m.written(key, rev, b, v)
			return nil
		}
		ambiguous = true
		if !transient(err) || round >= 20 {
			return err
		}
		if !sleepCtx(ctx, backoff(round)) {
			return ctx.Err()
		}
	}
}

// remove deletes key if it is still at rev (rev 0: whatever it holds).
func (m *mirror[T]) remove(ctx context.Context, key string, rev uint64) error {
	var opts []jetstream.KVDeleteOpt
	if rev > 0 {
		opts = append(opts, jetstream.LastRevision(rev))
	}
	base := rev
	if base == 0 {
		base = m.revOf(key)
	}
	if m.markerTTL > 0 {
		opts = append(opts, jetstream.PurgeTTL(m.markerTTL))
	}
	ambiguous := false
	defer m.settle(key, &ambiguous)
	for round := 0; ; round++ {
		var err error
		var marker uint64 // the marker's revision, where the write tells it
		if m.purge != nil && m.markerTTL > 0 && m.conn != nil {
			marker, _, err = m.attempt(ctx, removeAttempt*time.Duration(round+1), func(ctx context.Context) (uint64, error) {
				return m.purge(ctx, key, rev, m.markerTTL)
			})
		} else if m.purge != nil && m.markerTTL > 0 {
			marker, err = m.purge(ctx, key, rev, m.markerTTL) // in-process: no reply is lost
		} else if m.markerTTL > 0 {
			err = m.kv.Purge(ctx, key, opts...)
		} else {
			err = m.kv.Delete(ctx, key, opts...)
		}
		if err == nil {
			m.deleted(key, base)
			if m.notify != nil {
				m.notify(key, max(marker, base+1), nil)
			}
			return nil
		}
		if !isWrongLast(err) {
			ambiguous = true
		}
		if !transient(err) || round >= 20 {
			return err
		}
		if !sleepCtx(ctx, backoff(round)) {
			return ctx.Err()
		}
	}
}

// settle tells unsure of key if a write of it had an unknown outcome.
func (m *mirror[T]) settle(key string, ambiguous *bool) {
	if *ambiguous && m.unsure != nil {
		m.unsure(key)
	}
}

// written applies a write of this replica that succeeded, and tells the
// interested replicas of it.
func (m *mirror[T]) written(key string, rev uint64, raw []byte, val *T) {
	m.apply(key, rev, raw, val)
	if m.notify != nil {
		m.notify(key, rev, raw)
	}
}

// deleted records that key, last seen at revision base, was deleted.
// The delete marker's own revision is unknown here (the watch brings it),
// but it is above base, and every later write above it: base+1 marks the
// key deleted until then without hiding any of them. If the mirror has
// moved past base already, the watch has told it more than this knows.
func (m *mirror[T]) deleted(key string, base uint64) {
	m.mu.RLock()
	e := m.entries[key]
	current := e != nil && e.rev == base
	m.mu.RUnlock()
	if current {
		m.apply(key, base+1, nil, nil)
	}
}

// unreleased returns the value key last held as this mirror saw it, unless
// it was deleted: still there, or gone by its TTL's expiry. A writer that
// creates the key now takes it from a holder that did not give it up.
func (m *mirror[T]) unreleased(key string) *T {
	m.mu.RLock()
	defer m.mu.RUnlock()
	switch e := m.entries[key]; {
	case e == nil:
		return nil
	case e.val != nil:
		return e.val
	case e.expired:
		return e.prev
	}
	return nil
}

func (m *mirror[T]) revOf(key string) uint64 {
	m.mu.RLock()
	defer m.mu.RUnlock()
	if e := m.entries[key]; e != nil {
		return e.rev
	}
	return 0
}
