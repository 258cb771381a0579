package natsstore

import (
	"context"
	"errors"
	"math"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/mcpresume/caddy-mcp-resume/buffer"
	"github.com/mcpresume/caddy-mcp-resume/internal/eventid"
	"github.com/mcpresume/caddy-mcp-resume/policy"
)

// sweepLoop sweeps, every SweepInterval, the sessions this replica serves
// (their records are current here: interest.go); the replica holding the
// sweeper lease scans the zone every scan interval (scan). Until the store
// closes.
func (st *Store) sweepLoop() {
	defer st.wg.Done()
	t := time.NewTicker(st.opts.SweepInterval)
	defer t.Stop()
	var next time.Time // when the next scan is due
	for {
		select {
		case <-st.ctx.Done():
			return
		case <-t.C:
		}
		sweeper := !st.closing.Load() && st.holdSweeper()
		if !sweeper {
			st.orphans = nil // one that sweeps again counts afresh
		}
		st.tidy(sweeper)
		now := time.Now()
		if sweeper && (!now.Before(next) || st.scanSoon.Swap(false)) {
			if took, ok := st.scan(now); ok {
				// A zone whose scan is long is scanned less often: the
				// scan takes at most a twentieth of the sweeping
				// replica's time, up to 6 scan intervals apart.
				next = time.Now().Add(min(max(st.opts.ScanInterval, 20*took), 6*st.opts.ScanInterval))
				continue
			}
		}
		st.sweep(now, st.servedSessions())
		if !sweeper {
			st.readTally()
		}
	}
}

// scan sweeps the zone whole: the work no replica serving a session does
// for it (sessions no live replica serves: their idle expiry, their
// producers' deaths, their evictions; incarnations a dying replica left
// half deleted; old tombstones), and the zone's tally. It loads the four
// buckets whole (the initial values of watches, which run until the sweep
// is done), sweeps, publishes the tally and forgets again what this
// replica does not serve (issue 24: watched whole for good, the buckets
// brought the sweeping replica every write of every call, a fifth of the
// serving replica's CPU). It reports how long it took, and whether the
// buckets could be loaded.
func (st *Store) scan(now time.Time) (time.Duration, bool) {
	ctx, cancel := context.WithTimeout(st.ctx, scanLoadTimeout)
	defer cancel()
	// The sweeper lease is renewed while the scan runs: a scan may take
	// longer than the lease (a loaded machine, a large zone), and a lease
	// lost mid-scan made another replica (or this one, later) count each
	// orphan's wait for a takeover afresh, over and over.
	go func() {
		t := time.NewTicker(st.sweeperTTL() / 4)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				st.holdSweeper()
			}
		}
	}()
	defer st.fullWatch(false)
	if err := st.awaitFullWatch(ctx); err != nil {
		st.fault("scan", err)
		return 0, false
	}
	st.sweep(now, nil)
	st.dropTombstones(ctx)
	st.publishTally()
	st.scans.Add(1)
	return time.Since(now), true
}

// scanLoadTimeout bounds the loading of the buckets for a scan.
const scanLoadTimeout = 30 * time.Second

// endedStream is an ended request stream, for retiring.
type endedStream struct {
	key   string
	rev   uint64 // its record's
	ended int64
}

// idleEnded are the ended streams whose records, as last judged, had
// nothing to evict and could not retire until the event at their floor,
// delivered at a known time, is a window old (or until the record changes):
// the sweeper passes them by until then. Without it every sweep judged
// every ended stream a session held, a call's 240 times in a 2-minute
// window, and sorted them all. Only the sweeping goroutine uses it.
type idleEnded struct {
	by   map[string]*idleRecord
	pass uint64 // the sweep under way
}

type idleRecord struct {
	rev       uint64 // the revision judged: any write makes it due again
	delivered int64  // the floor's delivery, unix nanos (math.MaxInt64: none)
	pass      uint64 // the last sweep that found it
}

// skip reports whether e may be passed by at now (keeping its entry).
func (in *idleEnded) skip(e endedStream, now time.Time, window time.Duration) bool {
	r := in.by[e.key]
	if r == nil || r.rev != e.rev || r.delivered != math.MaxInt64 && now.UnixNano()-r.delivered >= int64(window) {
		return false
	}
	r.pass = in.pass
	return true
}

// note records that rec, at revision rev, holds events of which none may
// go now, and no client reads it: none may until its floor's event is a
// window old, or the record changes.
func (in *idleEnded) note(key string, rev uint64, rec *streamRecord) {
	if in.by == nil {
		in.by = make(map[string]*idleRecord)
	}
	delivered := int64(math.MaxInt64)
	for _, d := range rec.Deliveries {
		if d.Seq >= rec.Floor {
			delivered = d.At
			break
		}
	}
	if r := in.by[key]; r != nil {
		*r = idleRecord{rev: rev, delivered: delivered, pass: in.pass}
		return
	}
	in.by[key] = &idleRecord{rev: rev, delivered: delivered, pass: in.pass}
}

// forget drops the entries the sweep that ends did not find.
func (in *idleEnded) forget() {
	for k, r := range in.by {
		if r.pass != in.pass {
			delete(in.by, k)
		}
	}
}

// sweep evicts what has become evictable, retires spent stream records,
// expires idle sessions: what the memory store's sweeper does, for the
// sessions with tokens in served (nil: a scan, the zone's every session,
// which the mirrors then hold; a scan also ends streams whose producer
// died, and clears incarnations left half deleted and old tombstones).
// Several replicas may sweep a session: every write here is a
// compare-and-set.
func (st *Store) sweep(now time.Time, served map[string]bool) {
	whole := served == nil
	in := func(key string) bool {
		sh, _, _ := strings.Cut(key, ".")
		return whole || served[sh]
	}
	lim := st.Limits()
	ttl := st.opts.LeaseTTL
	connected := make(map[string]bool)      // incarnations a client reads
	ended := make(map[string][]endedStream) // incarnation -> ended request streams
	// Orphans waiting for a takeover, since: found by the scans only (see
	// below), so only a scan makes the set anew.
	orphans := make(map[string]time.Time)
	st.idle.pass++
	defer st.idle.forget()
	st.streams.each(func(key string, rec *streamRecord, rev uint64) {
		if !in(key) {
			return
		}
		inc := incarnationOf(key)
		if !st.incarnationHeld(inc) {
			// Its session is gone: a replica that deleted it died midway
			// (judged on the zone's records only).
			if whole && now.Sub(time.Unix(0, rec.Created)) >= 2*ttl {
				ctx, cancel := st.opCtx()
				st.clearIncarnation(ctx, inc, st.streams.keysOf(inc), st.leases.keysOf(inc))
				cancel()
			}
			return
		}
		if rec.readerAt(now, ttl) != nil {
			connected[inc] = true
		}
		if rec.Kind == policy.RequestStream && rec.State != policy.Live {
			ended[inc] = append(ended[inc], endedStream{key, rev, rec.Ended}) // evicted by retire
			return
		}
		if st.evictable(rec, now) >= rec.Floor {
			st.evict(key, now)
		}
		switch {
		case rec.Kind != policy.RequestStream:
		case !whole:
			// A dead producer's stream is the sweeper's to end: the
			// replica serving its session is the one a client comes back
			// to, whose takeover its own sweep would race (a takeover of
			// a takeover once lost to it).
		case !st.holds(key) && now.Sub(time.Unix(0, rec.Created)) >= ttl:
			if !st.leased(st.ctx, key) && !st.awaitsTakeover(key, rec, now, orphans) {
				st.failOrphan(key)
			}
		}
	})
	if whole {
		st.orphans = orphans
	}
	for _, list := range ended {
		st.retire(list, now)
	}
	if idle := lim.SessionIdleTimeout; idle > 0 {
		var expired []string
		st.sessions.each(func(sh string, r *sessionRecord, _ uint64) {
			// Touches are written once per idle/10: allow for that, so
			// no session expires early.
			if in(sh) && !connected[sh+"."+r.Epoch] && now.Sub(time.Unix(0, r.LastActive)) >= idle+idle/10 {
				expired = append(expired, r.ID)
			}
		})
		for _, id := range expired {
			st.expire(id, idle)
		}
	}
	if !whole {
		return
	}
	ctx, cancel := st.opCtx()
	defer cancel()
	st.tombs.each(func(sh string, t *tombRecord, rev uint64) {
		if now.Sub(t.Ended) >= st.opts.TombstoneTTL {
			st.tombs.remove(ctx, sh, rev)
		}
	})
}

// incarnationHeld reports whether the session incarnation <sh>.<epoch> is
// in the zone.
func (st *Store) incarnationHeld(inc string) bool {
	sh, epoch, _ := strings.Cut(inc, ".")
	r, _, ok := st.sessions.get(sh)
	return ok && r.Epoch == epoch
}

// retire evicts what ended streams may lose now, and drops the records of
// those with EndedStreamsKept or more ended after them that then hold
// nothing a client could still get. A record that goes takes its events
// with it: one delete and one purge, no floor moved first. Streams judged
// idle (st.idle) are passed by: they cannot retire either.
//
// Which may retire is judged by rank, not by counting an excess down: in
// end order, the one at i has len-1-i ended after it as this replica sees
// them. A view that lags another replica's lacks streams that ended since,
// or holds ones the other retired, each with EndedStreamsKept ended after
// it: so no replica retires one of the newest EndedStreamsKept, whatever
// the others do meanwhile. (Each counting its own excess, two replicas
// sweeping a session together retired up to twice it; with an older
// stream not yet retirable, a newer one went in its place.)
func (st *Store) retire(list []endedStream, now time.Time) {
	mayRetire := len(list) - buffer.EndedStreamsKept // the oldest mayRetire
	window := st.Limits().ResumeWindow
	due := list[:0]
	var passed []int64 // the ends of those passed by
	for _, e := range list {
		if st.idle.skip(e, now, window) {
			if mayRetire > 0 {
				passed = append(passed, e.ended)
			}
		} else {
			due = append(due, e)
		}
	}
	if mayRetire > 0 {
		sort.Slice(due, func(i, j int) bool {
			if due[i].ended != due[j].ended {
				return due[i].ended < due[j].ended
			}
			return keyNum(due[i].key) < keyNum(due[j].key)
		})
	}
	// rank is a due stream's rank in the whole list: the due before it, and
	// the passed-by that did not end after it (one that ended at the same
	// moment counts as before: when unsure, keep). Their ends are sorted
	// when first needed, as plain numbers.
	sorted := false
	rank := func(i int, e endedStream) int {
		if !sorted {
			slices.Sort(passed)
			sorted = true
		}
		return i + sort.Search(len(passed), func(j int) bool { return passed[j] > e.ended })
	}
	ctx, cancel := st.opCtx()
	defer cancel()
	for i, e := range due {
		rec, rev, ok := st.streams.get(e.key)
		if !ok {
			continue
		}
		if mayRetire <= 0 || !st.retirable(rec, now) || rank(i, e) >= mayRetire {
			switch {
			case st.evictable(rec, now) >= rec.Floor:
				st.evict(e.key, now)
			case rec.Reader == nil && rec.Floor <= rec.Head:
				st.idle.note(e.key, rev, rec)
			}
			continue
		}
		// Removed at the revision judged, so nothing (an attach, an
		// acknowledgement undone) came between the judgement and the end.
		if err := st.streams.remove(ctx, e.key, rev); err != nil {
			continue
		}
		if rec.Head >= rec.Floor {
			st.counters.EventsEvicted.Add(rec.Head - rec.Floor + 1)
		}
		if !rec.Purged {
			st.purge(ctx, st.names.subject(e.key), 0) // its events and end marker
			st.total.freed()
		}
		st.freed.fire()
	}
}

// awaitsTakeover reports whether the orphan key (its producer's lease
// lapsed) is left to a takeover for now: it recorded an upstream cursor, so
// the replica its client comes back to can resume the upstream from it, and
// it has been found orphaned for less than TakeoverWait. orphans collects
// the ones waiting, with the time this sweeper first found them.
func (st *Store) awaitsTakeover(key string, rec *streamRecord, now time.Time, orphans map[string]time.Time) bool {
	since, ok := st.orphans[key]
	if !ok {
		if !st.hasCursor(key, rec) {
			return false
		}
		since = now
	}
	if now.Sub(since) >= st.opts.TakeoverWait {
		return false
	}
	orphans[key] = since
	return true
}

// hasCursor reports whether the stream key recorded an upstream cursor: in
// its record, or with its last stored message. rec may be older than the
// message: an eviction (this sweep's, just before, or another replica's)
// writes the cursor of the messages it purges into the record before it
// purges them, so when no message carries one, the record is read again,
// from KV. What cannot be read now counts as a cursor: failing the stream
// cannot be undone, waiting for a takeover is bounded.
func (st *Store) hasCursor(key string, rec *streamRecord) bool {
	if rec.Upstream != "" {
		return true
	}
	ctx, cancel := st.opCtx()
	defer cancel()
	m, err := st.lastWhole(ctx, st.names.subject(key), rec.FloorMsg)
	if err != nil || m != nil && m.upstream != "" {
		return true
	}
	if _, _, err := st.streams.fetch(ctx, key); err != nil {
		return !errors.Is(err, errNotFound)
	}
	now, _, ok := st.streams.get(key)
	return ok && now.Upstream != ""
}

// failOrphan ends a live request stream whose producer's lease lapsed (its
// replica died): the failure signals (a gap event, an error for each
// request still waiting) and the end marker go in after the last stored
// event, each publish expecting the one before, so a producer that was
// only cut off cannot interleave. A client resuming on any replica gets
// exactly that: never silence.
func (st *Store) failOrphan(key string) {
	rec, _, ok := st.streams.get(key)
	if !ok || rec.State != policy.Live {
		return
	}
	// Under the producer's lease, as a takeover is: the two exclude each
	// other. Without it a takeover could load the stream between the
	// failure's signals and its end, fence it, and produce a stream the
	// sweeper then ends.
	if got, err := st.acquire(key, nil); err != nil || !got {
		return // a takeover (or another sweeper) has it
	}
	defer st.release(key)
	ctx, cancel := st.opCtx()
	defer cancel()
	// From KV, not the mirror: a producer ends the record before it lets
	// the lease go, and stores no end marker when no reader is attached,
	// so the record is what fences this end (the lease bucket's watch may
	// have brought the release before the streams bucket's the end).
	if _, _, err := st.streams.fetch(ctx, key); err != nil {
		return
	}
	if rec, _, ok = st.streams.get(key); !ok || rec.State != policy.Live {
		return
	}
	subject := st.names.subject(key)
	last, err := st.lastMsg(ctx, subject)
	if err != nil {
		return
	}
	head, off, expect := rec.Head, rec.HeadOff, uint64(0)
	if last != nil {
		if last.end != policy.Live { // it ended; its record did not learn it
			st.recordEnd(key, last.end, last.reason, last.last(), last.endOff(), last.seq, nil)
			return
		}
		head, off, expect = last.last(), last.endOff(), last.seq
	}
	// Answers stored after the record last heard of them.
	answered := make(map[string]uint64)
	if last != nil {
		if answered, err = st.answersAfter(ctx, subject, rec.Synced+1, last.seq); err != nil {
			return
		}
	}
	var pending []string
	for _, id := range rec.pending() {
		if _, ok := answered[id]; !ok {
			pending = append(pending, id)
		}
	}
	inc, num, _ := splitStreamKey(key)
	_, epoch, _ := strings.Cut(inc, ".")
	lastID := string(eventid.Append(nil, epoch, num, head))
	b := batch{first: head + 1, off: off}
	for _, sig := range st.opts.FailureSignals(policy.ReasonUpstreamFailed, lastID, pending) {
		seq := b.first + uint64(len(b.lens))
		n := len(b.buf)
		b.buf = appendFramed(b.buf, epoch, num, seq, sig.Fields)
		b.lens = append(b.lens, len(b.buf)-n)
		for _, id := range sig.Answers {
			answered[id] = seq
			b.answers = append(b.answers, answer{id, seq})
		}
	}
	noAbort := func() error { return nil }
	if len(b.lens) > 0 {
		// IDs of their own: a producer's publish in flight must not be
		// taken for a duplicate of these (review 46).
		if expect, err = st.storeMsgs(b.msgs(subject, key+".f", st.partRoom), expect, noAbort, nil, nil); err != nil {
			return // the producer lives after all, or another sweeper was first
		}
		head, off = b.last(), off+int64(len(b.buf))
		st.counters.EventsEnqueued.Add(uint64(len(b.lens)))
	}
	// The record is the fence: a producer that ended the stream meanwhile
	// (its lease lapsed in a pause, and it stored no end marker) wins, and
	// then nothing here counts, marks or reports a failure (what this
	// stored past the record's head no reader reads). Counted as the
	// write succeeds, before the record says so: whoever reads the end
	// sees it.
	counted := func(*streamRecord) { st.counters.AddFailed(policy.ReasonUpstreamFailed) }
	if !st.endRecord(key, "", policy.Failed, policy.ReasonUpstreamFailed, head, off, expect, answered, counted) {
		return
	}
	st.publishAfter(endMarker(subject, head, off, policy.Failed, policy.ReasonUpstreamFailed, ""), key+".f.end", expect, noAbort, nil)
	if h := st.opts.Hooks.StreamFailed; h != nil {
		sh, _, _ := strings.Cut(inc, ".")
		if r, _, ok := st.sessions.get(sh); ok {
			h(r.ID, num, policy.ReasonUpstreamFailed)
		}
	}
}

// recordEnd writes a stream's end into its record.
// also, if given, changes the record with the end (in the same write).
func (st *Store) recordEnd(key string, state policy.StreamState, reason policy.Reason, head uint64, off int64, msg uint64,
	answers map[string]uint64, also ...func(*streamRecord)) (ended bool) {
	return st.endRecord(key, "", state, reason, head, off, msg, answers, nil, also...)
}

// endRecord is recordEnd, by producer owner if not "" (the record must
// not name another replica its producer: one that took the stream over),
// with done run once the write succeeded, before this replica shows it.
// It reports whether this write ended the record.
func (st *Store) endRecord(key, owner string, state policy.StreamState, reason policy.Reason, head uint64, off int64, msg uint64,
	answers map[string]uint64, done func(*streamRecord), also ...func(*streamRecord)) (ended bool) {
	ctx, cancel := st.opCtx()
	defer cancel()
	_, err := st.streams.updateThen(ctx, key, func(r *streamRecord) error {
		ended = false
		if r.State != policy.Live || owner != "" && r.Producer != "" && r.Producer != owner {
			return errUnchanged
		}
		ended = true
		for id, seq := range answers {
			r.answer(id, seq)
		}
		r.State, r.FailReason, r.Ended = state, reason, time.Now().UnixNano()
		r.Head, r.HeadOff, r.Synced = max(r.Head, head), max(r.HeadOff, off), max(r.Synced, msg)
		for _, f := range also {
			if f != nil {
				f(r)
			}
		}
		return nil
	}, done)
	if err != nil {
		ended = false
		if !errors.Is(err, errNotFound) {
			st.fault("end_stream", err)
		}
	}
	return ended
}

// tidyAge is how long a deletion is remembered (in the mirrors, by its
// marker in the bucket) before tidy forgets it (a variable for tests).
var tidyAge = time.Minute

// tidyBatch bounds the deletions one tidy step takes from each mirror; the
// rest wait for the next step.
const tidyBatch = 4096

// tidy forgets the deletions the mirrors saw a minute ago and, on the
// sweeper, removes their markers from the buckets (they would pile up for
// every session and stream ever ended). It runs every sweep interval and
// takes only what came due since the last step, so its cost follows the
// deletions as they happen instead of arriving at once: there is no scan
// of the buckets (KeyValue.PurgeDeletes reads every key of one). This
// version's deletions are purges whose markers expire by themselves
// (markerTTL, recordMarkerTTL: no request per deletion), and are only
// forgotten; a plain delete's marker (a replica of an earlier version
// made it) goes by a purge of its key below the marker's revision and the
// marker itself, so a key written again since keeps its new value. A
// replica that starts loads every marker into its mirror, so such markers
// whose deleter died before the minute was up are removed all the same.
func (st *Store) tidy(sweeper bool) {
	st.leases.due(tidyAge, tidyBatch)
	for _, m := range []struct {
		bucket string
		due    func(time.Duration, int) []keyRev
	}{{st.names.sessions, st.sessions.due}, {st.names.streams, st.streams.due}, {st.names.tombs, st.tombs.due}} {
		list := m.due(tidyAge, tidyBatch)
		if !sweeper || len(list) == 0 {
			continue
		}
		kv, err := st.kvStream(m.bucket)
		if err != nil {
			st.fault("purge_deletes", err)
			continue
		}
		ctx, cancel := st.opCtx()
		for _, d := range list {
			err := kv.Purge(ctx, jetstream.WithPurgeSubject("$KV."+m.bucket+"."+d.key), jetstream.WithPurgeSequence(d.rev+1))
			if err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
				st.fault("purge_deletes", err)
				break // the next step's deletions; these markers stay (harmless)
			}
		}
		cancel()
	}
}

// kvStream returns the stream under a bucket (cached).
func (st *Store) kvStream(bucket string) (jetstream.Stream, error) {
	if v, ok := st.kvStreams.Load(bucket); ok {
		return v.(jetstream.Stream), nil
	}
	ctx, cancel := st.opCtx()
	defer cancel()
	s, err := st.js.Stream(ctx, "KV_"+bucket)
	if err != nil {
		return nil, err
	}
	st.kvStreams.Store(bucket, s)
	return s, nil
}
