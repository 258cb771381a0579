package natsstore

import (
	"errors"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/policy"
)

// errStale: the record changed so that the eviction computed is no longer
// allowed (a reader attached, an acknowledgement was undone).
var errStale = errors.New("eviction no longer allowed")

// readerNext is the position of the stream's attached reader for
// policy.Evictable: 0 if none is, or its replica died.
func (st *Store) readerNext(rec *streamRecord, now time.Time) uint64 {
	if r := rec.readerAt(now, st.opts.LeaseTTL); r != nil {
		return max(r.Next, 1)
	}
	return 0
}

// evictable is the highest seq of the stream that may go now (below the
// floor if none). Events past both the acknowledged and the delivered
// position can never go, so the walk stops there.
func (st *Store) evictable(rec *streamRecord, now time.Time) uint64 {
	limit := max(rec.Acked, rec.Delivered)
	if limit < rec.Floor {
		return rec.Floor - 1
	}
	return rec.evictable(limit, st.readerNext(rec, now), now, st.Limits().ResumeWindow)
}

// evict moves a stream's floor as far as policy.Evictable allows now, by
// compare-and-set (any replica may), then purges the messages wholly
// below it. It reports whether the floor moved.
func (st *Store) evict(key string, now time.Time) bool {
	rec, _, ok := st.streams.get(key)
	if !ok {
		return false
	}
	upTo := st.evictable(rec, now)
	if upTo < rec.Floor {
		return false
	}
	ctx, cancel := st.opCtx()
	defer cancel()
	subject := st.names.subject(key)
	floor := upTo + 1
	var at, last *msgInfo
	var err error
	whole := rec.State != policy.Live && upTo >= rec.Head
	if !whole {
		if at, last, err = st.locate(ctx, subject, floor, rec.FloorMsg); err != nil {
			return false
		}
	}
	var off int64
	var purgeBefore, floorMsg uint64 // purge below purgeBefore (0: nothing)
	var upstream string
	var upstreamAt uint64
	head, headOff := rec.Head, rec.HeadOff
	switch {
	case whole:
		// An ended stream's record has its exact head: every event goes,
		// and its end marker with them (the record says it ended). No
		// search, and the subject is purged whole.
		floor, off, floorMsg = rec.Head+1, rec.HeadOff, rec.Synced+1
	case at != nil:
		// The floor's event is stored: its message stays, those before go.
		off, purgeBefore, floorMsg = at.offsetOf(floor), at.seq, at.seq
		if at.parts != 0 && at.part < at.parts {
			// A part of an event carries no cursor (its last part does,
			// which a producer that died mid-event never stored): the
			// cursor of the messages that go stays, in the record.
			if prev, _, err := st.locate(ctx, subject, floor-1, rec.FloorMsg); err == nil && prev != nil && prev.last() == floor-1 {
				upstream, upstreamAt = prev.upstream, prev.last()
			}
		}
	case last != nil:
		// Every stored event goes (an acknowledgement never reaches past
		// what is stored). The subject empties; its writer, finding it
		// so, publishes on from nothing.
		floor = min(floor, last.last()+1)
		head, headOff = max(head, last.last()), max(headOff, last.endOff())
		off, purgeBefore, floorMsg = last.endOff(), last.seq+1, last.seq+1
		upstream, upstreamAt = last.upstream, last.last() // the cursor it carries stays, in the record
	default:
		floor = min(floor, rec.Head+1)
		off = rec.HeadOff
	}
	if floor <= rec.Floor {
		return false
	}
	// The last events of a live stream go with their IDs and sums kept:
	// the upstream's replay to a takeover (or to the next standalone GET,
	// on any replica) may resend them (tail.go).
	var tail []tailEntry
	if !whole && last != nil && rec.State == policy.Live {
		tail = st.evictedTail(ctx, key, subject, rec, floor, last)
	}
	var from uint64
	// Counted as the write succeeds, before the floor shows here.
	counted := func(*streamRecord) { st.counters.EventsEvicted.Add(floor - from) }
	_, err = st.streams.updateThen(ctx, key, func(r *streamRecord) error {
		from = 0
		if r.Floor >= floor {
			return errUnchanged
		}
		if st.evictable(r, now) < floor-1 {
			return errStale
		}
		from = r.Floor
		r.moveFloor(floor, off, floorMsg)
		r.Purged = whole
		r.Head, r.HeadOff = max(r.Head, head), max(r.HeadOff, headOff)
		if tail != nil {
			r.Tail = mergeTail(r.Tail, tail, max(r.Head, head))
		}
		if upstream != "" && upstreamAt > r.UpstreamAt {
			r.Upstream, r.UpstreamAt = upstream, upstreamAt
		}
		return nil
	}, counted)
	if err != nil || from == 0 {
		if err != nil && !errors.Is(err, errStale) && !errors.Is(err, errNotFound) {
			st.fault("evict", err)
		}
		return false
	}
	if purgeBefore > 0 || whole {
		if err := st.purge(ctx, subject, purgeBefore); err != nil {
			st.fault("purge", err) // the next floor move purges these too
		}
		st.total.freed()
	}
	st.freed.fire()
	return true
}

// retirable reports whether an ended stream holds nothing a client could
// still get, or nothing but what may be evicted now: its record may go.
func (st *Store) retirable(rec *streamRecord, now time.Time) bool {
	return rec.State != policy.Live && rec.readerAt(now, st.opts.LeaseTTL) == nil &&
		(rec.Floor > rec.Head || st.evictable(rec, now) >= rec.Head)
}
