package natsstore

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/mcpresume/caddy-mcp-resume/policy"
)

// The zone's session counts. A replica holds the sessions it serves only
// (interest.go), so the sweeper, which loads the zone's records each scan
// (sweep.go), publishes its tally (META key "tally") each scan it changed,
// and the others read it each sweep interval. Once a count is within half its bound (or 64 sessions) of it,
// every replica also tells the others of each session of that origin it
// creates or deletes (core NATS, <P>.n._tally: a few bytes, nothing to
// decode), and admission adds the creations and deletions made since the
// tally was taken, on any replica: near the bound the counts lag only by
// the notice's transit (two replicas may admit the last place at once, as
// before). Far from it, the replicas pay nothing per session (a notice
// wakes an idle replica: ~25 µs each, 3-5% of the serving replica's CPU in
// session churn), and passing the bound would take more than half of it
// (and 64) created within a tally's lag. A notice core NATS drops is
// counted once the next tally includes it.

const tallyKey = "tally"

type publishedTally struct {
	Counts [3]int64 `json:"n"` // Sessions, Adopted, Untapped (tallySlot)
	Tombs  int      `json:"tombs"`
	// At is when it was taken, unix nanos, on the sweeper's clock as
	// published; as read (zoneTally.read), on the reader's own.
	At int64 `json:"at"`
}

// zoneTally is the last published tally this replica read, and the
// creations and deletions made since (its own, and those it was told of).
//
// Every time compared here is this replica's own clock: another replica's
// clock may run ahead or behind (review 30: a sweeper ten minutes ahead
// froze the others' counts, and admission let 11 sessions into 6). A
// tally read is newer by its KV revision, not its stamp, and is taken as
// made at the last poll that did not see it yet: a change of the time
// between is counted on top of the tally that may include it already,
// erring towards refusing a place for a sweep interval, never towards
// admitting one more. A notice is stamped when it arrives.
type zoneTally struct {
	mu     sync.Mutex
	read   publishedTally
	rev    uint64        // the KV revision of read
	polled int64         // when this replica last read the tally's key (unix nanos), 0 before
	local  []tallyChange // the zone's creations (+1) and deletions (-1) since the reading, as told
	// since sums the changes of local made after the reading summedFor
	// (the one read, unless a new one came since): counts is then no walk
	// of local, which holds thousands in session churn.
	since     [4]int64
	summedFor publishedTally
}

type tallyChange struct {
	at    int64
	slot  int
	delta int64
}

// tallyChanged counts a creation or deletion made here, and tells the
// others near the bound.
func (st *Store) tallyChanged(r *sessionRecord, delta int64) {
	c := tallyChange{time.Now().UnixNano(), tallySlot(r), delta}
	st.zone.add(c)
	st.tellTally(c, false)
}

// tellTally tells the other replicas of a change near the bound (or
// always: the undoing of one told); it reports whether it did.
func (st *Store) tellTally(c tallyChange, always bool) bool {
	if st.srv != nil || !always && !nearBound(st.sessionCounts(), c.slot) {
		return false // an embedded server of its own (no other replica), or far from the bound
	}
	b := make([]byte, 10)
	b[0], b[1] = byte(c.slot), byte(c.delta+1) // delta +1 or -1: 2 or 0
	binary.BigEndian.PutUint64(b[2:], uint64(c.at))
	if err := st.nc.Publish(st.tallySubject(), b); err != nil {
		st.fault("notify", err)
	}
	return true
}

// reserved tells the other replicas, near the bound, of a creation this
// replica admitted, before it is written: told once written, a creation
// was unseen by the others for the length of its writes (review 29). The
// returned undo tells them it was not made after all; made, the creation
// is counted here with created. Creations admitted at the same moment on
// several replicas still all pass (a burst of 12 initializes on 3
// replicas took 12 places of 6).
func (st *Store) reserved(o policy.SessionOrigin) (created func(*sessionRecord), undo func()) {
	c := tallyChange{time.Now().UnixNano(), tallySlot(&sessionRecord{Origin: o}), 1}
	if !st.tellTally(c, false) {
		return func(r *sessionRecord) { st.tallyChanged(r, 1) }, func() {}
	}
	return func(*sessionRecord) { st.zone.add(c) }, func() {
		c.at, c.delta = time.Now().UnixNano(), -1
		st.tellTally(c, true)
	}
}

// nearBound reports whether the count of slot (tallySlot) is within half
// its bound (policy.AdmitSession's), or 64 sessions, of it.
func nearBound(c policy.SessionCounts, slot int) bool {
	if c.MaxSessions <= 0 {
		return false
	}
	n, bound := c.Sessions, c.MaxSessions
	switch slot {
	case 1:
		n, bound = c.Adopted, max(c.MaxSessions/policy.AdoptedFraction, 1)
	case 2:
		n = c.Untapped
	}
	return n+max(bound/2, 64) >= bound
}

func (st *Store) tallySubject() string { return st.opts.Prefix + ".n._tally" }

// tallyNoted takes another replica's notice of a creation or deletion.
func (st *Store) tallyNoted(m *nats.Msg) {
	if len(m.Data) != 10 || m.Data[0] > 2 || m.Data[1] != 0 && m.Data[1] != 2 {
		return
	}
	// Stamped as it arrives: the teller's stamp is on its own clock
	// (still sent, for replicas of earlier versions).
	st.zone.add(tallyChange{time.Now().UnixNano(), int(m.Data[0]), int64(m.Data[1]) - 1})
}

// reset forgets the tally read: the zone was recreated (recover.go), from
// nothing. The changes heard within keep before it stay counted on the new
// zone: the replicas that recovered first admit on it already and tell of
// it, and a replica that forgot their notices counted only its own
// sessions until the next scan (review 32: 18 sessions into max_sessions 6,
// one at a time on 3 replicas, each filling the bound alone). Those of the
// old zone among them count too, until a tally of the new zone is read:
// the side of refusing a place, for a scan interval or two.
func (z *zoneTally) reset(keep time.Duration) {
	from := time.Now().Add(-keep).UnixNano()
	z.mu.Lock()
	z.read, z.rev, z.polled = publishedTally{At: from}, 0, from
	z.mu.Unlock()
}

func (z *zoneTally) add(c tallyChange) {
	z.mu.Lock()
	z.local = append(z.local, c)
	if z.summedFor == z.read && c.at > z.read.At {
		z.since[c.slot] += c.delta
	} // else the next counts sums local again, this one with it
	z.mu.Unlock()
}

// tombSlot is the slot of tombstones in tallyChange: counted where they
// are written and consumed, told to no one.
const tombSlot = 3

// tombChanged counts a tombstone written (+1) or consumed (-1) here.
func (st *Store) tombChanged(delta int64) {
	st.zone.add(tallyChange{time.Now().UnixNano(), tombSlot, delta})
}

// counts is the published tally plus the changes made since: the zone's
// session counts, and its tombstones.
func (z *zoneTally) counts() (policy.SessionCounts, int) {
	z.mu.Lock()
	defer z.mu.Unlock()
	if z.summedFor != z.read {
		// A new reading: the changes it surely includes go, those after
		// it are summed (once per reading).
		keep := z.local[:0]
		z.since = [4]int64{}
		for _, c := range z.local {
			if c.at > z.read.At-int64(time.Second) {
				// Within a second of the reading (clocks differ): counted
				// here, and kept until a reading surely includes it.
				keep = append(keep, c)
				if c.at > z.read.At {
					z.since[c.slot] += c.delta
				}
			}
		}
		z.local, z.summedFor = keep, z.read
	}
	var n [4]int64
	copy(n[:], z.read.Counts[:])
	n[tombSlot] = int64(z.read.Tombs)
	for i, d := range z.since {
		n[i] += d
	}
	return policy.SessionCounts{Sessions: int(max(n[0], 0)), Adopted: int(max(n[1], 0)), Untapped: int(max(n[2], 0))},
		int(max(n[tombSlot], 0))
}

// publishTally writes the sweeper's tally (once per scan, the mirrors
// holding the zone).
func (st *Store) publishTally() {
	c := st.tally.counts()
	t := publishedTally{Counts: [3]int64{int64(c.Sessions), int64(c.Adopted), int64(c.Untapped)}, Tombs: st.tombs.count(), At: time.Now().UnixNano()}
	z := &st.zone
	defer z.counts() // forgets the changes told before the tally it published
	// Written every scan, changed or not: a tally is the count as of its
	// time, and the changes counted on top of it are those made after.
	b, _ := json.Marshal(t)
	ctx, cancel := st.opCtx()
	defer cancel()
	rev, err := st.meta.Put(ctx, tallyKey, b)
	if err != nil {
		st.fault("tally", err)
		return
	}
	z.mu.Lock()
	z.read, z.rev, z.polled = t, rev, t.At
	z.mu.Unlock()
}

// readTally reads the sweeper's last published tally.
func (st *Store) readTally() {
	ctx, cancel := context.WithTimeout(st.ctx, 2*time.Second)
	defer cancel()
	e, err := st.meta.Get(ctx, tallyKey)
	now := time.Now().UnixNano()
	z := &st.zone
	if err != nil {
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			z.mu.Lock()
			z.polled = now // none yet: one published from now on is newer
			z.mu.Unlock()
		}
		return // NATS out of reach: the last reading stands
	}
	var t publishedTally
	if json.Unmarshal(e.Value(), &t) != nil {
		return
	}
	z.mu.Lock()
	// A later revision is a later tally; an earlier one is a lagging
	// replica of the bucket answering (direct gets), and ignored. After
	// data loss the bucket's revisions start again: reset (recover.go)
	// forgets the revision read.
	if e.Revision() > z.rev {
		t.At = z.polled
		if t.At == 0 {
			t.At = now // the first reading: nothing counted here before it
		}
		z.read, z.rev = t, e.Revision()
	}
	z.polled = now
	z.mu.Unlock()
	z.counts() // forgets the changes the reading includes
}
