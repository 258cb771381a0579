package natsstore

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/buffer"
	"github.com/mcpresume/caddy-mcp-resume/internal/testnet"
	"github.com/mcpresume/caddy-mcp-resume/policy"
)

// Review 28, attack 1: a session just created keeps its records on the
// replica that created it. CreateSession writes the standalone stream's
// record and the session record (each applied to the mirror as it
// succeeds) before handle() registers the interest, and with load=false
// the interest loads nothing. Whatever forgets what is not of interest
// (a scan's end: keepInterestsOnly; interestLoop: forgetUninterested) in
// between drops them for good. Before the change a lone replica (the
// sweeper) watched whole and never forgot; now it scans, and forgets at
// the end of every scan.
func checkCreatedSessions(t *testing.T, st *Store, n int) {
	t.Helper()
	broken := 0
	for i := 0; i < n; i++ {
		id := fmt.Sprintf("c%d", i)
		s, err := st.CreateSession(id, buffer.SessionMeta{Version: "2025-06-18", Origin: policy.Initialized})
		if err != nil {
			t.Fatalf("create %s: %v", id, err)
		}
		ss := s.(*session)
		_, recOK := ss.record()
		_, _, stdOK := st.streams.get(streamKey(ss.sh, ss.epoch, policy.StandaloneNum))
		if !recOK || !stdOK {
			broken++
			var newErr error
			if _, newErr = s.NewStream([]string{"1"}, [32]byte{byte(i)}); newErr == nil {
				newErr = fmt.Errorf("none")
			}
			// The standalone stream: its producer's first append.
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			var appendErr error
			if p, err := s.Standalone().TakeProducer(ctx); err != nil {
				appendErr = fmt.Errorf("TakeProducer: %w", err)
			} else {
				_, appendErr = s.Standalone().Append(ctx, buffer.Entry{Fields: []byte("data: x\n")})
				p.Done()
			}
			cancel()
			// Still missing a while later (nothing loads an interest that is not stale)?
			time.Sleep(300 * time.Millisecond)
			_, _, stdLater := st.streams.get(streamKey(ss.sh, ss.epoch, policy.StandaloneNum))
			if broken <= 5 {
				t.Logf("session %s right after CreateSession: session record in mirror %v, standalone record in mirror %v; NewStream: %v; standalone Append: %v; standalone record in mirror 300ms later: %v",
					id, recOK, stdOK, newErr, appendErr, stdLater)
			}
		}
	}
	if broken > 0 {
		t.Errorf("%d of %d sessions lost their own records on the replica that created them", broken, n)
	}
}

func TestReview28CreatedSessionKeepsItsRecordsEmbedded(t *testing.T) {
	st := openEmbedded(t, testLimits(), func(o *Options) {
		o.ScanInterval = 20 * time.Millisecond // a scan (and its forgetting) every tick
		o.LeaseTTL = 600 * time.Millisecond    // interestLoop every 100 ms
	})
	waitUntil(t, "a scan", 10*time.Second, func() bool { return st.scans.Load() > 0 })
	checkCreatedSessions(t, st, 900)
}

func TestReview28CreatedSessionKeepsItsRecordsNonSweeper(t *testing.T) {
	urls := []string{testnet.NATS(t).ClientURL()}
	mod := func(o *Options) { o.LeaseTTL = 600 * time.Millisecond }
	a := openAt(t, urls, mod)
	b := openAt(t, urls, mod)
	waitUntil(t, "A to sweep", 10*time.Second, func() bool { return a.sweeps() })
	checkCreatedSessions(t, b, 900)
}

// kvStream reads a stream record from KV without keeping it.
func kvStreamRec(st *Store, key string) (*streamRecord, bool) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	r, _, ok := st.streams.read(ctx, key)
	return r, ok
}

func kvSessionRec(st *Store, sh string) (*sessionRecord, bool) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	r, _, ok := st.sessions.read(ctx, sh)
	return r, ok
}

// Review 28, attack 2: a session whose only replica died, no client comes
// back. Only the sweeper's scans cover it: its orphan without a cursor
// fails at LeaseTTL, the one with a cursor after TakeoverWait (the orphans
// map kept across the sweeper's sweeps between scans), each failed once
// (gap + an error for the pending request), and the session then expires.
func TestReview28ScanCoversADeadReplicasSessions(t *testing.T) {
	urls := []string{testnet.NATS(t).ClientURL()}
	var ended atomic.Int64
	mod := func(o *Options) {
		o.LeaseTTL = time.Second
		o.TakeoverWait = 2 * time.Second
		o.ScanInterval = 300 * time.Millisecond
		o.Limits.SessionIdleTimeout = 6 * time.Second
		o.Hooks.SessionEnded = func(string, policy.Reason) { ended.Add(1) }
	}
	a := openAt(t, urls, mod)
	b := openAt(t, urls, mod)
	waitUntil(t, "A to sweep", 10*time.Second, func() bool { return a.sweeps() })
	sb, _ := b.CreateSession("lost", buffer.SessionMeta{})
	withCursor, _ := sb.NewStream([]string{"1"}, [32]byte{1})
	without, _ := sb.NewStream([]string{"2"}, [32]byte{2})
	claim(t, withCursor)
	claim(t, without)
	produceWithCursor(t, withCursor, 1, 2)
	appendEvents(t, without, 1, 2)
	without.(*stream).currentWriter().waitStored(10 * time.Second)
	ss := sb.(*session)
	k1, k2 := streamKey(ss.sh, ss.epoch, 1), streamKey(ss.sh, ss.epoch, 2)
	crash(b)
	died := time.Now()
	state := func(key string) (policy.StreamState, uint64) {
		r, ok := kvStreamRec(a, key)
		if !ok {
			return 0, 0
		}
		return r.State, r.Head
	}
	waitUntil(t, "the orphan without a cursor to fail", 15*time.Second, func() bool { s, _ := state(k2); return s == policy.Failed })
	if s, _ := state(k1); s != policy.Live {
		t.Fatalf("the orphan with a cursor is %v when the one without failed (%v after the crash)", s, time.Since(died))
	}
	waitUntil(t, "the orphan with a cursor to fail", 20*time.Second, func() bool { s, _ := state(k1); return s == policy.Failed })
	if took := time.Since(died); took < 2*time.Second {
		t.Fatalf("the orphan with a cursor failed %v after its producer died: before TakeoverWait", took)
	}
	for _, k := range []string{k1, k2} {
		if _, head := state(k); head != 4 {
			t.Errorf("%s: head %d after the failure, want 4 (2 events, a gap, one error)", k, head)
		}
	}
	waitUntil(t, "the session to expire", 30*time.Second, func() bool { _, ok := kvSessionRec(a, ss.sh); return !ok })
	if tomb, ok := a.Tombstone("lost"); !ok || tomb.Reason != policy.ReasonExpired {
		t.Fatalf("tombstone: %+v %v", tomb, ok)
	}
	waitUntil(t, "SessionEnded", 10*time.Second, func() bool { return ended.Load() >= 1 })
	a.scanNow(t)
	if n := ended.Load(); n != 1 {
		t.Fatalf("SessionEnded fired %d times", n)
	}
	if st := a.Stats(); st.Sessions != 0 || st.Tombstones != 1 {
		t.Fatalf("A's stats after the scan: %+v", st)
	}
}

// Review 28, attack 3: several replicas serve one session (readers on B and
// C), its producer (P) dies without a cursor. B's, C's and the sweeper's
// sweeps all find the orphan: it must be failed exactly once.
func TestReview28SeveralReplicasFailAnOrphanOnce(t *testing.T) {
	urls := []string{testnet.NATS(t).ClientURL()}
	mod := func(o *Options) { o.LeaseTTL = time.Second; o.TakeoverWait = time.Hour }
	a := openAt(t, urls, mod)
	waitUntil(t, "A to sweep", 10*time.Second, func() bool { return a.sweeps() })
	p, b, c := openAt(t, urls, mod), openAt(t, urls, mod), openAt(t, urls, mod)
	const n = 6
	type side struct {
		str buffer.Stream
		r   buffer.Reader
		ep  string
	}
	var readers []side
	for i := 0; i < n; i++ {
		id := fmt.Sprintf("s%d", i)
		sp, _ := p.CreateSession(id, buffer.SessionMeta{})
		str, _ := sp.NewStream([]string{"1", "2"}, [32]byte{1})
		claim(t, str)
		appendEvents(t, str, 1, 3)
		str.(*stream).currentWriter().waitStored(10 * time.Second)
		for j, st := range []*Store{b, c} {
			s := sessionOn(t, st, id)
			if j != i%2 {
				continue // serves the session, reads nothing
			}
			x, _ := s.Stream(1)
			r, err := x.Attach(1)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { r.Close() })
			if _, err := readSeqs(t, r, s.Epoch(), 1, 1, 3); err != nil {
				t.Fatal(err)
			}
			readers = append(readers, side{x, r, s.Epoch()})
		}
	}
	crash(p)
	var wg sync.WaitGroup
	errs := make([]error, len(readers))
	data := make([]string, len(readers))
	for i, sd := range readers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			for {
				batch, err := sd.r.Read(ctx, nil, 1<<20, time.Hour)
				for _, d := range batch.Data {
					data[i] += string(d)
				}
				if errors.Is(err, buffer.ErrProducerGone) {
					continue
				}
				if err != nil {
					errs[i] = err
					return
				}
			}
		}()
	}
	wg.Wait()
	for i, err := range errs {
		var fe *buffer.FailedError
		if !errors.As(err, &fe) || fe.Reason != policy.ReasonUpstreamFailed {
			t.Errorf("reader %d ended with %v", i, err)
		}
		if g := strings.Count(data[i], "event: gap"); g != 1 {
			t.Errorf("reader %d saw %d gap events: %q", i, g, data[i])
		}
		if v := readers[i].str.View(); v.Head != 6 {
			t.Errorf("reader %d: head %d, want 6 (3 events, a gap, two errors)", i, v.Head)
		}
	}
	var failed uint64
	for _, st := range []*Store{a, b, c} {
		failed += st.Counters().FailedStreams()[policy.ReasonUpstreamFailed]
	}
	if failed != n {
		t.Errorf("%d failures counted across the replicas for %d orphans", failed, n)
	}
}

// Review 28, attack 4: sessions served by two replicas (B and C) go idle:
// both sweep them, plus the sweeper's scans. Each must end once, with one
// tombstone, and the zone's counts must come back right.
func TestReview28SeveralReplicasExpireASessionOnce(t *testing.T) {
	urls := []string{testnet.NATS(t).ClientURL()}
	var ended atomic.Int64
	var tombErr atomic.Int64
	mod := func(o *Options) {
		o.Limits.SessionIdleTimeout = time.Second
		o.ScanInterval = 200 * time.Millisecond
		o.Hooks.SessionEnded = func(string, policy.Reason) { ended.Add(1) }
		o.OnError = func(op string, err error) {
			if op == "tombstone" || op == "delete_session" {
				tombErr.Add(1)
			}
		}
	}
	a := openAt(t, urls, mod)
	waitUntil(t, "A to sweep", 10*time.Second, func() bool { return a.sweeps() })
	b, c := openAt(t, urls, mod), openAt(t, urls, mod)
	const n = 30
	for i := 0; i < n; i++ {
		id := fmt.Sprintf("idle%d", i)
		if _, err := b.CreateSession(id, buffer.SessionMeta{}); err != nil {
			t.Fatal(err)
		}
		sessionOn(t, c, id)
	}
	waitUntil(t, "every session to expire", 30*time.Second, func() bool { return ended.Load() >= n })
	a.scanNow(t)
	if e := ended.Load(); e != n {
		t.Errorf("SessionEnded fired %d times for %d sessions", e, n)
	}
	for i := 0; i < n; i++ {
		id := fmt.Sprintf("idle%d", i)
		if tomb, ok := a.Tombstone(id); !ok || tomb.Reason != policy.ReasonExpired {
			t.Errorf("%s: tombstone %+v %v", id, tomb, ok)
		}
	}
	for _, st := range []*Store{a, b, c} {
		waitUntil(t, "the tally", 10*time.Second, func() bool { s := st.Stats(); return s.Sessions == 0 && s.Tombstones == n })
	}
	t.Logf("faults: %d", tombErr.Load())
}

// Review 28, attack 7: the sweeper dies while a session no live replica
// serves waits for a takeover; the replica that takes the lease over must
// scan, and fail it once its own wait is over.
func TestReview28SweeperMovesWhileAnOrphanWaits(t *testing.T) {
	urls := []string{testnet.NATS(t).ClientURL()}
	mod := func(o *Options) {
		o.LeaseTTL = time.Second
		o.TakeoverWait = 2 * time.Second
		o.ScanInterval = 200 * time.Millisecond
	}
	a := openAt(t, urls, mod)
	waitUntil(t, "A to sweep", 10*time.Second, func() bool { return a.sweeps() })
	b, p := openAt(t, urls, mod), openAt(t, urls, mod)
	sp, _ := p.CreateSession("lost", buffer.SessionMeta{})
	str, _ := sp.NewStream([]string{"1"}, [32]byte{1})
	claim(t, str)
	produceWithCursor(t, str, 1, 2)
	ss := sp.(*session)
	key := streamKey(ss.sh, ss.epoch, 1)
	crash(p)
	time.Sleep(1500 * time.Millisecond) // A has found the orphan (LeaseTTL 1 s), and waits
	crash(a)
	waitUntil(t, "B to sweep", 15*time.Second, func() bool { return b.sweeps() })
	b.scanNow(t)
	waitUntil(t, "the orphan to fail", 40*time.Second, func() bool {
		r, ok := kvStreamRec(b, key)
		return ok && r.State == policy.Failed
	})
	if b.interest.fullOn() {
		waitUntil(t, "B's scan watches to stop", 5*time.Second, func() bool { return !b.interest.fullOn() })
	}
}

// Review 28, attack 5: an embedded server of its own restarting with
// sessions (closed, or crashed so that its sweeper lease outlives it): right
// after Open, admission and Stats count them, a session's first request
// loads its records, Tombstone and Delete work.
func TestReview28EmbeddedRestartWithSessions(t *testing.T) {
	for _, crashed := range []bool{false, true} {
		t.Run(fmt.Sprintf("crashed=%v", crashed), func(t *testing.T) {
			dir := t.TempDir()
			lim := testLimits()
			lim.MaxSessions = 3
			mod := func(o *Options) { o.Dir = dir; o.SweepInterval = 500 * time.Millisecond }
			st := openEmbedded(t, lim, mod)
			epochs := map[string]string{}
			for i := 0; i < 3; i++ {
				id := fmt.Sprintf("s%d", i)
				s, err := st.CreateSession(id, buffer.SessionMeta{Version: "2025-11-25"})
				if err != nil {
					t.Fatal(err)
				}
				epochs[id] = s.Epoch()
				str, _ := s.NewStream([]string{"1"}, [32]byte{1})
				p := claim(t, str)
				appendEvents(t, str, 1, 3)
				str.(*stream).currentWriter().waitStored(10 * time.Second)
				if !crashed {
					str.Complete()
					p.Done()
				}
			}
			if crashed {
				crash(st)
			} else {
				st.Close()
			}
			st2 := openEmbedded(t, lim, mod)
			if s := st2.Stats(); s.Sessions != 3 {
				t.Errorf("Stats right after Open: %+v, want 3 sessions", s)
			}
			if _, err := st2.CreateSession("s3", buffer.SessionMeta{}); !errors.Is(err, buffer.ErrTooManySessions) {
				t.Errorf("a 4th session right after Open with max_sessions 3: %v", err)
			}
			s0, ok := st2.Session("s0")
			if !ok || s0.Epoch() != epochs["s0"] {
				t.Fatalf("s0 after restart: %v", ok)
			}
			x, ok := s0.Stream(1)
			if !ok || x.View().Head != 3 {
				t.Fatalf("s0's stream 1 after restart: %v %+v", ok, x.View())
			}
			r, err := x.Attach(1)
			if err != nil {
				t.Fatal(err)
			}
			defer r.Close()
			if seqs, _ := readSeqs(t, r, epochs["s0"], 1, 1, 3); len(seqs) != 3 {
				t.Fatalf("read %v", seqs)
			}
			if !st2.Delete("s1", policy.ReasonPurged) {
				t.Fatal("Delete s1 after restart")
			}
			if tomb, ok := st2.Tombstone("s1"); !ok || tomb.Reason != policy.ReasonPurged || len(tomb.Streams) != 1 {
				t.Fatalf("s1's tombstone: %+v %v", tomb, ok)
			}
			if s := st2.Stats(); s.Sessions != 2 || s.Tombstones != 1 {
				t.Errorf("Stats after the deletion: %+v", s)
			}
			if crashed {
				// The orphaned stream of s2 (its producer died with the process)
				// is failed by the restarted replica's scan.
				waitUntil(t, "s2's orphan to fail", 30*time.Second, func() bool {
					r, ok := kvStreamRec(st2, streamKey(sessionToken("s2"), epochs["s2"], 1))
					return ok && r.State == policy.Failed
				})
			}
		})
	}
}

// Review 28, attack 8: a session in use (its client active on C, touching
// it) is also served by B, which is cut off from NATS past the idle
// timeout: B's notifications are lost, its mirror's last activity goes
// stale, and every replica now sweeps what it serves. B must not expire
// the session: the idle judgement is made on B's stale copy, and Delete's
// compare-and-set, when it fails on the touch, reads the record again and
// deletes it anyway.
func TestReview28ASessionInUseIsNotExpiredByAReplicaCutOff(t *testing.T) {
	ns := testnet.NATS(t)
	link := newCutter(t, strings.TrimPrefix(ns.ClientURL(), "nats://"))
	var ended atomic.Int64
	var endedBy sync.Map
	mk := func(name string) func(o *Options) {
		return func(o *Options) {
			o.Limits.SessionIdleTimeout = 2 * time.Second
			o.Hooks.SessionEnded = func(id string, r policy.Reason) { ended.Add(1); endedBy.Store(name, r) }
		}
	}
	a := openAt(t, []string{ns.ClientURL()}, mk("A"))
	waitUntil(t, "A to sweep", 10*time.Second, func() bool { return a.sweeps() })
	c := openAt(t, []string{ns.ClientURL()}, mk("C"))
	b := openAt(t, []string{"nats://" + link.addr()}, mk("B"))
	sc, err := c.CreateSession("busy", buffer.SessionMeta{})
	if err != nil {
		t.Fatal(err)
	}
	sessionOn(t, b, "busy")
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // the client, active on C throughout
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			case <-time.After(50 * time.Millisecond):
				sc.Touch()
			}
		}
	}()
	defer func() { close(stop); wg.Wait() }()
	time.Sleep(200 * time.Millisecond)
	link.cut()
	time.Sleep(2600 * time.Millisecond) // past 1.1 x the idle timeout of what B last saw
	link.mend()
	deadline := time.Now().Add(4 * time.Second)
	for time.Now().Before(deadline) && ended.Load() == 0 {
		time.Sleep(20 * time.Millisecond)
	}
	if n := ended.Load(); n != 0 {
		by := ""
		endedBy.Range(func(k, v any) bool { by += fmt.Sprintf("%v(%v) ", k, v); return true })
		r, ok := kvSessionRec(a, sessionToken("busy"))
		var idle time.Duration
		if ok {
			idle = time.Since(time.Unix(0, r.LastActive))
		}
		t.Fatalf("a session touched every 50 ms ended (by %s); in KV: %v, idle %v", by, ok, idle)
	}
}

// Review 28, attack 9: adopted sessions confirmed on another replica than
// the one that created them; the counts by origin, on every replica, right
// after the changes (near the bound: told) and after a scan.
func TestReview28ConfirmMovesAdoptedSessionsInTheTally(t *testing.T) {
	urls := []string{testnet.NATS(t).ClientURL()}
	mod := func(o *Options) { o.Limits.MaxSessions = 20; o.ScanInterval = 2 * time.Second }
	a := openAt(t, urls, mod)
	waitUntil(t, "A to sweep", 10*time.Second, func() bool { return a.sweeps() })
	b, c := openAt(t, urls, mod), openAt(t, urls, mod)
	a.scanNow(t)
	for i := 0; i < 5; i++ {
		if _, err := b.CreateSession(fmt.Sprintf("ad%d", i), buffer.SessionMeta{Origin: policy.Adopted}); err != nil {
			t.Fatal(err)
		}
	}
	for i := 0; i < 3; i++ {
		sessionOn(t, c, fmt.Sprintf("ad%d", i)).Confirm()
	}
	want := func(st *Store) bool { n := st.sessionCounts(); return n.Sessions == 3 && n.Adopted == 2 }
	for name, st := range map[string]*Store{"A": a, "B": b, "C": c} {
		waitUntil(t, name+"'s counts before a scan", 2*time.Second, func() bool { return want(st) })
	}
	a.scanNow(t)
	for name, st := range map[string]*Store{"A": a, "B": b, "C": c} {
		waitUntil(t, name+"'s counts after a scan", 5*time.Second, func() bool { return want(st) })
		if s := st.Stats(); s.Sessions != 5 {
			t.Errorf("%s: Stats %+v", name, s)
		}
	}
}
