package natsstore

// When NATS comes back without the zone's data (a server restarted with an
// empty store directory: a container without a persistent volume, a wiped
// disk, a new cluster behind the same URL), the stream, the buckets and the
// secret the store made when it opened are gone. The health loop notices,
// and the store makes them again, ends the sessions its mirrors held (they
// are tombstoned: a resume of their streams gets a gap, never a 400 or
// silence) and tells Options.OnDataLost.

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/mcpresume/caddy-mcp-resume/policy"
)

// DataLoss is what a store found lost, and recreated.
type DataLoss struct {
	Missing  []string // what was missing: the events stream, buckets, "secret"
	Sessions int      // sessions this replica held that NATS lost (now tombstones)
	Events   uint64   // events they retained
	// SecretChanged: another replica stored a new zone secret first (it
	// opened while the data was missing), and this one took it: event IDs
	// signed with the old one are no longer recognised as the proxy's.
	SecretChanged bool
}

// lossCheck is the health loop's state of the data check.
type lossCheck struct {
	seen int // checks in a row that found something missing
}

// lossChecks is how many checks in a row must find data missing before the
// store recreates it: one answer could be a cluster's passing confusion.
const lossChecks = 2

// checkData runs after each probe: the secret is read every time (one
// direct get); if it is not the one this replica holds, or the probe
// failed, the stream and buckets are looked up too. Only a definite "not
// found" counts: a timeout or an unreachable cluster is no loss. It
// reports whether it recreated anything.
func (st *Store) checkData(probeFailed bool) bool {
	ctx, cancel := context.WithTimeout(st.ctx, probeTimeout)
	missing := st.missing(ctx, probeFailed)
	cancel()
	if len(missing) == 0 {
		st.lost.seen = 0
		return false
	}
	if st.lost.seen++; st.lost.seen < lossChecks {
		return false
	}
	st.lost.seen = 0
	return st.recoverLost(missing)
}

// missing reports what of the zone NATS does not hold. The zone's mark
// (META key "zone", made once with the secret) tells a replica that
// another one recreated the zone already: the secret may be the same, the
// data is not.
func (st *Store) missing(ctx context.Context, probeFailed bool) []string {
	var out []string
	e, err := st.meta.Get(ctx, zoneKey)
	switch {
	case err == nil && string(e.Value()) == st.zoneMark():
		if !probeFailed {
			return nil
		}
	case err == nil:
		out = append(out, "data (recreated by another replica)")
	case errors.Is(err, jetstream.ErrKeyNotFound), errors.Is(err, jetstream.ErrKeyDeleted):
		out = append(out, "secret")
	}
	if _, err := st.js.Stream(ctx, st.names.events); errors.Is(err, jetstream.ErrStreamNotFound) {
		out = append(out, st.names.events)
	}
	n := st.names
	for _, b := range []string{n.sessions, n.streams, n.tombs, n.leases, n.meta} {
		if _, err := st.js.KeyValue(ctx, b); errors.Is(err, jetstream.ErrBucketNotFound) {
			out = append(out, b)
		}
	}
	return out
}

// zoneKey is the META key of the zone's mark: a random value made with the
// zone (and again when it is recreated), the first writer's.
const zoneKey = "zone"

func (st *Store) zoneMark() string {
	if m := st.mark.Load(); m != nil {
		return *m
	}
	return ""
}

// loadMark reads the zone's mark, making it if absent (as a new value).
func (st *Store) loadMark(ctx context.Context) error {
	mark, err := st.readMark(ctx)
	if err == nil {
		st.mark.Store(&mark)
	}
	return err
}

// readMark is loadMark without taking the mark as this replica's.
func (st *Store) readMark(ctx context.Context) (string, error) {
	b := make([]byte, 16)
	rand.Read(b)
	mark := hex.EncodeToString(b)
	err := provisioning(ctx, func(ctx context.Context) error {
		_, err := st.meta.Create(ctx, zoneKey, []byte(mark))
		if err == nil {
			return nil
		}
		if !errors.Is(err, jetstream.ErrKeyExists) {
			return err
		}
		e, err := st.meta.Get(ctx, zoneKey)
		if err != nil {
			return err
		}
		mark = string(e.Value())
		return nil
	})
	return mark, err
}

// recoverLost recreates what is missing and ends what this replica held
// of the lost data; it reports whether it could.
func (st *Store) recoverLost(missing []string) bool {
	ctx, cancel := context.WithTimeout(st.ctx, 30*time.Second)
	defer cancel()
	if _, err := st.ensure(ctx); err != nil {
		st.fault("recreate", err)
		return false
	}
	// The secret this replica holds is the zone's, unless another replica
	// stored one first: every replica ends up with the stored one.
	old := st.Key()
	if err := st.loadKey(ctx, old); err != nil {
		st.fault("recreate", err)
		return false
	}
	// The mark is taken as this replica's once what it held is ended: an
	// interest loaded meanwhile would find the zone intact and prune the
	// lost sessions before they are tombstoned (zoneIntact).
	mark, err := st.readMark(ctx)
	if err != nil {
		st.fault("recreate", err)
		return false
	}
	loss := DataLoss{Missing: missing, SecretChanged: !bytes.Equal(old, st.Key())}

	// What the mirrors hold is gone from NATS (revisions start again, so
	// they could not even follow the new buckets): stop the sweeper's
	// watches (its next sweep starts them again), end every session held
	// (a tombstone remembers each, with the requests of its streams a
	// client may lack an answer for), forget.
	st.stopMirrors()
	type lost struct {
		sh   string
		tomb *tombRecord
	}
	var ended []lost
	st.sessions.each(func(sh string, rec *sessionRecord, _ uint64) {
		if _, err := st.sessions.kv.Get(ctx, sh); err == nil {
			return // made again since (by a replica that recovered first): it lives
		}
		e := st.ending(ctx, rec, policy.ReasonProxyRestarted)
		// The head of a live stream is known to its producer only (a
		// record lags it, and the stored events are gone): a tombstone
		// naming a lower head than a client was sent would refuse its
		// resume (400). Another replica's stream is left to its producer
		// (mergeTomb adds it); forgotten, its resume gets the gap and is
		// held, as after a restart.
		for num, v := range e.tomb.Past.Streams {
			if v.State == policy.Live && !st.producesHere(streamKey(sh, rec.Epoch, num)) {
				delete(e.tomb.Past.Streams, num)
			}
		}
		loss.Sessions++
		loss.Events += e.evicted
		ended = append(ended, lost{sh, e.tomb})
	})
	var tombs []lost
	st.tombs.each(func(sh string, t *tombRecord, _ uint64) { tombs = append(tombs, lost{sh, t}) })
	// The tombstones first, then the sessions go: a session forgotten here
	// before its tombstone shows would be no one's for a moment, and a
	// resume then adopted instead of told of the loss. Earlier tombstones
	// first, then the sessions just ended.
	st.tombs.reset()
	for _, l := range append(tombs, ended...) {
		if err := st.mergeTomb(ctx, l.sh, l.tomb); err != nil {
			st.fault("tombstone", err)
		}
	}
	st.sessions.reset() // every handle here ends: readers, producers, detached upstream reads
	st.streams.reset()
	st.leases.reset()
	st.mark.Store(&mark)
	// The zone's tally counted what is lost: it starts again from nothing
	// here (and what was heard of the new zone), and the sweeper counts
	// the zone anew at once.
	st.zone.reset(st.opts.ScanInterval)
	st.scanSoon.Store(true)
	st.total.invalidate()
	st.freed.fire()
	st.counters.EventsEvicted.Add(loss.Events)
	if st.opts.OnDataLost != nil {
		st.opts.OnDataLost(loss)
	}
	return true
}

// producesHere reports whether this replica produces the stream.
func (st *Store) producesHere(key string) bool {
	v, ok := st.byKey.Load(key)
	if !ok {
		return false
	}
	_, ok = v.(*stream).currentWriter().storedHead()
	return ok
}

// mergeTomb writes a tombstone of the recovery, merged with one another
// replica wrote for the same session: of each stream, the higher head
// (the stream's producer knows what it stored; the others' records may
// lag it, and a cursor past a tombstone's head is refused).
func (st *Store) mergeTomb(ctx context.Context, sh string, t *tombRecord) error {
	for round := 0; ; round++ {
		_, err := st.tombs.create(ctx, sh, t)
		if err == nil || !errors.Is(err, jetstream.ErrKeyExists) {
			return err
		}
		_, err = st.tombs.update(ctx, sh, func(cur *tombRecord) error {
			if cur.ID != t.ID || cur.Past.Epoch != t.Past.Epoch {
				*cur = *t
				return nil
			}
			changed := false
			for num, v := range t.Past.Streams {
				if c, ok := cur.Past.Streams[num]; ok && c.Head >= v.Head {
					continue
				}
				if cur.Past.Streams == nil {
					cur.Past.Streams = make(map[uint32]policy.StreamView)
				}
				cur.Past.Streams[num], changed = v, true
			}
			if !changed {
				return errUnchanged
			}
			return nil
		})
		if !errors.Is(err, errNotFound) || round >= 5 {
			return err
		}
	}
}
