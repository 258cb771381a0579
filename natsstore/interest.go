package natsstore

import (
	"context"
	"encoding/binary"
	"errors"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// A replica holds the stream records and leases of the sessions it serves,
// not the whole zone's (issue 24: with whole-bucket watches every replica
// received and decoded every write of every call, so adding a replica added
// work to all the others).
//
// Its interest in a session (by session token) begins with its handle of
// the session and ends with the session: it subscribes to the session's
// notifications (core NATS, <P>.n.<bucket letter>.<record key>), which the
// replica that writes a record publishes once the write succeeded, with
// the revision and the value written; then it loads what the buckets hold
// of the session (one filtered watch per bucket, its initial values only).
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
// sweeper lease, it watches the two buckets whole, as every replica used
// to (fullWatch).

// Notification subjects: <P>.n.t.<key> for stream records, <P>.n.l.<key>
// for leases; keys begin with the session token.
const (
	noteStreams = "t"
	noteLeases  = "l"
)

// noteCap bounds the notifications received and not yet applied; past it
// the connection drops them (a slow consumer) and every interest is
// loaded again.
const noteCap = 1 << 16

type interest struct {
	mu    sync.Mutex
	subs  map[string]*interestSub // by session token
	notes chan *nats.Msg

	full struct {
		on     bool
		cancel context.CancelFunc
		ready  []<-chan struct{}
		done   []<-chan struct{}
	}
}

type interestSub struct {
	sub   *nats.Subscription
	ready chan struct{} // closed once loaded (or the load failed: then stale is set)
	stale bool          // the load failed or notifications were lost: load again
}

func (st *Store) noteSubject(bucket, key string) string {
	return st.opts.Prefix + ".n." + bucket + "." + key
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
func (st *Store) interestIn(sh string, load bool) {
	in := &st.interest
	in.mu.Lock()
	if s := in.subs[sh]; s != nil {
		in.mu.Unlock()
		<-s.ready
		return
	}
	s := &interestSub{ready: make(chan struct{})}
	in.subs[sh] = s
	full := in.fullReady()
	in.mu.Unlock()
	sub, err := st.nc.ChanSubscribe(st.opts.Prefix+".n.*."+sh+".>", in.notes)
	in.mu.Lock()
	if in.subs[sh] == s {
		s.sub = sub
	} else if sub != nil {
		sub.Unsubscribe() // dropped meanwhile
	}
	in.mu.Unlock()
	if err != nil {
		st.fault("interest", err)
		s.stale = true
	}
	if load && !full && err == nil {
		ctx, cancel := st.opCtx()
		err = st.loadInterest(ctx, sh, true)
		cancel()
		if err != nil {
			st.fault("interest", err)
			in.mu.Lock()
			s.stale = true
			in.mu.Unlock()
		}
	}
	close(s.ready)
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
	if !in.full.on {
		prefix := sh + "."
		other := func(key string) bool { return !strings.HasPrefix(key, prefix) }
		st.streams.forget(other)
		st.leases.forget(other)
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
	onErr := func(err error) { st.fault("interest", err) }
	if err := loadKeys(ctx, st.streams, sh, begun, prune, onErr); err != nil {
		return err
	}
	return loadKeys(ctx, st.leases, sh, begun, prune, onErr)
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
		if e.val != nil && !seen[k] && e.seen < begun && strings.HasPrefix(k, prefix) {
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
	pre := st.opts.Prefix + ".n."
	for {
		select {
		case <-st.ctx.Done():
			return
		case msg := <-st.interest.notes:
			rest, ok := strings.CutPrefix(msg.Subject, pre)
			bucket, key, ok2 := strings.Cut(rest, ".")
			if !ok || !ok2 || len(msg.Data) < 9 || !st.interested(key) {
				continue // malformed, or a session no longer served here
			}
			rev := binary.BigEndian.Uint64(msg.Data[1:9])
			del := msg.Data[0] == 'd'
			switch bucket {
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
	var list []string
	for sh, s := range in.subs {
		if all || s.stale {
			list = append(list, sh)
			s.stale = false
		}
	}
	full := in.fullReady()
	in.mu.Unlock()
	if full {
		return
	}
	for _, sh := range list {
		ctx, cancel := st.opCtx()
		err := st.loadInterest(ctx, sh, true)
		cancel()
		if err != nil {
			st.fault("interest", err)
			in.mu.Lock()
			if s := in.subs[sh]; s != nil {
				s.stale = true
			}
			in.mu.Unlock()
		}
		if st.ctx.Err() != nil {
			return
		}
	}
}

// lostNotes is told of the connection's asynchronous errors: a slow
// consumer on the notifications means some were dropped.
func (st *Store) lostNotes(sub *nats.Subscription, err error) bool {
	if sub == nil || !errors.Is(err, nats.ErrSlowConsumer) || !strings.HasPrefix(sub.Subject, st.opts.Prefix+".n.") {
		return false
	}
	st.interest.mu.Lock()
	for _, s := range st.interest.subs {
		s.stale = true
	}
	st.interest.mu.Unlock()
	return true
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

// fullWatch starts (on) or stops the watches of the streams and leases
// buckets whole: the sweeping replica's. It reports whether they run and
// have loaded. Stopped, the mirrors forget what is not of interest.
func (st *Store) fullWatch(on bool) bool {
	in := &st.interest
	in.mu.Lock()
	defer in.mu.Unlock()
	switch {
	case on && !in.full.on:
		ctx, cancel := context.WithCancel(st.ctx)
		onErr := func(err error) { st.fault("watch", err) }
		var ready, done []<-chan struct{}
		for _, w := range []func(context.Context, func(error)) (<-chan struct{}, <-chan struct{}, error){st.streams.watch, st.leases.watch} {
			r, d, err := w(ctx, onErr)
			if err != nil {
				cancel()
				for _, d := range done {
					<-d
				}
				st.fault("watch", err) // asked again on the next sweep
				return false
			}
			ready, done = append(ready, r), append(done, d)
		}
		in.full.on, in.full.cancel, in.full.ready, in.full.done = true, cancel, ready, done
	case !on && in.full.on:
		in.stopFull()
		keep := func(key string) bool {
			sh, _, _ := strings.Cut(key, ".")
			return in.subs[sh] != nil
		}
		st.streams.forget(keep)
		st.leases.forget(keep)
	}
	return in.fullReady()
}

// stopFull stops the whole-bucket watches; in.mu held.
func (in *interest) stopFull() {
	if !in.full.on {
		return
	}
	in.full.cancel()
	for _, d := range in.full.done {
		<-d
	}
	in.full.on, in.full.cancel, in.full.ready, in.full.done = false, nil, nil, nil
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
