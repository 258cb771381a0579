package natsstore

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/mcpresume/caddy-mcp-resume/buffer"
	"github.com/mcpresume/caddy-mcp-resume/internal/testnet"
)

// A reading of the events stream taken while batches are being stored
// misses them; it must not wipe out what the replica counted for them. The
// reading here is taken, two more batches are stored, then the reading
// lands: the total still counts those batches. (It did not: eight streams
// without a client then took the reserve meant for connected clients.)
func TestATotalReadingKeepsWhatWasStoredMeanwhile(t *testing.T) {
	t.Parallel()
	st := openEmbedded(t, testLimits())
	s, err := st.CreateSession("total", buffer.SessionMeta{})
	if err != nil {
		t.Fatal(err)
	}
	str, _ := s.NewStream([]string{"1"}, [32]byte{1})
	claim(t, str)
	stored := func(from, to uint64) {
		appendEvents(t, str, from, to)
		if head := waitStored(str); head != to {
			t.Fatalf("stored up to %d, want %d", head, to)
		}
	}
	stored(1, 10)
	info, err := st.events.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	stored(11, 20)
	stored(21, 30)
	st.total.settle(int64(info.State.Bytes), info.State.LastSeq, 0)
	now, err := st.events.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	got := st.total.get(st, time.Hour)
	t.Logf("reading %d bytes at message %d; JetStream now %d at %d; the total says %d",
		info.State.Bytes, info.State.LastSeq, now.State.Bytes, now.State.LastSeq, got)
	if now.State.LastSeq <= info.State.LastSeq {
		t.Fatal("nothing was stored after the reading: the test shows nothing")
	}
	// storedSize overestimates a little per message (about 150 bytes),
	// never under. How many messages the batches after the reading took
	// depends on the publishes' pace: at low rates each event is its own.
	slack := 256 * int64(now.State.LastSeq-info.State.LastSeq)
	if got < int64(now.State.Bytes) || got > int64(now.State.Bytes)+slack {
		t.Fatalf("the total says %d bytes, JetStream holds %d", got, now.State.Bytes)
	}
	// A later reading counts them itself: nothing is counted twice.
	st.total.settle(int64(now.State.Bytes), now.State.LastSeq, 0)
	if got := st.total.get(st, time.Hour); got != int64(now.State.Bytes) {
		t.Fatalf("after a reading that saw everything the total says %d, JetStream %d", got, now.State.Bytes)
	}
}

// Appends that wait only for the writer's pipeline (one batch in flight to
// JetStream) are flow control, not backpressure: with room in every bound
// a flood counts no stall, and the stalled-streams gauge stays 0. A log
// that is full still counts one.
func TestPipelineWaitsAreNotStalls(t *testing.T) {
	t.Parallel()
	st := openEmbedded(t, testLimits(), func(o *Options) { o.BatchBytes = 4 << 10 })
	s, err := st.CreateSession("flow", buffer.SessionMeta{})
	if err != nil {
		t.Fatal(err)
	}
	str, _ := s.NewStream([]string{"1"}, [32]byte{1})
	claim(t, str)
	fields := []byte("data: " + strings.Repeat("f", 500) + "\n")
	for i := 0; i < 5000; i++ {
		if _, err := str.Append(context.Background(), buffer.Entry{Fields: fields}); err != nil {
			t.Fatal(err)
		}
	}
	if n := waitStored(str); n != 5000 {
		t.Fatalf("stored %d of 5000", n)
	}
	if n := st.counters.Stalls.Load(); n != 0 {
		t.Fatalf("%d stalls counted with room in every bound", n)
	}

	// A full log is a stall.
	lim := testLimits()
	lim.MaxStreamBytes, lim.StallTimeout = 8<<10, 200*time.Millisecond
	st.SetLimits(lim)
	full, _ := s.NewStream([]string{"2"}, [32]byte{2})
	claim(t, full)
	var failed error
	for i := 0; i < 100 && failed == nil; i++ {
		_, failed = full.Append(context.Background(), buffer.Entry{Fields: fields})
	}
	if failed == nil || st.counters.Stalls.Load() == 0 {
		t.Fatalf("a full log: %v, %d stalls", failed, st.counters.Stalls.Load())
	}
}

// A reading can land before the ack of a batch it already counts; the
// batch is then not added again. 32 writers store small batches while
// readings land in a loop: no batch a reading covered stays in recent.
func TestABatchIsNeverCountedTwice(t *testing.T) {
	t.Parallel()
	st := openEmbedded(t, testLimits(), func(o *Options) { o.BatchBytes = 4 << 10 })
	s, err := st.CreateSession("twice", buffer.SessionMeta{})
	if err != nil {
		t.Fatal(err)
	}
	const writers = 32
	var wg sync.WaitGroup
	stop := make(chan struct{})
	wctx, wcancel := context.WithCancel(context.Background())
	defer wcancel()
	for i := 0; i < writers; i++ {
		str, err := s.NewStream([]string{"r"}, [32]byte{byte(i + 1)})
		if err != nil {
			t.Fatal(err)
		}
		claim(t, str)
		wg.Add(1)
		go func() {
			defer wg.Done()
			fields := []byte("data: " + strings.Repeat("y", 300) + "\n")
			for {
				select {
				case <-stop:
					return
				default:
				}
				if _, err := str.Append(wctx, buffer.Entry{Fields: fields}); err != nil {
					if wctx.Err() == nil {
						t.Error(err)
					}
					return
				}
			}
		}()
	}
	twice, worst := 0, int64(0)
	deadline := time.Now().Add(3 * time.Second) // before the 32 streams fill the session

	for time.Now().Before(deadline) && twice < 20 {
		info, err := st.events.Info(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		last := info.State.LastSeq
		st.total.settle(int64(info.State.Bytes), last, 0)
		time.Sleep(time.Millisecond)
		st.total.mu.Lock()
		var over int64
		for _, b := range st.total.recent {
			if b.seq <= last {
				twice++
				over += b.bytes
			}
		}
		st.total.mu.Unlock()
		worst = max(worst, over)
	}
	close(stop)
	wcancel()
	wg.Wait()
	t.Logf("batches counted twice: %d (at most %d bytes at once)", twice, worst)
	if twice > 0 {
		t.Fatalf("%d batches were counted both by a reading and by add", twice)
	}
}

// The events stream is deleted and created anew (by another replica's
// provisioning) while this replica runs: sequences start again from 1.
// Batches stored just before, in no reading yet, must not stay counted in
// every later reading (their old sequences are above every new last).
func TestTheTotalAfterTheEventsStreamIsRecreated(t *testing.T) {
	t.Parallel()
	ns := testnet.NATS(t)
	urls := []string{ns.ClientURL()}
	a := openAt(t, urls)
	s, err := a.CreateSession("reset", buffer.SessionMeta{})
	if err != nil {
		t.Fatal(err)
	}
	str, _ := s.NewStream([]string{"1"}, [32]byte{1})
	claim(t, str)
	appendEvents(t, str, 1, 200)
	waitStored(str)
	// The zone has been busy: the events stream's sequence is well along.
	for i := 0; i < 5000; i++ {
		if i%1000 == 0 { // no more pending than the client allows, however slow the acks
			<-a.js.PublishAsyncComplete()
		}
		if _, err := a.js.PublishAsync(a.names.evPrefix+"busy", nil); err != nil {
			t.Fatal(err)
		}
	}
	<-a.js.PublishAsyncComplete()
	a.events.Purge(context.Background(), jetstream.WithPurgeSubject(a.names.evPrefix+"busy"))
	a.total.refresh(a) // a reading: seen = its last
	appendEvents(t, str, 201, 260)
	waitStored(str)
	a.total.mu.Lock()
	recentN, seen := len(a.total.recent), a.total.seen
	var recentBytes int64
	for _, b := range a.total.recent {
		recentBytes += b.bytes
	}
	a.total.mu.Unlock()
	t.Logf("before: %d batches (%d bytes) in recent, seen %d", recentN, recentBytes, seen)

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := a.js.DeleteStream(ctx, a.names.events); err != nil {
		t.Fatal(err)
	}
	openAt(t, urls) // another replica provisions the zone's events stream anew
	waitUntil(t, "replica A to be available again", 20*time.Second, func() bool { return a.Available() == nil })

	// A new session on A stores into the new stream.
	s2, err := a.CreateSession("after", buffer.SessionMeta{})
	if err != nil {
		t.Fatal(err)
	}
	str2, _ := s2.NewStream([]string{"1"}, [32]byte{2})
	claim(t, str2)
	appendEvents(t, str2, 1, 20)
	waitStored(str2)
	info, err := a.events.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	a.total.mu.Lock()
	between := a.total.bytes
	a.total.mu.Unlock()
	t.Logf("before the next reading: total %d, JetStream %d at last %d", between, info.State.Bytes, info.State.LastSeq)

	a.total.refresh(a)
	info, _ = a.events.Info(ctx)
	got := a.total.get(a, time.Hour)
	t.Logf("after a reading: total %d, JetStream %d at last %d", got, info.State.Bytes, info.State.LastSeq)
	if got > int64(info.State.Bytes)+1024 {
		t.Errorf("after a reading the total says %d bytes, JetStream holds %d: batches of the deleted stream still counted", got, info.State.Bytes)
	}
	time.Sleep(5 * time.Second)
	a.total.refresh(a)
	info, _ = a.events.Info(ctx)
	got = a.total.get(a, time.Hour)
	t.Logf("5 s later: total %d, JetStream %d at last %d", got, info.State.Bytes, info.State.LastSeq)
	if got > int64(info.State.Bytes)+1024 {
		t.Errorf("5 s later the total says %d bytes, JetStream holds %d", got, info.State.Bytes)
	}
}

// A purge leaves the total too high until the next reading. An append that
// fits on it goes on without one: invalidating the total at each purge made
// the next call's first append wait for a stream info request (0.14 of them
// a call with eight sessions calling, one a session in churn). A blocked
// append reads again once events were purged since its reading began, not
// only once the reading is 100 ms old.
func TestAPurgeMakesOnlyABlockedAppendReadTheTotalAgain(t *testing.T) {
	t.Parallel()
	lim := testLimits()
	lim.ResumeWindow = 50 * time.Millisecond
	st := openEmbedded(t, lim, func(o *Options) { o.SweepInterval = 20 * time.Millisecond })
	tap := newWiretap(t, st)
	sess, err := st.CreateSession("freed", buffer.SessionMeta{Version: "2025-06-18"})
	if err != nil {
		t.Fatal(err)
	}
	shortCall(t, sess, "warm-up") // the first append's reading
	for i := 0; i < 8; i++ {
		id := string(rune('a' + i))
		// A reading (well under its second of age at the call), then the
		// previous call's events go: a floor move and its purge.
		st.total.refresh(st)
		evicted := st.Counters().EventsEvicted.Load()
		waitUntil(t, "the last call's eviction", 10*time.Second, func() bool {
			return st.Counters().EventsEvicted.Load() > evicted
		})
		tap.since()
		shortCall(t, sess, id)
		if n := tap.since()["stream info"]; n != 0 {
			t.Fatalf("call %s after a purge read the events stream's info %d times", id, n)
		}
	}

	// The reading mechanism itself: a purge after a reading began makes it
	// due again, whatever its age; one before does not.
	tb := &totalBytes{}
	tb.settle(0, 0, tb.freedGen)
	if tb.due(time.Hour) {
		t.Fatal("a fresh reading is due")
	}
	tb.freed()
	if !tb.due(time.Hour) {
		t.Fatal("a reading older than a purge is not due")
	}
	gen := tb.freedGen // a reading begins
	tb.freed()         // a purge while it is under way
	tb.settle(0, 0, gen)
	if !tb.due(time.Hour) {
		t.Fatal("a reading begun before a purge is not due")
	}
	tb.settle(0, 0, tb.freedGen)
	if tb.due(time.Hour) || tb.stale(time.Hour) {
		t.Fatal("a reading after every purge is due")
	}
}
