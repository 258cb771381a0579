package natsstore

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// A replica holds the session, stream and lease records of the sessions it
// serves, not the whole zone's (issue 24: with whole-bucket watches every
// replica received and decoded every write of every call, so adding a
// replica added work to all the others).
//
// Its interest in a session (by session token) begins with its handle of
// the session and ends with the session: it subscribes to the session's
// notifications (core NATS, <P>.n.<session token>.<bucket letter>[.<rest
// of the key>]), which the replica that writes a record publishes once the
// write succeeded, with the revision and the value written; then it loads
// what the buckets hold of the session (the session record, and one
// filtered watch per bucket of the others, its initial values only).
// Tombstones are read from KV when asked for (tombstoneOf); admission
// counts the zone's sessions from the sweeper's published tally
// (tally.go).
// A notification is applied like a watched entry: by revision, so a late
// one never undoes a newer write. The connection does not echo: a replica
// never receives its own.
//
// Core NATS may drop what a watch would not: while the connection is
// down, or for a subscriber that falls behind. After a reconnection, or a
// slow-consumer error on the notifications, every interest is loaded
// again. A lease that expires writes no notification: a lease this replica
// has not seen renewed for a TTL is read again (leaseExpiries), as the
// sweeper and readers did for watches cut off.
//
// The replica that sweeps needs the whole zone: while it holds the
// sweeper lease, it watches the four buckets whole, as every replica used
// to (fullWatch).

// Notification subjects name the bucket by a letter.
const (
	noteSessions = "s"
	noteStreams  = "t"
	noteLeases   = "l"
)

// noteCap bounds the notifications received and not yet applied; past it
// the connection drops them (a slow consumer) and every interest is
// loaded again.
const noteCap = 1 << 16

type interest struct {
	fullMu sync.Mutex // orders fullWatch's transitions; no watch's reaction takes it
	mu     sync.Mutex
	subs   map[string]*interestSub // by session token
	notes  chan *nats.Msg

	full struct {
		on       bool
		starting bool // the watches are being started: nothing is forgotten
		cancel   context.CancelFunc
		ready    []<-chan struct{}
		done     []<-chan struct{}
	}
}

type interestSub struct {
	sub   *nats.Subscription
	ready chan struct{} // closed once loaded (or the load failed: then stale is set)
	stale bool          // the load failed or notifications were lost: load again
	// unloaded: begun during a scan, whose watches held its records; what
	// they brought last may lag a write a moment, so it is loaded once
	// they stop.
	unloaded bool
	loading  bool // being loaded again: not swept until it is
	// unsure: kept by a creation that lost to the session, which may have
	// been deleted before the interest could hear of it: a load that
	// finds the session gone ends it (review 47), one that finds it makes
	// it the session's like any other.
	unsure bool
}

// interestUnsure marks the interest in session sh unsure, to be loaded
// again.
func (st *Store) interestUnsure(sh string) {
	in := &st.interest
	in.mu.Lock()
	if s := in.subs[sh]; s != nil {
		s.unsure, s.stale = true, true
	}
	in.mu.Unlock()
}

// settleUnsure ends the unsure interest in session sh if it is gone, or
// makes it sure if it exists.
func (st *Store) settleUnsure(sh string, gone bool) {
	in := &st.interest
	in.mu.Lock()
	s := in.subs[sh]
	unsure := s != nil && s.unsure
	if unsure && !gone {
		s.unsure = false
	}
	in.mu.Unlock()
	if unsure && gone {
		st.dropInterest(sh)
	}
}

// noteSubject is <P>.n.<session token>.<bucket>[.<rest of key>]: every
// key begins with its session's token, so one subscription per session
// takes all of it.
func (st *Store) noteSubject(bucket, key string) string {
	sh, rest, ok := strings.Cut(key, ".")
	if !ok {
		return st.opts.Prefix + ".n." + sh + "." + bucket
	}
	return st.opts.Prefix + ".n." + sh + "." + bucket + "." + rest
}

// noteKey parses a notification subject: the bucket's letter and the key.
func (st *Store) noteKey(subject string) (bucket, key string, ok bool) {
	rest, ok := strings.CutPrefix(subject, st.opts.Prefix+".n.")
	if !ok {
		return "", "", false
	}
	sh, rest, ok := strings.Cut(rest, ".")
	if !ok {
		return "", "", false
	}
	bucket, rest, more := strings.Cut(rest, ".")
	if !more {
		return bucket, sh, true
	}
	return bucket, sh + "." + rest, true
}

// notifier is a mirror's notify: it publishes a write of this replica to
// the replicas interested in its session. payload: an operation byte ('p'
// put, 'd' deleted), the revision (8 bytes, big-endian), the value.
func (st *Store) notifier(bucket string) func(key string, rev uint64, raw []byte) {
	return func(key string, rev uint64, raw []byte) {
		b := make([]byte, 9+len(raw))
		b[0] = 'p'
		if raw == nil {
			b[0] = 'd'
		}
		binary.BigEndian.PutUint64(b[1:9], rev)
		copy(b[9:], raw)
		if err := st.nc.Publish(st.noteSubject(bucket, key), b); err != nil {
			st.fault("notify", err) // the interested replicas load again after a reconnection
		}
	}
}

// interestIn makes this replica interested in the session with token sh,
// and returns once what the buckets hold of it is loaded (at once if the
// replica was interested already, or watches the buckets whole). load is
// false for a session this replica just created, which no one else can
// have written yet.
func (st *Store) interestIn(sh string, load bool) (begun bool) {
	in := &st.interest
	in.mu.Lock()
	if s := in.subs[sh]; s != nil {
		s.unsure = false // a handle or a creation of the session's relies on it
		in.mu.Unlock()
		<-s.ready
		return false
	}
	s := &interestSub{ready: make(chan struct{})}
	in.subs[sh] = s
	full := in.fullReady()
	s.unloaded = full && load // the scan's watches hold it until they stop
	in.mu.Unlock()
	var err error
	if st.srv == nil { // an embedded server of its own: no other replica writes, none notifies
		var sub *nats.Subscription
		sub, err = st.nc.ChanSubscribe(st.opts.Prefix+".n."+sh+".>", in.notes)
		in.mu.Lock()
		if in.subs[sh] == s {
			s.sub = sub
		} else if sub != nil {
			sub.Unsubscribe() // dropped meanwhile
		}
		in.mu.Unlock()
		if err != nil {
			st.fault("interest", err)
			in.mu.Lock()
			s.stale = true
			in.mu.Unlock()
		}
	}
	if load && !full && err == nil {
		// Nothing of the session was of interest here before: nothing to
		// prune (and no scan of the mirrors, nor a read of the zone's
		// mark, on a session's first request to this replica).
		st.loadSub(s, sh)
	}
	close(s.ready)
	return true
}

// loadBegun loads what the buckets hold of session sh into an interest
// this replica began without loading (a creation that found the session
// made meanwhile), as interestIn does for a session's first request.
func (st *Store) loadBegun(sh string) {
	in := &st.interest
	in.mu.Lock()
	s := in.subs[sh]
	if s == nil {
		in.mu.Unlock()
		return
	}
	if in.fullReady() {
		s.unloaded = true // the scan's watches hold it until they stop
		in.mu.Unlock()
		return
	}
	in.mu.Unlock()
	st.loadSub(s, sh)
}

// loadSub loads what the buckets hold of session sh into its new interest
// s; one whose load fails is marked to be loaded again.
func (st *Store) loadSub(s *interestSub, sh string) {
	ctx, cancel := st.opCtx()
	err := st.loadInterest(ctx, sh, false)
	cancel()
	if err != nil {
		st.fault("interest", err)
		st.interest.mu.Lock()
		s.stale = true
		st.interest.mu.Unlock()
	}
}

// dropInterest ends this replica's interest in the session with token sh
// (it ended): what the mirrors hold of it goes, unless they hold the zone.
// It is the sessions mirror's reaction to the session's end, so the
// forgetting is done before a new incarnation's interest can begin.
func (st *Store) dropInterest(sh string) {
	in := &st.interest
	in.mu.Lock()
	s := in.subs[sh]
	if s == nil {
		in.mu.Unlock()
		return
	}
	delete(in.subs, sh)
	if !in.full.on && !in.full.starting {
		st.sessions.forgetSession(sh)
		st.streams.forgetSession(sh)
		st.leases.forgetSession(sh)
	}
	in.mu.Unlock()
	if s.sub != nil {
		s.sub.Unsubscribe()
	}
}

// interested reports whether the mirrors keep the records of key's
// session: this replica serves it, or watches the buckets whole.
func (st *Store) interested(key string) bool {
	sh, _, _ := strings.Cut(key, ".")
	in := &st.interest
	in.mu.Lock()
	defer in.mu.Unlock()
	return in.full.on || in.subs[sh] != nil
}

// loadInterest reads what the streams and leases buckets hold of the
// session with token sh into the mirrors: the initial values of a watch
// filtered to its keys. With prune, a key the mirror holds that KV no
// longer does, and that did not change since the load began, is taken as
// gone (a deletion whose notification was lost).
func (st *Store) loadInterest(ctx context.Context, sh string, prune bool) error {
	begun := time.Now().UnixNano()
	if err := st.nc.FlushWithContext(ctx); err != nil {
		return err // the subscription must be in place before the values are read
	}
	if prune && !st.zoneIntact(ctx) {
		// NATS may have lost the zone's data: what the mirrors hold and KV
		// does not is the recovery's to tombstone (recover.go), not a
		// deletion to apply. Loaded again later.
		return errZoneUnsure
	}
	onErr := func(err error) { st.fault("interest", err) }
	if _, _, err := st.sessions.fetch(ctx, sh); errors.Is(err, errNotFound) {
		// Gone, though read a moment before the subscription (a first
		// load follows a look-up): its deletion's notification may have
		// been sent before the subscription was in place, and then the
		// handle would never end (a resume racing a DELETE on another
		// replica hung). Unless NATS lost the zone's data (the recovery
		// tombstones what it held).
		if prune || st.zoneIntact(ctx) {
			st.sessions.pruneUnseen(sh, nil, begun)
			st.settleUnsure(sh, true)
		}
	} else if err != nil {
		return err
	} else {
		st.settleUnsure(sh, false)
	}
	if err := loadKeys(ctx, st.streams, sh, begun, prune, onErr); err != nil {
		return err
	}
	return loadKeys(ctx, st.leases, sh, begun, prune, onErr)
}

// errZoneUnsure: a load found the zone's mark missing or changed.
var errZoneUnsure = errors.New("natsstore: the zone's mark is not the one this replica holds")

// zoneIntact reports whether the zone's mark is the one this replica holds:
// NATS has not lost the zone's data since (or this replica has recovered).
func (st *Store) zoneIntact(ctx context.Context) bool {
	mark := st.mark.Load()
	if mark == nil {
		return false
	}
	e, err := st.meta.Get(ctx, zoneKey)
	return err == nil && string(e.Value()) == *mark
}

func loadKeys[T any](ctx context.Context, m *mirror[T], sh string, begun int64, prune bool, onErr func(error)) error {
	w, err := m.kv.Watch(ctx, sh+".*.*", jetstream.IgnoreDeletes())
	if err != nil {
		return err
	}
	seen := make(map[string]bool)
	err = initialValues(ctx, w, func(e jetstream.KeyValueEntry) {
		seen[e.Key()] = true
		m.take(e, onErr)
	})
	if err == nil && prune {
		m.pruneUnseen(sh+".", seen, begun)
	}
	return err
}

// initialValues hands fn each of a watch's initial values, then stops it.
func initialValues(ctx context.Context, w jetstream.KeyWatcher, fn func(jetstream.KeyValueEntry)) error {
	defer w.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case e, ok := <-w.Updates():
			if !ok {
				return errors.New("natsstore: the watch ended")
			}
			if e == nil {
				return nil
			}
			fn(e)
		}
	}
}

// pruneUnseen takes the keys under prefix that a load did not find, and
// that did not change since begun, as gone.
func (m *mirror[T]) pruneUnseen(prefix string, seen map[string]bool, begun int64) {
	type gone struct {
		key string
		rev uint64
	}
	var list []gone
	m.mu.RLock()
	for k, e := range m.entries {
		if e.val != nil && !seen[k] && e.seen < begun && (k == prefix || strings.HasPrefix(k, prefix)) {
			list = append(list, gone{k, e.rev})
		}
	}
	m.mu.RUnlock()
	for _, g := range list {
		m.applyAs(g.key, g.rev+1, nil, nil, true)
	}
}

// applyNotes applies the notifications received until the store closes.
func (st *Store) applyNotes() {
	defer st.wg.Done()
	onErr := func(err error) { st.fault("interest", err) }
	for {
		select {
		case <-st.ctx.Done():
			return
		case msg := <-st.interest.notes:
			bucket, key, ok := st.noteKey(msg.Subject)
			if !ok || len(msg.Data) < 9 || !st.interested(key) {
				continue // malformed, or a session no longer served here
			}
			rev := binary.BigEndian.Uint64(msg.Data[1:9])
			del := msg.Data[0] == 'd'
			switch bucket {
			case noteSessions:
				applyNote(st.sessions, key, rev, del, msg.Data[9:], onErr)
			case noteStreams:
				applyNote(st.streams, key, rev, del, msg.Data[9:], onErr)
			case noteLeases:
				applyNote(st.leases, key, rev, del, msg.Data[9:], onErr)
			}
		}
	}
}

func applyNote[T any](m *mirror[T], key string, rev uint64, del bool, raw []byte, onErr func(error)) {
	if del {
		m.apply(key, rev, nil, nil)
		return
	}
	m.applyRaw(key, rev, raw, onErr)
}

// reloadInterests loads every interest again: notifications may have been
// lost (a reconnection, a slow consumer), or a load failed.
func (st *Store) reloadInterests(all bool) {
	in := &st.interest
	in.mu.Lock()
	var list []*interestSub
	var shs []string
	for sh, s := range in.subs {
		if all || s.stale {
			list, shs = append(list, s), append(shs, sh)
			s.stale, s.loading = false, true
		}
	}
	full := in.fullReady()
	if full {
		for _, s := range list {
			s.stale, s.loading = true, false // loaded once the scan's watches stop
		}
	}
	in.mu.Unlock()
	if full {
		return
	}
	for i, sh := range shs {
		ctx, cancel := st.opCtx()
		err := st.loadInterest(ctx, sh, true)
		cancel()
		in.mu.Lock()
		list[i].loading = false
		if err != nil {
			list[i].stale = true
		}
		in.mu.Unlock()
		if err != nil {
			st.fault("interest", err)
		}
		if st.ctx.Err() != nil {
			return
		}
	}
}

// lostNotes is told of the connection's asynchronous errors: a slow
// consumer on the notifications means some were dropped.
func (st *Store) lostNotes(sub *nats.Subscription, err error) {
	if sub == nil || !errors.Is(err, nats.ErrSlowConsumer) || !strings.HasPrefix(sub.Subject, st.opts.Prefix+".n.") {
		return
	}
	st.interest.mu.Lock()
	for _, s := range st.interest.subs {
		s.stale = true
	}
	st.interest.mu.Unlock()
}

// interestLoop loads again what needs it, and reads again the leases this
// replica has not seen renewed for a TTL (an expiry writes no
// notification), until the store closes.
func (st *Store) interestLoop() {
	defer st.wg.Done()
	t := time.NewTicker(max(st.opts.LeaseTTL/6, 100*time.Millisecond))
	defer t.Stop()
	for {
		select {
		case <-st.ctx.Done():
			return
		case <-t.C:
		}
		st.reloadInterests(false)
		if st.interest.fullOn() {
			continue // the watch brings every expiry
		}
		st.forgetUninterested()
		var keys []string
		st.leases.each(func(key string, _ *leaseRecord, _ uint64) {
			if !st.holds(key) {
				keys = append(keys, key)
			}
		})
		for _, key := range keys {
			st.leased(st.ctx, key) // reads KV only for a lease unseen for a TTL
		}
	}
}

// servedSessions is the tokens of the sessions whose records this replica
// holds current: its interests that have loaded (and are not to be loaded
// again), what its sweep covers.
func (st *Store) servedSessions() map[string]bool {
	in := &st.interest
	in.mu.Lock()
	defer in.mu.Unlock()
	out := make(map[string]bool, len(in.subs))
	for sh, s := range in.subs {
		select {
		case <-s.ready:
			if !s.stale && !s.loading {
				out[sh] = true
			}
		default:
		}
	}
	return out
}

// whole reports whether the mirrors hold the zone's every record: the
// whole-bucket watches run and have loaded.
func (in *interest) whole() bool {
	in.mu.Lock()
	defer in.mu.Unlock()
	return in.fullReady()
}

func (in *interest) fullOn() bool {
	in.mu.Lock()
	defer in.mu.Unlock()
	return in.full.on
}

// fullReady reports whether the whole-bucket watches run and have loaded;
// in.mu held.
func (in *interest) fullReady() bool {
	if !in.full.on {
		return false
	}
	for _, r := range in.full.ready {
		select {
		case <-r:
		default:
			return false
		}
	}
	return true
}

// forgetUninterested drops what the mirrors hold of sessions this replica
// does not serve: its own writes to them (a tombstone it wrote, a record a
// sweep it ran wrote), which no notification keeps current.
func (st *Store) forgetUninterested() {
	in := &st.interest
	in.mu.Lock()
	defer in.mu.Unlock()
	if !in.full.on && !in.full.starting {
		st.keepInterestsOnly()
	}
}

// keepInterestsOnly makes the mirrors forget what is not of interest; in.mu
// held.
func (st *Store) keepInterestsOnly() {
	keep := func(key string) bool {
		sh, _, _ := strings.Cut(key, ".")
		return st.interest.subs[sh] != nil
	}
	st.sessions.forget(keep)
	st.streams.forget(keep)
	st.leases.forget(keep)
	st.tombs.forget(func(string) bool { return false })
}

// fullWatch starts (on) or stops the watches of the four buckets whole:
// the sweeping replica's. It reports whether they run and have loaded.
// Stopped, the mirrors forget what is not of interest. The watches' own
// reactions take in.mu (a session's end drops its interest), so nothing
// here waits for them while holding it: fullMu orders the transitions.
func (st *Store) fullWatch(on bool) bool {
	in := &st.interest
	in.fullMu.Lock()
	defer in.fullMu.Unlock()
	in.mu.Lock()
	cur := in.full.on
	in.mu.Unlock()
	switch {
	case on && !cur:
		// What the watches bring is kept from their first entry: a
		// forgetting of what is not of interest meanwhile (interestLoop)
		// would leave holes in the zone a scan then judges whole (a
		// session's streams cleared as its deletion's leftovers).
		in.mu.Lock()
		in.full.starting = true
		in.mu.Unlock()
		ctx, cancel := context.WithCancel(st.ctx)
		onErr := func(err error) { st.fault("watch", err) }
		var ready, done []<-chan struct{}
		for _, w := range []func(context.Context, func(error)) (<-chan struct{}, <-chan struct{}, error){
			st.sessions.watch, st.tombs.watch, st.streams.watch, st.leases.watch,
		} {
			r, d, err := w(ctx, onErr)
			if err != nil {
				cancel()
				for _, d := range done {
					<-d
				}
				in.mu.Lock()
				in.full.starting = false
				st.keepInterestsOnly()
				in.mu.Unlock()
				st.fault("watch", err) // asked again on the next sweep
				return false
			}
			ready, done = append(ready, r), append(done, d)
		}
		in.mu.Lock()
		in.full.on, in.full.starting, in.full.cancel, in.full.ready, in.full.done = true, false, cancel, ready, done
		in.mu.Unlock()
	case !on && cur:
		st.stopFull()
		in.mu.Lock()
		st.keepInterestsOnly()
		// An interest loaded before the scan was kept current by its
		// notifications throughout; one begun during it is loaded now
		// (interestLoop).
		for _, s := range in.subs {
			if s.unloaded {
				s.stale, s.unloaded = true, false
			}
		}
		in.mu.Unlock()
	}
	in.mu.Lock()
	defer in.mu.Unlock()
	return in.fullReady()
}

// awaitFullWatch starts the whole-bucket watches and waits until they have
// loaded.
func (st *Store) awaitFullWatch(ctx context.Context) error {
	for round := 0; !st.fullWatch(true); round++ {
		st.interest.mu.Lock()
		ready := st.interest.full.ready
		st.interest.mu.Unlock()
		for _, r := range ready {
			select {
			case <-r:
			case <-ctx.Done():
				return fmt.Errorf("natsstore: watch: %w", ctx.Err())
			}
		}
		if len(ready) == 0 && !sleepCtx(ctx, backoff(round)) {
			return fmt.Errorf("natsstore: watch: %w", ctx.Err())
		}
	}
	return nil
}

// stopFull stops the whole-bucket watches and waits until they have;
// in.fullMu held, in.mu not.
func (st *Store) stopFull() {
	in := &st.interest
	in.mu.Lock()
	cancel, done := in.full.cancel, in.full.done
	in.full.on, in.full.cancel, in.full.ready, in.full.done = false, nil, nil, nil
	in.mu.Unlock()
	if cancel != nil {
		cancel()
		for _, d := range done {
			<-d
		}
	}
}

// read reads key from KV without keeping it (a miss: false).
func (m *mirror[T]) read(ctx context.Context, key string) (*T, uint64, bool) {
	v, rev, _, ok := m.readRaw(ctx, key)
	return v, rev, ok
}

// readRaw is read, with the value as stored.
func (m *mirror[T]) readRaw(ctx context.Context, key string) (*T, uint64, []byte, bool) {
	v, rev, raw, err := m.readErr(ctx, key)
	return v, rev, raw, err == nil
}

// readErr is readRaw telling a miss (errNotFound) from a failed read. A
// transient failure (no responders for a moment, a timeout, a reconnection)
// is tried again within ctx: a read that fails is answered as a miss, and
// a miss can turn a resume into an adoption.
func (m *mirror[T]) readErr(ctx context.Context, key string) (*T, uint64, []byte, error) {
	for round := 0; ; round++ {
		e, err := m.kv.Get(ctx, key)
		switch {
		case err == nil:
			v := new(T)
			if err := json.Unmarshal(e.Value(), v); err != nil {
				return nil, 0, nil, err
			}
			return v, e.Revision(), e.Value(), nil
		case errors.Is(err, jetstream.ErrKeyNotFound), errors.Is(err, jetstream.ErrKeyDeleted):
			return nil, 0, nil, errNotFound
		case !transient(err):
			return nil, 0, nil, err
		}
		if !sleepCtx(ctx, backoff(round)) {
			return nil, 0, nil, err
		}
	}
}

// loadAll reads the whole bucket into m (a mirror of its own, unwatched):
// the initial values of a watch.
func (m *mirror[T]) loadAll(ctx context.Context) error {
	w, err := m.kv.WatchAll(ctx, jetstream.IgnoreDeletes())
	if err != nil {
		return err
	}
	return initialValues(ctx, w, func(e jetstream.KeyValueEntry) { m.take(e, func(error) {}) })
}

// renotifier is a mirror's unsure: once a write's outcome was unknown for
// a while, it tells the interested replicas what the bucket holds at the
// key now, whoever wrote it (a write stored while its acknowledgement was
// lost was never notified). Receivers apply it by revision, so telling
// twice does no harm.
func (st *Store) renotifier(kvBucket string, m func(key string, rev uint64, raw []byte)) func(key string) {
	return func(key string) {
		st.spawn(func() {
			kv, err := st.kvStream(kvBucket)
			if err != nil {
				return
			}
			ctx, cancel := st.opCtx()
			defer cancel()
			msg, err := kv.GetLastMsgForSubject(ctx, "$KV."+kvBucket+"."+key)
			if err != nil {
				return // never written, or its marker went: nothing to tell
			}
			if msg.Header.Get("KV-Operation") != "" || msg.Header.Get(jetstream.MarkerReasonHeader) != "" {
				m(key, msg.Sequence, nil)
				return
			}
			m(key, msg.Sequence, msg.Data)
		})
	}
}

// resyncSubject is where a replica that reconnected to NATS asks the
// others to load their interests again: notifications it wrote while
// cut off (or whose writes were stored while their acknowledgements were
// lost) may never have reached them. A session token is hex: it never
// names this subject.
func (st *Store) resyncSubject() string { return st.opts.Prefix + ".n._resync" }

// disconnected is the connection's disconnect handler: the notifications
// sent from now until the interests are loaded again are lost, so no
// sweep judges on what this replica holds of them meanwhile (review 28: a
// replica cut off for longer than the idle timeout expired a session
// another kept touching).
func (st *Store) disconnected() {
	st.conn.lost()
	in := &st.interest
	in.mu.Lock()
	for _, s := range in.subs {
		s.stale = true
	}
	in.mu.Unlock()
}

// reconnected is the connection's reconnect handler.
func (st *Store) reconnected() {
	st.settleReleases()
	st.spawn(func() {
		if st.srv == nil {
			if err := st.nc.Publish(st.resyncSubject(), nil); err != nil {
				st.fault("notify", err)
			}
		}
		st.reloadInterests(true)
	})
}
