package natsstore

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/mcpresume/caddy-mcp-resume/policy"
)

// A lease says which replica does something only one may do: produce a
// stream (KV <P>_LEASES), or sweep (KV <P>_META, key sweeper). It is a key
// with a per-key TTL, renewed while the replica lives; if the replica dies
// the key expires and the watches tell every replica.

type heldLease struct {
	// writing is held across each write of the lease, so a renewal and its
	// release never cross: a renewal in flight when the release read the
	// key landed after it and kept the lease a TTL with no holder (review
	// 44's test, failing under the suite's load).
	writing sync.Mutex
	key     string
	rev     uint64
	val     []byte
	lost    func()      // another replica holds it now
	keep    func() bool // a lease that lapsed is taken again while this holds
	// fence, if set, stops the producer when the lease went unrenewed for
	// fenceAfter: before it can lapse (producer.go).
	fence   *time.Timer
	renewed time.Time // when the last successful write of the lease was sent
}

// heldLeases are this replica's producer leases.
type heldLeases struct {
	mu sync.Mutex
	m  map[string]*heldLease
	// unsure are leases released while NATS was out of reach, the
	// release's outcome unknown: a renewal sent before it, held by the
	// client until the reconnection, lands first and moves the key on, and
	// the release's removals then fail, or are never answered. Each is
	// removed once NATS answers, if it still holds exactly this replica's
	// value (review 47: else it stayed a TTL with no holder, and the
	// client's next GET was refused on every replica).
	unsure   map[string]*heldLease
	settling atomic.Bool // settleReleases is under way
}

// acquire takes the producer lease of a stream; false if another holds it.
func (st *Store) acquire(key string, lost func()) (bool, error) {
	sent := time.Now() // the lease's TTL runs from no earlier than this
	rec := &leaseRecord{Replica: st.opts.ReplicaID, Since: sent.UnixNano()}
	ctx, cancel := context.WithTimeout(st.ctx, 10*time.Second)
	defer cancel()
	rev, err := st.leases.createWithTTL(ctx, key, rec, st.opts.LeaseTTL)
	if errors.Is(err, jetstream.ErrKeyExists) {
		return false, nil
	}
	if err != nil {
		st.fault("lease", err)
		return false, err
	}
	b, _ := json.Marshal(rec)
	st.held.mu.Lock()
	st.held.m[key] = &heldLease{key: key, rev: rev, val: b, lost: lost, renewed: sent}
	st.held.mu.Unlock()
	return true, nil
}

// fence makes the held lease of key stop its producer (stop) once it went
// unrenewed for fenceAfter since it was last written.
func (st *Store) fence(key string, stop func()) {
	st.held.mu.Lock()
	defer st.held.mu.Unlock()
	if h := st.held.m[key]; h != nil && h.fence == nil {
		h.fence = time.AfterFunc(st.fenceAfter()-time.Since(h.renewed), stop)
	}
}

// onLost makes the held lease of key call lost when another replica holds
// it (a request stream's producer, whose lease NewStream took).
func (st *Store) onLost(key string, lost func()) {
	st.held.mu.Lock()
	defer st.held.mu.Unlock()
	if h := st.held.m[key]; h != nil {
		h.lost = lost
	}
}

// leased reports whether any replica holds the lease of key, confirmed in
// KV when the mirror has not seen it renewed for a TTL (renewals come every
// third of one): a lease that expired while this replica was cut off from
// NATS is not taken as held forever.
func (st *Store) leased(ctx context.Context, key string) bool {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	_, ok := st.leases.confirm(ctx, key, st.opts.LeaseTTL)
	return ok
}

// keepLease makes the held lease of key one to take again if it lapses
// while keep holds (a request stream still produced here).
func (st *Store) keepLease(key string, keep func() bool) {
	st.held.mu.Lock()
	if h := st.held.m[key]; h != nil {
		h.keep = keep
	}
	st.held.mu.Unlock()
}

// holds reports whether this replica holds the lease of key.
func (st *Store) holds(key string) bool {
	st.held.mu.Lock()
	defer st.held.mu.Unlock()
	return st.held.m[key] != nil
}

// release gives the lease of key up, if held.
func (st *Store) release(key string) {
	st.held.mu.Lock()
	h := st.held.m[key]
	st.unhold(h)
	st.held.mu.Unlock()
	if h == nil {
		return
	}
	h.writing.Lock()
	defer h.writing.Unlock()
	st.removeLease(h)
}

// unhold takes h, if still held, out of the held leases; st.held.mu is
// held.
func (st *Store) unhold(h *heldLease) bool {
	if h == nil || st.held.m[h.key] != h {
		return false
	}
	delete(st.held.m, h.key)
	if h.fence != nil {
		h.fence.Stop()
	}
	return true
}

// removeLease deletes the lease h, no longer held, from KV; h.writing is
// held.
func (st *Store) removeLease(h *heldLease) {
	key := h.key
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := st.leases.remove(ctx, key, h.rev)
	if isWrongLast(err) {
		// Moved on since: by another replica, or by a renewal of this
		// one's that reached NATS late (sent while cut off, flushed on
		// reconnection before this), which would keep the lease a TTL
		// with no one to renew it (review 44).
		if rev, ok := st.leases.holds(ctx, key, h.val); ok {
			err = st.leases.remove(ctx, key, rev)
		}
	}
	if err != nil && !isWrongLast(err) {
		st.fault("lease_release", err)
		st.held.mu.Lock()
		st.held.unsure[key] = h
		st.held.mu.Unlock()
	}
}

// settleReleases removes, in the background, the leases whose release's
// outcome was unknown and which still hold exactly this replica's value
// (see heldLeases); one whose TTL ran out since its last write is let go.
// Apart from the renewals: each removal may wait out NATS (review 48: in
// the round, 60 of them held every other lease's renewal 24 s).
func (st *Store) settleReleases() {
	if !st.held.settling.CompareAndSwap(false, true) {
		return // the one under way takes what comes meanwhile next time
	}
	if !st.spawn(func() {
		defer st.held.settling.Store(false)
		st.held.mu.Lock()
		list := make([]*heldLease, 0, len(st.held.unsure))
		for k, h := range st.held.unsure {
			list = append(list, h)
			delete(st.held.unsure, k)
		}
		st.held.mu.Unlock()
		eachAtOnce(list, func(h *heldLease) {
			h.writing.Lock()
			if time.Since(h.renewed) < st.opts.LeaseTTL {
				st.removeLease(h) // unsure again if NATS still does not answer
			}
			h.writing.Unlock()
		})
	}) {
		st.held.settling.Store(false)
	}
}

func (hl *heldLeases) releaseAll(st *Store) {
	hl.mu.Lock()
	keys := make([]string, 0, len(hl.m))
	for k := range hl.m {
		keys = append(keys, k)
	}
	hl.mu.Unlock()
	for _, k := range keys {
		st.release(k)
	}
}

// renewLoop renews the held producer leases, and the reader entries,
// three times per TTL. Its ticker loop is the idiom of every store's
// background loop (buffer's sweepLoop too), each on its own context.
func (st *Store) renewLoop() {
	defer st.wg.Done()
	round := st.opts.LeaseTTL / 3
	t := time.NewTimer(round)
	defer t.Stop()
	for {
		select {
		case <-st.ctx.Done():
			return
		case <-t.C:
		}
		began := time.Now()
		st.settleReleases()
		// A renewal that failed is tried again soon, not a round later:
		// the fence stops its producer two rounds after the last write
		// acknowledged, so a round lost to a blip (an acknowledgement
		// lost with its connection) leaves only the next round's renewal
		// to beat it, at the very moment it fires (review 43).
		next := round
		st.held.mu.Lock()
		list := make([]*heldLease, 0, len(st.held.m))
		for _, h := range st.held.m {
			list = append(list, h)
		}
		st.held.mu.Unlock()
		// renewConcurrency at a time: one after another, a round lasts
		// the held leases times a round trip, and with many calls or a
		// distant NATS it outlasts the fences' slack.
		var failed atomic.Bool
		eachAtOnce(list, func(h *heldLease) {
			if !st.renewHeld(h) {
				failed.Store(true)
			}
		})
		if failed.Load() {
			next = min(round, max(st.opts.LeaseTTL/15, 100*time.Millisecond))
		}
		st.heartbeatReaders()
		t.Reset(max(next-time.Since(began), 0)) // every round from its start, as a ticker's
	}
}

// eachAtOnce runs fn on each lease of list, renewConcurrency at a time,
// and returns once all are done.
func eachAtOnce(list []*heldLease, fn func(*heldLease)) {
	var wg sync.WaitGroup
	slots := make(chan struct{}, renewConcurrency)
	for _, h := range list {
		slots <- struct{}{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			fn(h)
			<-slots
		}()
	}
	wg.Wait()
}

// renewConcurrency bounds the renewals a round has under way at once: a
// round lasts about held leases/renewConcurrency round trips, which must
// stay well within a third of the TTL (review 46: at 16, some 130 calls on
// a NATS 600 ms away overran it).
const renewConcurrency = 128

// renewHeld renews the held lease h, or lets it go; false if its renewal
// failed and is to be tried again soon.
func (st *Store) renewHeld(h *heldLease) bool {
	if !h.writing.TryLock() {
		// Its release is under way (a round renews each lease once): it
		// must not hold the round, which renews every other lease, for
		// as long as the release takes.
		return true
	}
	st.held.mu.Lock()
	held := st.held.m[h.key] == h
	keep := h.keep
	st.held.mu.Unlock()
	if !held { // released since the round listed it
		h.writing.Unlock()
		return true
	}
	lost, ok := st.renewHeldLocked(h, keep)
	h.writing.Unlock()
	if lost != nil {
		lost()
	}
	return ok
}

// renewHeldLocked is renewHeld with h.writing held; it returns the lost
// callback to call once that is let go (lost may release leases).
func (st *Store) renewHeldLocked(h *heldLease, keep func() bool) (func(), bool) {
	// keep is set once the request stream's record is written
	// (NewStream, a takeover): before, a record not found is one not made
	// yet.
	if keep != nil && st.leaseUnneeded(h.key) {
		// Its stream ended or went without the lease going with it (a
		// takeover racing the session's end, or the session deleted where
		// this lease was not seen): renewed, it would live as long as this
		// replica (review 42).
		st.held.mu.Lock()
		mine := st.unhold(h)
		st.held.mu.Unlock()
		if mine {
			st.removeLease(h)
		}
		return nil, true
	}
	sent := time.Now()
	rev, err := st.renew(st.names.leases, h.key, h.val, h.rev, st.opts.LeaseTTL)
	switch {
	case err == nil:
		st.renewed(h, rev, sent)
	case isWrongLast(err) && st.stillOwn(h):
		// Its last write was stored, its acknowledgement lost: the key
		// holds exactly this replica's value (review 43: the standalone
		// stream's producer was stopped too).
	case isWrongLast(err) && keep != nil && keep() && st.reacquire(h):
		// A request stream's lease lapsed while NATS was out of reach; its
		// producer is still here and takes it again (unless a sweeper
		// failed the stream meanwhile: then its next publish fails, as the
		// sweeper's end expects).
	case isWrongLast(err):
		st.held.mu.Lock()
		mine := st.unhold(h)
		lost := h.lost
		st.held.mu.Unlock()
		if mine {
			return lost, true
		}
	default:
		st.fault("lease_renew", err)
		return nil, false
	}
	return nil, true
}

// leaseUnneeded reports whether the request stream key ended, or is gone
// as KV says (a miss in the mirror is read through, bounded by a short
// wait; a read that fails is no answer): its lease guards nothing.
func (st *Store) leaseUnneeded(key string) bool {
	r, _, ok := st.streams.get(key)
	if !ok {
		ctx, cancel := context.WithTimeout(st.ctx, 2*time.Second)
		defer cancel()
		var err error
		if r, _, err = st.streams.lookupErr(ctx, key); err != nil {
			return errors.Is(err, errNotFound)
		}
	}
	return r.State != policy.Live
}

// reacquire creates the lapsed lease h again; false if the key exists.
func (st *Store) reacquire(h *heldLease) bool {
	var rec leaseRecord
	if json.Unmarshal(h.val, &rec) != nil {
		return false
	}
	ctx, cancel := context.WithTimeout(st.ctx, 5*time.Second)
	defer cancel()
	sent := time.Now()
	rev, err := st.leases.create(ctx, h.key, &rec, jetstream.KeyTTL(st.opts.LeaseTTL))
	if err != nil {
		return false
	}
	st.renewed(h, rev, sent)
	return true
}

// renewed records that the held lease h was written at rev with a TTL
// that runs from no earlier than sent: its fence counts from then.
func (st *Store) renewed(h *heldLease, rev uint64, sent time.Time) {
	st.held.mu.Lock()
	if st.held.m[h.key] == h {
		h.rev, h.renewed = rev, sent
		if h.fence != nil {
			h.fence.Reset(st.fenceAfter() - time.Since(sent))
		}
	}
	st.held.mu.Unlock()
	var rec leaseRecord
	json.Unmarshal(h.val, &rec)
	st.leases.written(h.key, rev, h.val, &rec)
}

// stillOwn reports whether the held lease h, whose renewal found the key
// moved on, still holds exactly this replica's value: a write of its own
// whose acknowledgement was lost (review 41), and no one else's. It is
// renewed at once, so its fence counts from a known time (review 43: the
// lost write's TTL began at an unknown one, and the fence, left at the
// last acknowledged renewal, stopped a healthy producer).
func (st *Store) stillOwn(h *heldLease) bool {
	ctx, cancel := context.WithTimeout(st.ctx, 5*time.Second)
	defer cancel()
	own, ok := st.ownWrite(ctx, h.key, h.val)
	if !ok {
		return false
	}
	sent := time.Now()
	rev, err := st.renew(st.names.leases, h.key, h.val, own, st.opts.LeaseTTL)
	if err != nil {
		// Held still, by the revision found; its fence counts on from the
		// last known write, and the next round tries again.
		st.held.mu.Lock()
		if st.held.m[h.key] == h {
			h.rev = own
		}
		st.held.mu.Unlock()
		return true
	}
	st.renewed(h, rev, sent)
	return true
}

// ownWrite reports whether the lease key holds exactly val, this replica's
// write (val carries the replica and the time it was taken), and applies
// it; its revision is returned.
func (st *Store) ownWrite(ctx context.Context, key string, val []byte) (uint64, bool) {
	rev, ok := st.leases.holds(ctx, key, val)
	if !ok {
		return 0, false
	}
	var lr leaseRecord
	if json.Unmarshal(val, &lr) == nil {
		st.leases.apply(key, rev, val, &lr)
	}
	return rev, true
}

// heartbeatReaders refreshes this replica's reader entries, so no replica
// takes their clients for gone.
func (st *Store) heartbeatReaders() {
	for _, s := range st.handleList() {
		for _, str := range s.streamList() {
			str.rmu.Lock()
			list := make([]*reader, 0, len(str.readers))
			for r := range str.readers {
				list = append(list, r)
			}
			str.rmu.Unlock()
			for _, r := range list {
				r.heartbeat()
			}
		}
	}
}

// renew rewrites a lease key at rev with a fresh TTL. kv.Update would drop
// the per-key TTL, so this publishes to the bucket's subject directly.
func (st *Store) renew(bucket, key string, val []byte, rev uint64, ttl time.Duration) (uint64, error) {
	// Bounded well within a round, and by the connection's life: a write
	// whose acknowledgement is lost is never answered, and the renewal is
	// tried again soon (renewLoop).
	ctx, cancel := context.WithTimeout(st.ctx, min(5*time.Second, max(time.Second, ttl/6)))
	defer cancel()
	if st.srv == nil {
		defer context.AfterFunc(st.conn.ctx(), cancel)()
	}
	ack, err := st.js.Publish(ctx, "$KV."+bucket+"."+key, val,
		jetstream.WithExpectLastSequencePerSubject(rev), jetstream.WithMsgTTL(ttl))
	if err != nil {
		return 0, err
	}
	return ack.Sequence, nil
}

// sweeperLease makes one replica at a time the zone's sweeper.
type sweeperLease struct {
	mu      sync.Mutex
	rev     uint64
	renewed time.Time
}

func (st *Store) sweeperTTL() time.Duration {
	return max(2*time.Second, (4 * st.opts.SweepInterval).Round(time.Second))
}

// sweeps reports whether this replica held the sweeper lease when it last
// looked.
func (st *Store) sweeps() bool {
	st.sweeper.mu.Lock()
	defer st.sweeper.mu.Unlock()
	return st.sweeper.rev != 0
}

// holdSweeper reports whether this replica sweeps now, taking or renewing
// the lease as needed.
func (st *Store) holdSweeper() bool {
	sl := &st.sweeper
	sl.mu.Lock()
	defer sl.mu.Unlock()
	ttl := st.sweeperTTL()
	if sl.rev != 0 && time.Since(sl.renewed) < ttl/3 {
		return true
	}
	val, _ := json.Marshal(leaseRecord{Replica: st.opts.ReplicaID, Since: time.Now().UnixNano()})
	if sl.rev != 0 {
		rev, err := st.renew(st.names.meta, "sweeper", val, sl.rev, ttl)
		switch {
		case err == nil:
			sl.rev, sl.renewed = rev, time.Now()
			return true
		case isWrongLast(err):
			sl.rev = 0 // it expired and another replica took it
		default:
			st.fault("sweeper_lease", err)
			return time.Since(sl.renewed) < ttl*2/3
		}
	}
	ctx, cancel := context.WithTimeout(st.ctx, 5*time.Second)
	defer cancel()
	rev, err := st.meta.Create(ctx, "sweeper", val, jetstream.KeyTTL(ttl))
	if err != nil {
		if !errors.Is(err, jetstream.ErrKeyExists) {
			st.fault("sweeper_lease", err)
		}
		return false
	}
	sl.rev, sl.renewed = rev, time.Now()
	return true
}

func (sl *sweeperLease) release(st *Store) {
	sl.mu.Lock()
	rev := sl.rev
	sl.rev = 0
	sl.mu.Unlock()
	if rev == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	st.meta.Delete(ctx, "sweeper", jetstream.LastRevision(rev))
}
