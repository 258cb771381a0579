package natsstore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"testing"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/buffer"
	"github.com/mcpresume/caddy-mcp-resume/internal/testnet"
	"github.com/mcpresume/caddy-mcp-resume/policy"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// review25: a short call ends on A with its reader leaving with the end
// (no end marker stored); a client resuming on B from the first event
// gets both events and then the end; one resuming from what was delivered
// gets the end at once; the sweeper on B, run by hand, leaves it complete.
func TestPerCallEdgeLateReaderElsewhereSeesAnEndWithoutMarker(t *testing.T) {
	a, b := replicas(t)
	sa, err := a.CreateSession("s25", buffer.SessionMeta{})
	if err != nil {
		t.Fatal(err)
	}
	shortCall(t, sa, "1")
	sb := sessionOn(t, b, "s25")
	var str buffer.Stream
	waitUntil(t, "B to see stream 1", 10*time.Second, func() bool {
		var ok bool
		str, ok = sb.Stream(1)
		return ok
	})
	key := streamKey(sb.(*session).sh, sb.(*session).epoch, 1)
	// The sweeper on B, as if it found the stream orphaned on a lagging
	// mirror: it must not fail a completed stream.
	b.failOrphan(key)
	rd, err := str.Attach(1)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var n int
	for {
		batch, err := rd.Read(ctx, nil, 1<<20, time.Hour)
		if len(batch.Data) > 0 {
			n += int(batch.Last - batch.First + 1)
		}
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("reading on B after %d events: %v", n, err)
		}
	}
	rd.Close()
	if n != 2 {
		t.Fatalf("read %d events on B, want 2", n)
	}
	if v := str.View(); v.State != policy.Complete || v.Head != 2 {
		t.Fatalf("on B: %+v, want complete at head 2", v)
	}
	// Nothing stored after the two events (no failure signals).
	m, err := b.lastMsg(ctx, b.names.subject(key))
	if err != nil || m == nil || m.end != policy.Live && m.last() != 2 || m.last() != 2 {
		t.Fatalf("last stored message: %+v %v", m, err)
	}
	rd2, err := str.Attach(buffer.FromUndelivered)
	if err != nil {
		t.Fatal(err)
	}
	defer rd2.Close()
	batch, err := rd2.Read(ctx, nil, 1<<20, time.Hour)
	if !errors.Is(err, io.EOF) || len(batch.Data) != 0 {
		t.Fatalf("from undelivered on B: %d events, %v; want none and EOF", len(batch.Data), err)
	}
}

// review25: kvPurge and kvCreateTTL against nats.go's Purge and Create on
// the same bucket: the same stored headers, the same refusals.
func TestPerCallEdgeFastPublishMatchesNatsGo(t *testing.T) {
	st := openEmbedded(t, testLimits())
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	bucket := st.names.leases
	kv, err := st.js.KeyValue(ctx, bucket)
	if err != nil {
		t.Fatal(err)
	}
	stream, err := st.js.Stream(ctx, "KV_"+bucket)
	if err != nil {
		t.Fatal(err)
	}
	raw := func(key string) *jetstream.RawStreamMsg {
		m, err := stream.GetLastMsgForSubject(ctx, "$KV."+bucket+"."+key)
		if err != nil {
			t.Fatalf("last of %s: %v", key, err)
		}
		return m
	}
	// Creates.
	r1, err := st.kvCreateTTL(ctx, bucket, "fast", []byte("v"), 3*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	r2, err := kv.Create(ctx, "slow", []byte("v"), jetstream.KeyTTL(3*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if f, s := raw("fast").Header.Get(jetstream.MsgTTLHeader), raw("slow").Header.Get(jetstream.MsgTTLHeader); f != s || f == "" {
		t.Errorf("TTL headers: fast %q, nats.go %q", f, s)
	}
	if _, err := st.kvCreateTTL(ctx, bucket, "fast", []byte("v"), 3*time.Second); !isWrongLast(err) {
		t.Errorf("create of an existing key: %v, want wrong last sequence", err)
	}
	// Purges at a wrong revision are refused alike.
	_, errF := st.kvPurge(ctx, bucket, "fast", r1+100, 2*time.Second)
	errS := kv.Purge(ctx, "slow", jetstream.LastRevision(r2+100), jetstream.PurgeTTL(2*time.Second))
	if !isWrongLast(errF) || !isWrongLast(errS) {
		t.Errorf("purge at a wrong revision: fast %v, nats.go %v", errF, errS)
	}
	if !errors.Is(errS, jetstream.ErrKeyRevisionMismatch) {
		t.Logf("nats.go's purge error is not ErrKeyRevisionMismatch: %v", errS)
	}
	// Purges at the right revision store the same marker.
	if _, err := st.kvPurge(ctx, bucket, "fast", r1, 2*time.Second); err != nil {
		t.Fatal(err)
	}
	if err := kv.Purge(ctx, "slow", jetstream.LastRevision(r2), jetstream.PurgeTTL(2*time.Second)); err != nil {
		t.Fatal(err)
	}
	f, s := raw("fast").Header, raw("slow").Header
	for _, h := range []string{"KV-Operation", jetstream.MsgRollup, jetstream.MsgTTLHeader} {
		if f.Get(h) != s.Get(h) {
			t.Errorf("marker header %s: fast %q, nats.go %q", h, f.Get(h), s.Get(h))
		}
	}
	for _, key := range []string{"fast", "slow"} {
		if _, err := kv.Get(ctx, key); !errors.Is(err, jetstream.ErrKeyNotFound) && !errors.Is(err, jetstream.ErrKeyDeleted) {
			t.Errorf("%s after purge: %v", key, err)
		}
	}
	// A create on a purged key: fast refuses (wrong last), nats.go writes.
	if _, err := st.kvCreateTTL(ctx, bucket, "fast", []byte("v"), 3*time.Second); !isWrongLast(err) {
		t.Errorf("fast create on a purged key: %v, want wrong last sequence (the fallback's cue)", err)
	}
	// The mirror's createWithTTL takes it through the fallback.
	if _, err := st.leases.createWithTTL(ctx, "fast", &leaseRecord{Replica: "x"}, 3*time.Second); err != nil {
		t.Errorf("createWithTTL on a purged key: %v", err)
	}
	if _, err := st.leases.createWithTTL(ctx, "fast", &leaseRecord{Replica: "x"}, 3*time.Second); !errors.Is(err, jetstream.ErrKeyExists) {
		t.Errorf("createWithTTL on a held key: %v, want ErrKeyExists", err)
	}
	// Marker expiry: the purge's marker goes after its TTL.
	waitUntil(t, "the fast marker to expire", 15*time.Second, func() bool {
		_, err := stream.GetLastMsgForSubject(ctx, "$KV."+bucket+".slow")
		return errors.Is(err, jetstream.ErrMsgNotFound)
	})
}

// A zone's record buckets made by an earlier version (no per-message
// TTLs) are updated in place when a replica of this version opens the
// zone. JetStream never turns per-message TTLs off again, so a replica of
// an earlier version cannot open the zone after (README, "Upgrading"):
// pinned, so that a change of JetStream's rule is noticed.
func TestRecordBucketsUpgradeInPlace(t *testing.T) {
	srv := testnet.NATS(t)
	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cfg := jetstream.KeyValueConfig{Bucket: "r25", History: 1, Storage: jetstream.FileStorage}
	if _, err := js.CreateOrUpdateKeyValue(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	cfg.LimitMarkerTTL = leaseMarkerTTL
	if _, err := js.CreateOrUpdateKeyValue(ctx, cfg); err != nil {
		t.Fatalf("upgrade (TTLs on an existing bucket): %v", err)
	}
	cfg.LimitMarkerTTL = 0
	if _, err := js.CreateOrUpdateKeyValue(ctx, cfg); err == nil {
		t.Errorf("an earlier version's provisioning on the upgraded bucket passed: README's upgrade note is wrong now")
	}
}

// review25: the tally of sessions by origin agrees with a walk on both
// replicas through creation, adoption and its confirmation, deletion on
// the other replica and expiry.
func TestPerCallEdgeTallyAcrossReplicas(t *testing.T) {
	a, b := replicas(t)
	for i := 0; i < 6; i++ {
		meta := buffer.SessionMeta{}
		if i%3 == 1 {
			meta.Origin = policy.Adopted
		}
		if i%3 == 2 {
			meta.Origin = policy.Untapped
		}
		st := a
		if i%2 == 1 {
			st = b
		}
		if _, err := st.CreateSession(fmt.Sprintf("t%d", i), meta); err != nil {
			t.Fatal(err)
		}
	}
	sessionOn(t, a, "t5")
	sessionOn(t, b, "t0").(*session).Confirm() // not adopted: nothing
	sessionOn(t, b, "t1").(*session).Confirm()
	sessionOn(t, a, "t4").(*session).Confirm()
	if !b.Delete("t0", policy.ReasonDeleted) || !a.Delete("t4", policy.ReasonDeleted) {
		t.Fatal("Delete")
	}
	// A, opened first, sweeps: its scans count the zone's sessions and
	// publish the tally; both admit on it (tally.go).
	if !a.sweeps() || b.sweeps() {
		t.Fatal("A should sweep, B not")
	}
	counts := func(st *Store) policy.SessionCounts {
		c := st.sessionCounts()
		c.MaxSessions = 0
		return c
	}
	// Left: t1 (adopted, confirmed) and t3 among the others, t2 and t5
	// untapped.
	want := policy.SessionCounts{Sessions: 2, Untapped: 2}
	waitUntil(t, "both to count the zone's sessions", 10*time.Second, func() bool {
		_, ok1 := a.Session("t0")
		_, ok2 := b.Session("t4")
		return !ok1 && !ok2 && counts(a) == want && counts(b) == want
	})
	checkIndex(t, a)
	checkIndex(t, b)
	a.scanNow(t)
	if ca, cb := counts(a), counts(b); ca != want || cb != want {
		t.Errorf("after a scan: A %+v, B %+v, want %+v", ca, cb, want)
	}
}

// review25: a producer whose lease lapsed while it lived (cut off a
// moment) ends its stream complete while a sweeper elsewhere, holding the
// lapsed lease, is between its read of the record (live) and its failure
// signals. With no end marker stored by the producer (no reader attached)
// nothing fences the sweeper's signals: it stores them past the completed
// head, counts the stream failed and calls StreamFailed for a stream whose
// record says complete. The marker (expecting the producer's last event)
// fenced this before dfdaa2e.
func TestPerCallEdgeSweeperNotFencedByACompletionWithoutMarker(t *testing.T) {
	urls := []string{testnet.NATS(t).ClientURL()}
	a := openAt(t, urls)
	gate, release := make(chan struct{}), make(chan struct{})
	var failedHook int
	b := openAt(t, urls, func(o *Options) {
		o.SweepInterval = time.Hour // the sweep is run by hand
		o.FailureSignals = func(reason policy.Reason, last string, pending []string) []buffer.Signal {
			close(gate)
			<-release
			return defaultFailureSignals(reason, last, pending)
		}
		o.Hooks.StreamFailed = func(string, uint32, policy.Reason) { failedHook++ }
	})
	sa, err := a.CreateSession("cut", buffer.SessionMeta{})
	if err != nil {
		t.Fatal(err)
	}
	str, err := sa.NewStream([]string{"1"}, [32]byte{1})
	if err != nil {
		t.Fatal(err)
	}
	p := claim(t, str)
	appendEvents(t, str, 1, 2)
	key := streamKey(sa.(*session).sh, sa.(*session).epoch, 1)
	sessionOn(t, b, "cut")
	waitUntil(t, "B to see the stream", 10*time.Second, func() bool { _, _, ok := b.streams.get(key); return ok })
	// The lease lapses (as a TTL expiry would) while A lives.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	lapse(t, ctx, a.leases.kv, b, key)
	done := make(chan struct{})
	go func() { defer close(done); b.failOrphan(key) }()
	select {
	case <-gate:
	case <-done:
		// The record was live and the lease free: the sweeper must have
		// gone on to its signals. Ending here would leave the race untried.
		t.Fatal("the sweeper ended the orphan without building its failure signals")
	}
	str.Complete()
	p.Done()
	close(release)
	<-done
	rec, _, err := b.streams.fetch(ctx, key)
	_ = rec
	if err != nil {
		t.Fatal(err)
	}
	r, _, _ := b.streams.get(key)
	m, err := b.lastMsg(ctx, b.names.subject(key))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("record %v head %d; last stored message ends %v at %d; StreamFailed calls %d",
		r.State, r.Head, m.end, m.last(), failedHook)
	var readTo uint64
	if sb, ok := b.Session("cut"); ok {
		if strB, ok := sb.Stream(1); ok {
			if rd, err := strB.Attach(1); err == nil {
				rctx, rcancel := context.WithTimeout(ctx, 5*time.Second)
				var last uint64
				var rerr error
				for rerr == nil {
					var batch buffer.Batch
					batch, rerr = rd.Read(rctx, nil, 1<<20, time.Hour)
					if len(batch.Data) > 0 {
						last = batch.Last
					}
				}
				rcancel()
				rd.Close()
				readTo = last
				t.Logf("a reader on B from 1: last event %d, then %v; view %+v", last, rerr, strB.View())
			}
		}
	}
	// What the sweeper stored past the completed head before its record
	// write lost may stay there: no reader reads past the record's head.
	// No failure is counted, marked or reported, and readers end at head.
	if r.State == policy.Complete && (m.end == policy.Failed || failedHook != 0 || readTo != r.Head) {
		t.Errorf("a completed stream (head %d) got the sweeper's failure after it: stored up to %d, ending %v, StreamFailed called %d times, a reader read to %d",
			r.Head, m.last(), m.end, failedHook, readTo)
	}
}

// review25: after NATS came back without its data, the tally forgets the
// lost sessions on both replicas, counts the new ones, and a session
// deleted then (a purge with a marker TTL, on the recreated buckets) goes
// from both tallies.
func TestPerCallEdgeTallyAfterNATSLostItsData(t *testing.T) {
	srv, err := testnet.StartNATS(t.TempDir(), 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { testnet.ShutdownNATS(srv) })
	url, port := srv.ClientURL(), srv.Addr().(*net.TCPAddr).Port
	a, b := openAt(t, []string{url}), openAt(t, []string{url})
	for i := 0; i < 3; i++ {
		if _, err := a.CreateSession(fmt.Sprintf("lost%d", i), buffer.SessionMeta{Origin: policy.SessionOrigin(i % 3)}); err != nil {
			t.Fatal(err)
		}
	}
	sessionOn(t, b, "lost2")
	testnet.ShutdownNATS(srv)
	srv, err = testnet.StartNATS(t.TempDir(), port)
	if err != nil {
		t.Fatal(err)
	}
	for _, st := range []*Store{a, b} {
		waitUntil(t, "the store to be available again", 30*time.Second, func() bool { return st.Available() == nil })
		waitUntil(t, "the lost sessions to be forgotten", 10*time.Second, func() bool { _, ok := st.Session("lost2"); return !ok })
	}
	if _, err := b.CreateSession("after1", buffer.SessionMeta{}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.CreateSession("after2", buffer.SessionMeta{}); err != nil {
		t.Fatal(err)
	}
	sessionOn(t, a, "after2")
	if !a.Delete("after1", policy.ReasonDeleted) {
		t.Fatal("Delete after the loss")
	}
	waitUntil(t, "both to count one session", 10*time.Second, func() bool {
		ca, cb := a.sessionCounts(), b.sessionCounts()
		return ca.Sessions+ca.Adopted+ca.Untapped == 1 && cb.Sessions+cb.Adopted+cb.Untapped == 1
	})
	checkIndex(t, a)
	checkIndex(t, b)
}

// review25: a producer cut off long enough for its lease to lapse, and
// taken over elsewhere, must not end the stream afterwards: the record
// names the new producer. (recordEnd does not check the record's producer;
// with no end marker, nothing in the events stream fences it either.)
func TestPerCallEdgeCutOffProducerCannotCompleteATakenOverStream(t *testing.T) {
	urls := []string{testnet.NATS(t).ClientURL()}
	mod := func(o *Options) { o.TakeoverWait = time.Hour }
	a, b := openAt(t, urls, mod), openAt(t, urls, mod)
	sa, err := a.CreateSession("cut2", buffer.SessionMeta{})
	if err != nil {
		t.Fatal(err)
	}
	str, err := sa.NewStream([]string{"1"}, [32]byte{1})
	if err != nil {
		t.Fatal(err)
	}
	p := claim(t, str)
	produceWithCursor(t, str, 1, 2)
	key := streamKey(sa.(*session).sh, sa.(*session).epoch, 1)
	sb := sessionOn(t, b, "cut2")
	waitUntil(t, "B to see the stream", 10*time.Second, func() bool { _, _, ok := b.streams.get(key); return ok })
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	// A's lease lapses unseen by A (its watch would tell it: the purge
	// is made as a TTL expiry would look to B).
	lapse(t, ctx, a.leases.kv, b, key)
	stB, _ := sb.Stream(1)
	pb, _, err := stB.(buffer.Takeover).TakeOver(ctx)
	if err != nil {
		t.Fatalf("B's takeover: %v", err)
	}
	defer pb.Done()
	str.Complete()
	p.Done()
	rec, _, err := a.streams.fetch(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	r, _, _ := a.streams.get(key)
	_ = rec
	t.Logf("after A's Complete: record %v, producer %s (B is %s)", r.State, r.Producer, b.opts.ReplicaID)
	if r.State != policy.Live {
		t.Errorf("the cut-off producer A ended a stream B took over: %v", r.State)
	}
}

// lapse removes the lease key as its TTL's expiry would, and makes st see
// it gone as it would then: no notification tells of an expiry, so a
// replica reads a lease it has not seen renewed for a TTL again (its
// interest loop; the test does not wait the TTL out).
func lapse(t *testing.T, ctx context.Context, kv jetstream.KeyValue, st *Store, key string) {
	t.Helper()
	if err := kv.Purge(ctx, key); err != nil {
		t.Fatal(err)
	}
	st.leases.confirm(ctx, key, 0)
	if _, _, ok := st.leases.get(key); ok {
		t.Fatal("the lease is still held after its lapse")
	}
}
