package natsstore

// Producer leases written later (issue 23). A request stream's lease was
// created with the stream and deleted with its end: two of a short call's
// nine NATS writes, for a lease no one reads while the call lives a few
// milliseconds. NewStream now holds the lease on this replica only
// (holdUnwritten) and says so in the record it creates (LeaseLater); the
// renewals write the lease at their next round, within LeaseTTL/3, and
// clear the mark, and from then on it is the lease it always was. A call
// that ends before that writes none.
//
// A live stream marked LeaseLater and with no lease found counts as held
// (leased) for a LeaseTTL from when a replica first found it so, or until
// the record is 2 LeaseTTLs old by the replica's clock if that comes
// first: a producer that died before writing its lease is judged as one
// whose lease lapsed, no sooner than a lease written at once would have
// lapsed unless clocks disagree by more than a LeaseTTL. Whoever then takes
// the stream (a takeover, the sweeper failing it) creates the lease, which
// excludes the others and the producer, if it was only slow: its write
// finds the key taken, and it stops. A producer that gives a live stream
// up before writing its lease (fenced off NATS, done with the stream
// unended) clears the mark, so the others take it over at once.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/mcpresume/caddy-mcp-resume/policy"
)

// holdUnwritten makes this replica the producer of the new request stream
// key without writing its lease yet (renewLoop writes it).
func (st *Store) holdUnwritten(key string) {
	now := time.Now()
	b, _ := json.Marshal(leaseRecord{Replica: st.opts.ReplicaID, Since: now.UnixNano()})
	st.held.mu.Lock()
	st.held.m[key] = &heldLease{key: key, val: b, renewed: now}
	st.held.mu.Unlock()
}

// writeHeld writes the unwritten lease h (renewLoop's round for it), then
// clears the record's mark: from then on it is renewed as any lease. A
// replica that created the key first took the stream (this producer was
// judged dead): h's producer stops.
func (st *Store) writeHeld(h *heldLease) {
	var rec leaseRecord
	if json.Unmarshal(h.val, &rec) != nil {
		return
	}
	sent := time.Now()
	ctx, cancel := context.WithTimeout(st.ctx, 5*time.Second)
	defer cancel()
	if st.streamOver(ctx, h.key) {
		// Ended, or its session gone (clearIncarnation removes the
		// leases it sees, and this one it could not): nothing to write.
		st.held.mu.Lock()
		if st.held.m[h.key] == h {
			delete(st.held.m, h.key)
			if h.fence != nil {
				h.fence.Stop()
			}
		}
		st.held.mu.Unlock()
		return
	}
	rev, err := st.leases.createWithTTL(ctx, h.key, &rec, st.opts.LeaseTTL)
	if errors.Is(err, jetstream.ErrKeyExists) {
		if own, ok := st.ownWrite(ctx, h.key, h.val); ok {
			rev, err = own, nil // its own write, whose acknowledgement was lost
		}
	}
	st.held.mu.Lock()
	mine := st.held.m[h.key] == h
	switch {
	case err == nil && mine:
		h.rev, h.renewed = rev, sent
		if h.fence != nil {
			h.fence.Reset(st.fenceAfter() - time.Since(sent))
		}
		st.held.mu.Unlock()
		st.clearLeaseLater(ctx, h.key)
	case err == nil:
		// Released while the write was under way (release found nothing
		// to delete): the lease goes too.
		st.held.mu.Unlock()
		if err := st.leases.remove(ctx, h.key, rev); err != nil && !isWrongLast(err) {
			st.fault("lease_release", err)
		}
	case errors.Is(err, jetstream.ErrKeyExists) && mine:
		delete(st.held.m, h.key)
		if h.fence != nil {
			h.fence.Stop()
		}
		st.held.mu.Unlock()
		if h.lost != nil {
			h.lost()
		}
	default:
		st.held.mu.Unlock()
		if err != nil && !errors.Is(err, jetstream.ErrKeyExists) {
			st.fault("lease_renew", err) // the next round tries again; the fence bounds it
		}
	}
}

// clearLeaseLater clears the LeaseLater mark of the stream key while it is
// live and this replica's: its lease is written, or given up.
func (st *Store) clearLeaseLater(ctx context.Context, key string) {
	if r, _, ok := st.streams.get(key); !ok || !r.LeaseLater || r.State != policy.Live || r.Producer != st.opts.ReplicaID {
		return // the common case, a call that ended: no write
	}
	_, err := st.streams.update(ctx, key, func(r *streamRecord) error {
		if !r.LeaseLater || r.State != policy.Live || r.Producer != st.opts.ReplicaID {
			return errUnchanged
		}
		r.LeaseLater = false
		return nil
	})
	if err != nil && !errors.Is(err, errUnchanged) && !errors.Is(err, errNotFound) {
		// Written or not, the mark only delays the others' judgement by
		// a LeaseTTL.
		st.fault("lease_mark", err)
	}
}

// unwrittenLeases are the live streams whose lease this replica found
// unwritten: since when (the start of its wait before it takes their
// producers for dead), and when it last asked.
type unwrittenLeases struct {
	mu sync.Mutex
	m  map[string]*[2]time.Time
}

// since returns when key was first found unwritten (now, if just now).
func (u *unwrittenLeases) since(key string, now time.Time) time.Time {
	u.mu.Lock()
	defer u.mu.Unlock()
	if t := u.m[key]; t != nil {
		t[1] = now
		return t[0]
	}
	if u.m == nil {
		u.m = make(map[string]*[2]time.Time)
	}
	u.m[key] = &[2]time.Time{now, now}
	return now
}

func (u *unwrittenLeases) forget(key string) {
	u.mu.Lock()
	delete(u.m, key)
	u.mu.Unlock()
}

// prune forgets what was last asked about before cutoff (a stream that
// ended elsewhere, a session forgotten). The sweeper asks once per scan:
// the cutoff must lie before its previous scan (review 40: pruned between
// scans, a wait began anew at every scan and never ended).
func (u *unwrittenLeases) prune(cutoff time.Time) {
	u.mu.Lock()
	for k, t := range u.m {
		if t[1].Before(cutoff) {
			delete(u.m, k)
		}
	}
	u.mu.Unlock()
}

// heldUnwritten reports whether key is, as far as this replica can tell,
// the lease of a live request stream whose producer holds it unwritten:
// this replica's own, or another's within its wait (see above). It is
// asked once the lease is not found held.
func (st *Store) heldUnwritten(ctx context.Context, key string) bool {
	st.held.mu.Lock()
	h := st.held.m[key]
	mine := h != nil && h.rev == 0
	st.held.mu.Unlock()
	if mine {
		return true
	}
	rec, _, ok := st.streams.get(key)
	if !ok {
		// Not in the mirror (not loaded yet here): read through, or a
		// takeover here would create the lease of a live producer.
		rec, _, ok = st.streams.lookup(ctx, key)
	}
	if !ok || !rec.LeaseLater || rec.State != policy.Live || st.leases.known(key) {
		// A lease this replica saw (held, released or lapsed) was
		// written: a mark still set is one whose clearing was not seen
		// yet, or failed.
		st.unwritten.forget(key)
		return false
	}
	now := time.Now()
	ttl := st.opts.LeaseTTL
	// Its wait: a LeaseTTL from when this replica first found it so, or
	// less once the record is 2 LeaseTTLs old by this replica's clock (its
	// producer writes the lease within a third of one: only clocks a
	// LeaseTTL apart could take a live one for dead). A client coming
	// back long after its replica died is not kept waiting a TTL more.
	if now.Sub(st.unwritten.since(key, now)) < ttl && now.Sub(time.Unix(0, rec.Created)) < 2*ttl {
		return true
	}
	// Its wait is over: unless KV holds a lease this replica's mirror
	// missed (its notification lost), its producer died before writing it.
	kv, err := st.kvStream(st.names.leases)
	if err != nil {
		return true // cannot tell: nor can a takeover create the lease now
	}
	m, err := kv.GetLastMsgForSubject(ctx, "$KV."+st.names.leases+"."+key)
	switch {
	case errors.Is(err, jetstream.ErrMsgNotFound):
		return false
	case err != nil:
		return true
	case m.Header.Get("KV-Operation") != "" || m.Header.Get(jetstream.MarkerReasonHeader) != "":
		return false // written and gone since: released, or lapsed
	}
	var lr leaseRecord
	if json.Unmarshal(m.Data, &lr) == nil {
		st.leases.apply(key, m.Sequence, m.Data, &lr)
	}
	return true
}

// ownWrite reports whether the lease key holds exactly val, this replica's
// write (val carries the replica and the time it was held): a create
// retried after its acknowledgement was lost finds the key taken by
// itself (review 41: the producer stopped, its call failed). Its revision
// is returned.
func (st *Store) ownWrite(ctx context.Context, key string, val []byte) (uint64, bool) {
	e, err := st.leases.kv.Get(ctx, key)
	if err != nil || !bytes.Equal(e.Value(), val) {
		return 0, false
	}
	var lr leaseRecord
	if json.Unmarshal(e.Value(), &lr) == nil {
		st.leases.apply(key, e.Revision(), e.Value(), &lr)
	}
	return e.Revision(), true
}

// streamOver reports whether the request stream key ended, or is gone as
// KV says (a miss in the mirror is read through; a read that fails is no
// answer): its lease has nothing left to guard.
func (st *Store) streamOver(ctx context.Context, key string) bool {
	r, _, ok := st.streams.get(key)
	if !ok {
		var err error
		if r, _, err = st.streams.lookupErr(ctx, key); err != nil {
			return errors.Is(err, errNotFound)
		}
	}
	return r.State != policy.Live
}
