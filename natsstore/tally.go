package natsstore

import (
	"context"
	"encoding/json"
	"sync"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/policy"
)

// The zone's session counts on a replica that does not sweep. It holds the
// sessions it serves only (interest.go), so the sweeper, which watches the
// sessions and tombstones buckets whole, publishes its tally (META key
// "tally") each sweep it changed, and the others read it each sweep
// interval. Admission adds what this replica created and deleted since the
// tally was taken: the counts lag other replicas' creations and deletions
// by a sweep interval or two (two replicas may admit the last place at
// once, as before).

const tallyKey = "tally"

type publishedTally struct {
	Counts [3]int64 `json:"n"` // Sessions, Adopted, Untapped (tallySlot)
	Tombs  int      `json:"tombs"`
	At     int64    `json:"at"` // unix nanos, the sweeper's clock
}

// zoneTally is the last published tally this replica read, and its own
// changes since.
type zoneTally struct {
	mu        sync.Mutex
	read      publishedTally
	published publishedTally // the sweeper's: what it last wrote
	local     []tallyChange  // this replica's creations (+1) and deletions (-1)
}

type tallyChange struct {
	at    int64
	slot  int
	delta int64
}

// changed counts a creation or deletion made here.
func (z *zoneTally) changed(r *sessionRecord, delta int64) {
	z.mu.Lock()
	z.local = append(z.local, tallyChange{time.Now().UnixNano(), tallySlot(r), delta})
	z.mu.Unlock()
}

// counts is the published tally plus this replica's changes since.
func (z *zoneTally) counts() (policy.SessionCounts, int) {
	z.mu.Lock()
	defer z.mu.Unlock()
	n := z.read.Counts
	keep := z.local[:0]
	for _, c := range z.local {
		if c.at > z.read.At-int64(time.Second) {
			// Within a second of the reading (clocks differ): counted
			// here, and kept until a reading surely includes it.
			keep = append(keep, c)
			if c.at > z.read.At {
				n[c.slot] += c.delta
			}
		}
	}
	z.local = keep
	return policy.SessionCounts{Sessions: int(max(n[0], 0)), Adopted: int(max(n[1], 0)), Untapped: int(max(n[2], 0))}, z.read.Tombs
}

// publishTally writes the sweeper's tally if it changed (at most once per
// sweep).
func (st *Store) publishTally() {
	c := st.tally.counts()
	t := publishedTally{Counts: [3]int64{int64(c.Sessions), int64(c.Adopted), int64(c.Untapped)}, Tombs: st.tombs.count(), At: time.Now().UnixNano()}
	z := &st.zone
	z.mu.Lock()
	same := z.published.Counts == t.Counts && z.published.Tombs == t.Tombs && time.Duration(t.At-z.published.At) < 10*time.Second
	z.mu.Unlock()
	if same {
		return
	}
	b, _ := json.Marshal(t)
	ctx, cancel := st.opCtx()
	defer cancel()
	if _, err := st.meta.Put(ctx, tallyKey, b); err != nil {
		st.fault("tally", err)
		return
	}
	z.mu.Lock()
	z.published = t
	z.mu.Unlock()
}

// readTally reads the sweeper's last published tally.
func (st *Store) readTally() {
	ctx, cancel := context.WithTimeout(st.ctx, 2*time.Second)
	defer cancel()
	e, err := st.meta.Get(ctx, tallyKey)
	if err != nil {
		return // none yet, or NATS out of reach: the last reading stands
	}
	var t publishedTally
	if json.Unmarshal(e.Value(), &t) != nil {
		return
	}
	st.zone.mu.Lock()
	if t.At >= st.zone.read.At {
		st.zone.read = t
	}
	st.zone.mu.Unlock()
}
