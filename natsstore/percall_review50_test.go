package natsstore

// Review 50: attacks on the JetStream store's per-call path (issue 23):
// OpenCall's one write, the end written with the reader's leaving and no
// end marker, the whole eviction of an ended stream without a search, the
// retirement of ended streams beyond EndedStreamsKept, on two replicas of
// one embedded JetStream server, one of them behind a relay that delays or
// cuts its link.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/buffer"
	"github.com/mcpresume/caddy-mcp-resume/internal/testnet"
	"github.com/mcpresume/caddy-mcp-resume/policy"
)

// r50Decide is the glue's decision for a resume of stream num of sess from
// seq (serveResume): the stream's own, in one step with the
// acknowledgement, if the session names it; else policy's on what the
// session says alone; a stream that could not be read, an error (503). gone:
// Resume said the session ended (the glue then answers as for a session it
// does not know).
func r50Decide(sess buffer.Session, num uint32, seq uint64) (d policy.Resume, rd buffer.Reader, found, gone bool, err error) {
	in := policy.ResumeInput{SessionHeader: true,
		Cursor:  policy.Cursor{Valid: true, Minted: true, Epoch: sess.Epoch(), Stream: num, Seq: seq},
		Session: policy.SessionView{Known: true, Epoch: sess.Epoch(), NextStream: sess.NextStream()}}
	str, err := buffer.LookupStream(sess, num)
	if err != nil {
		return policy.Resume{}, nil, false, false, err
	}
	if str == nil {
		return policy.DecideResume(in), nil, false, false, nil
	}
	d, rd, err = str.Resume(seq, func(v policy.StreamView) policy.Resume {
		in.Stream = &v
		return policy.DecideResume(in)
	})
	switch {
	case errors.Is(err, buffer.ErrStreamGone):
		in.Stream = nil
		return policy.DecideResume(in), nil, true, false, nil
	case errors.Is(err, buffer.ErrSessionGone):
		// serveResume answers it as a resume of a session it does not know
		// (no tombstone: the session lives).
		in.Session, in.Stream = policy.SessionView{}, nil
		return policy.DecideResume(in), nil, true, true, nil
	}
	return d, rd, true, false, err
}

// A replica cut off from NATS takes a live call's stream for one it never
// had: a client whose call runs on A resumes on B while B's link is down,
// and B, whose mirror holds the session (it served it) but not the stream
// opened on A meanwhile, answers "Last-Event-ID names no stream of this
// session" (400: the SDK client fails the call) or, once B had seen a later
// stream, an "evicted" gap and a hold that never brings the answer, when
// the truth is "the store cannot answer now" (the 503 a Resume error gets).
// Session.Stream (session.go) read KV through mirror.lookup, which took a
// failed read for a missing key. Now LookupStream (buffer.StreamLookup)
// says it could not read, and the glue answers 503.
func TestReview50CutOffReplicaTakesALiveStreamForNone(t *testing.T) {
	ns := testnet.NATS(t)
	relay := newFaultRelay(t, strings.TrimPrefix(ns.ClientURL(), "nats://"))
	a := openAt(t, []string{ns.ClientURL()})
	b := openAt(t, []string{"nats://" + relay.addr()})
	sa, err := a.CreateSession("s50cut", buffer.SessionMeta{Version: "2025-11-25"})
	if err != nil {
		t.Fatal(err)
	}
	shortCall(t, sa, "1")
	sb := sessionOn(t, b, "s50cut") // B serves the session: its mirror holds it
	waitUntil(t, "B to see stream 1", 10*time.Second, func() bool { _, ok := sb.Stream(1); return ok && sb.NextStream() == 2 })

	relay.cut()
	waitUntil(t, "B to know it is cut off", 10*time.Second, func() bool { return b.Available() != nil })
	t.Logf("B: %v", b.Available())

	// The call's POST went to A: stream 2, two events; its client drops.
	var key [32]byte
	copy(key[:], "r50 call 2")
	str, p, rd, err := sa.(buffer.CallOpener).OpenCall(context.Background(), []string{"2"}, key)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Done()
	appendEvents(t, str, 1, 2)
	rd.Close()

	// The client comes back on B (the load balancer's choice) from event 1.
	if _, ok := b.Session("s50cut"); !ok {
		t.Fatal("B does not know the session at all (the glue would pass the resume on)")
	}
	d, rdB, found, gone, rerr := r50Decide(sb, 2, 1)
	if rdB != nil {
		rdB.Close()
	}
	t.Logf("resume on cut-off B: found %v, gone %v, decision %+v, error %v", found, gone, d, rerr)

	relay.mend()
	waitUntil(t, "B to reconnect", 20*time.Second, func() bool { return b.Available() == nil })
	strB, ok := sb.Stream(2)
	if !ok {
		t.Fatal("B still finds no stream 2 once reconnected")
	}
	v := strB.View()
	t.Logf("stream 2 on B once reconnected: state %v, head %d, floor %d", v.State, v.Head, v.Floor)
	if v.State != policy.Live || v.Head != 2 {
		t.Fatalf("stream 2: %+v, want live at head 2", v)
	}
	if rerr == nil && (d.Kind == policy.Reject || d.Kind == policy.Gap) {
		t.Errorf("a live stream with both events retained was answered as %v (status %d %q, reason %q, then %v) by a replica that could not read the store: "+
			"the client is told its cursor is bad or its events are gone, instead of 503 (retry)", d.Kind, d.Status, d.Detail, d.Reason, d.Then)
	}
	str.Complete()
}

// Many short calls on one session, then resumes of each on the other
// replica, once the oldest are retired (EndedStreamsKept) and the rest
// wholly evicted: a retired stream gets the "evicted" gap, an evicted one
// the gap that names its lost answer, a client that had everything the
// end; never a replay, never another stream's events.
func TestReview50ManyShortCallsThenResumesElsewhere(t *testing.T) {
	window := func(o *Options) { o.Limits.ResumeWindow = 300 * time.Millisecond }
	a, b := replicas(t, window)
	sa, err := a.CreateSession("s50many", buffer.SessionMeta{Version: "2025-11-25"})
	if err != nil {
		t.Fatal(err)
	}
	sb := sessionOn(t, b, "s50many")
	const n = buffer.EndedStreamsKept + 6
	for i := 1; i <= n; i++ {
		shortCall(t, sa, fmt.Sprint(i))
	}
	s := sa.(*session)
	waitUntil(t, "the oldest streams retired", 20*time.Second, func() bool {
		for num := uint32(1); num <= n-buffer.EndedStreamsKept; num++ {
			if _, _, ok := b.streams.lookup(context.Background(), streamKey(s.sh, s.epoch, num)); ok {
				return false
			}
		}
		return true
	})
	// Two replicas sweeping one session may each retire its oldest from
	// their own view, a few more than EndedStreamsKept between them (noted
	// in the closing note of the session that found it): a stream is
	// retired if KV no longer has it, and every other is evicted whole.
	retiredNow := func(num uint32) bool {
		_, _, err := b.streams.lookupErr(context.Background(), streamKey(s.sh, s.epoch, num))
		return errors.Is(err, errNotFound)
	}
	waitUntil(t, "the kept streams wholly evicted", 20*time.Second, func() bool {
		for num := uint32(n - buffer.EndedStreamsKept + 1); num <= n; num++ {
			if rec, _, ok := a.streams.get(streamKey(s.sh, s.epoch, num)); (!ok || !rec.Purged) && !retiredNow(num) {
				return false
			}
		}
		return true
	})
	retired := make(map[uint32]bool)
	for num := uint32(1); num <= n; num++ {
		retired[num] = retiredNow(num)
	}
	for num := uint32(1); num <= n; num++ {
		retired := retired[num]
		for _, seq := range []uint64{0, 2} { // the priming event's cursor; the result's
			d, rd, found, gone, err := r50Decide(sb, num, seq)
			if rd != nil {
				rd.Close()
				t.Errorf("stream %d from %d: a reader attached (%+v)", num, seq, d)
			}
			if err != nil || gone {
				t.Fatalf("stream %d from %d: error %v, gone %v", num, seq, err, gone)
			}
			switch {
			case retired && (d.Kind != policy.Gap || d.Reason != policy.ReasonEvicted || d.Then != policy.ThenHold):
				// (found: B's mirror may still hold the record; its Resume
				// then says ErrStreamGone, decided alike.)
				t.Errorf("retired stream %d from %d: found %v, %+v; want the evicted gap and a hold", num, seq, found, d)
			case !retired && seq == 0 && (d.Kind != policy.Gap || d.Then != policy.ThenEnd || len(d.LostIDs) != 1 || d.LostIDs[0] != fmt.Sprint(num)):
				t.Errorf("evicted stream %d from %d: %+v; want the gap naming request %d, then the end", num, seq, d, num)
			case !retired && seq == 2 && d.Kind != policy.Ended:
				t.Errorf("evicted stream %d from its last event (%d): %+v; want the end", num, seq, d)
			}
		}
	}
}

// A stream retired on A while B's mirror lags (B's link slow): a client
// resuming on B from a cursor of that stream is told the proxy restarted.
// B's mirror still names the stream, so the glue asks it to Resume, whose
// compare-and-set finds the record gone and says ErrSessionGone (stream.go
// Resume: errNotFound is taken for the session's end); the glue then
// answers as for a session it does not know: reason "proxy_restarted",
// where the same resume a moment later gets "evicted". Shown as what the
// glue decides. Now Resume says ErrStreamGone while the session lives, and
// the glue decides as for a stream no longer there.
func TestReview50RetiredUnderALaggingMirror(t *testing.T) {
	for attempt := 1; ; attempt++ {
		if review50RetiredUnderALaggingMirror(t) {
			return
		}
		if attempt == 5 {
			t.Fatalf("the retirement reaching A before B's mirror in none of %d attempts", attempt)
		}
	}
}

// review50RetiredUnderALaggingMirror runs one attempt; false: the retirement reaching A before B's mirror did not come, so it
// proves nothing (a timing the attempt does not control).
func review50RetiredUnderALaggingMirror(t *testing.T) bool {
	ns := testnet.NATS(t)
	relay := newFaultRelay(t, strings.TrimPrefix(ns.ClientURL(), "nats://"))
	window := func(o *Options) { o.Limits.ResumeWindow = 4 * time.Second }
	a := openAt(t, []string{ns.ClientURL()}, window)
	// B sweeps nothing itself: only A retires.
	b := openAt(t, []string{"nats://" + relay.addr()}, window, func(o *Options) { o.SweepInterval = time.Hour })
	sa, err := a.CreateSession("s50lag", buffer.SessionMeta{Version: "2025-11-25"})
	if err != nil {
		t.Fatal(err)
	}
	sb := sessionOn(t, b, "s50lag")
	const n = buffer.EndedStreamsKept + 1
	for i := 1; i <= n; i++ {
		shortCall(t, sa, fmt.Sprint(i))
	}
	s := sa.(*session)
	key1 := streamKey(s.sh, s.epoch, 1)
	waitUntil(t, "B's mirror to hold every stream ended", 10*time.Second, func() bool {
		rec, _, ok := b.streams.get(streamKey(s.sh, s.epoch, n))
		return ok && rec.State == policy.Complete
	})
	relay.delay.Store(int64(400 * time.Millisecond))
	waitUntil(t, "A to retire stream 1", 20*time.Second, func() bool { _, _, ok := a.streams.get(key1); return !ok })
	if _, _, ok := b.streams.get(key1); !ok {
		t.Log("B's mirror had the retirement already: again")
		return false
	}
	d, rd, found, gone, err := r50Decide(sb, 1, 0)
	if rd != nil {
		rd.Close()
	}
	t.Logf("resume on lagging B: found %v, gone %v, decision %+v, error %v", found, gone, d, err)
	relay.delay.Store(0)
	waitUntil(t, "B's mirror to lose stream 1", 10*time.Second, func() bool { _, _, ok := b.streams.get(key1); return !ok })
	later, _, _, _, _ := r50Decide(sb, 1, 0)
	t.Logf("the same resume a moment later: %+v", later)
	if _, ok := b.Session("s50lag"); !ok {
		t.Fatal("the session ended")
	}
	if err == nil && d.Reason != later.Reason {
		t.Errorf("a resume of a retired stream on a lagging replica: %v with reason %q (gone %v); a moment later %v with reason %q: "+
			"the client is told the proxy restarted", d.Kind, d.Reason, gone, later.Kind, later.Reason)
	}
	return true
}

// The end marker of a call whose client reads it on another replica lands
// after that replica evicted the ended stream whole: the subject was purged
// (the record says purged, end marker included), the producer, finding it
// empty, publishes the marker from nothing (publishAfter's emptied), and
// nothing purges it again: retirement skips the purge of a purged stream.
// The message stays in the events stream, with no record naming it, until
// the session ends. A's link is slow (a NATS under load), so the marker
// comes a moment after the end's record write; B's client resumes with
// everything (an acknowledgement, which evicts at once) in that moment.
// Now the marker is never stored into a subject emptied after the end was
// recorded.
func TestReview50LateEndMarkerAfterAWholeEviction(t *testing.T) {
	for attempt := 1; ; attempt++ {
		if review50LateEndMarker(t) {
			return
		}
		if attempt == 5 {
			t.Fatalf("the whole eviction before the marker in none of %d attempts", attempt)
		}
	}
}

// review50LateEndMarker runs one attempt; false: the whole eviction before the marker did not come, so it
// proves nothing (a timing the attempt does not control).
func review50LateEndMarker(t *testing.T) bool {
	ns := testnet.NATS(t)
	relay := newFaultRelay(t, strings.TrimPrefix(ns.ClientURL(), "nats://"))
	// The resume window (a minute) keeps what was delivered: only the
	// client's acknowledgement lets the events go.
	a := openAt(t, []string{"nats://" + relay.addr()})
	b := openAt(t, []string{ns.ClientURL()})
	sa, err := a.CreateSession("s50late", buffer.SessionMeta{Version: "2025-11-25"})
	if err != nil {
		t.Fatal(err)
	}
	str, err := sa.NewStream([]string{"1"}, [32]byte{50})
	if err != nil {
		t.Fatal(err)
	}
	p := claim(t, str)
	sb := sessionOn(t, b, "s50late")
	var strB buffer.Stream
	waitUntil(t, "B to see stream 1", 10*time.Second, func() bool { var ok bool; strB, ok = sb.Stream(1); return ok })
	rdB, err := strB.Attach(1)
	if err != nil {
		t.Fatal(err)
	}
	appendEvents(t, str, 1, 2)
	seqs, err := readSeqs(t, rdB, sb.Epoch(), 1, 1, 2)
	if err != nil {
		t.Fatal(err)
	}
	checkRun(t, seqs, 1, 2)
	rdB.Delivered(2)

	s := sa.(*session)
	key := streamKey(s.sh, s.epoch, 1)
	subject := b.names.subject(key)
	relay.delay.Store(int64(300 * time.Millisecond))
	completed := make(chan struct{})
	go func() { str.Complete(); close(completed) }()
	// B reads the record from KV (as a resume's compare-and-set does when
	// its mirror is stale): A's own notification of the end comes over
	// A's slow link, with the marker.
	waitUntil(t, "B to read the stream ended", 10*time.Second, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		b.streams.fetch(ctx, key)
		rec, _, ok := b.streams.get(key)
		return ok && rec.State == policy.Complete
	})
	// The client, with everything, resumes on B: its acknowledgement
	// evicts the ended stream whole.
	d, rd2, err := strB.Resume(2, func(v policy.StreamView) policy.Resume {
		return policy.DecideResume(policy.ResumeInput{SessionHeader: true,
			Cursor:  policy.Cursor{Valid: true, Minted: true, Epoch: sb.Epoch(), Stream: 1, Seq: 2},
			Session: policy.SessionView{Known: true, Epoch: sb.Epoch(), NextStream: sb.NextStream()}, Stream: &v})
	})
	if rd2 != nil {
		rd2.Close()
	}
	if err != nil || d.Kind != policy.Ended {
		t.Fatalf("resume with everything: %+v %v", d, err)
	}
	purgedFirst := false
	if rec, _, ok := b.streams.get(key); ok && rec.Purged {
		purgedFirst = true
	}
	select {
	case <-completed:
	case <-time.After(30 * time.Second):
		t.Fatal("Complete did not return")
	}
	p.Done()
	relay.delay.Store(0)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// B's reader ends (the record ended), and leaves.
	for {
		_, err := rdB.Read(ctx, nil, 1<<20, time.Second)
		if err != nil && !errors.Is(err, buffer.ErrIdle) {
			if !errors.Is(err, io.EOF) {
				t.Logf("B's reader ended with %v", err)
			}
			break
		}
	}
	rdB.Close()
	time.Sleep(500 * time.Millisecond) // sweeps on both replicas
	rec, _, ok := b.streams.lookup(ctx, key)
	m, err := b.lastMsg(ctx, subject)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("purged before the marker: %v; record %v purged %v floor %d head %d; last message on the subject: %+v",
		purgedFirst, ok, ok && rec.Purged, recField(rec, ok, func(r *streamRecord) uint64 { return r.Floor }),
		recField(rec, ok, func(r *streamRecord) uint64 { return r.Head }), m)
	if !purgedFirst {
		t.Log("the whole eviction did not come before the marker: again")
		return false
	}
	if m == nil || !ok || !rec.Purged {
		return true // held
	}
	// Retirement: EndedStreamsKept later calls make stream 1 the one too
	// many; its record goes, and (purged, it says) no purge goes with it.
	for i := 2; i <= buffer.EndedStreamsKept+1; i++ {
		shortCall(t, sa, fmt.Sprint(i))
	}
	waitUntil(t, "stream 1 retired", 20*time.Second, func() bool { _, _, ok := b.streams.lookup(ctx, key); return !ok })
	time.Sleep(200 * time.Millisecond)
	m2, err := b.lastMsg(ctx, subject)
	if err != nil {
		t.Fatal(err)
	}
	t.Errorf("the stream's record said purged (nothing of it stored, end marker included), yet its subject held message %d (end %v); "+
		"retired since, its record is gone and the subject still holds %+v: nothing purges it until the session ends", m.seq, m.end, m2)
	return true
}

func recField(rec *streamRecord, ok bool, f func(*streamRecord) uint64) uint64 {
	if !ok {
		return 0
	}
	return f(rec)
}

// A short call on A whose client resumes on B from its first event just
// as the call ends (its fed reader leaving with the end, no end marker
// stored when no reader is left): B's reader gets exactly the second
// event, then the end, within seconds, whichever write comes first. A
// reader left waiting for a marker never stored would hang its client.
func TestReview50ResumeElsewhereAsTheCallEnds(t *testing.T) {
	a, b := replicas(t)
	sa, err := a.CreateSession("s50end", buffer.SessionMeta{Version: "2025-11-25"})
	if err != nil {
		t.Fatal(err)
	}
	sb := sessionOn(t, b, "s50end")
	kinds := map[string]int{}
	defer func() { t.Logf("decisions on B: %v", kinds) }()
	for i := 1; i <= 40; i++ {
		id := fmt.Sprint(i)
		var key [32]byte
		copy(key[:], "r50end "+id)
		str, p, rd, err := sa.(buffer.CallOpener).OpenCall(context.Background(), []string{id}, key)
		if err != nil {
			t.Fatal(err)
		}
		num := str.Num()
		relayed := make(chan struct{})
		got1 := make(chan struct{}) // A's client has event 1: its cursor
		go func() {                 // A's client, as the glue relays: it may be taken over
			defer close(relayed)
			defer rd.Close()
			once := false
			for {
				bt, err := rd.Read(context.Background(), nil, 256<<10, 5*time.Second)
				if len(bt.Data) > 0 {
					rd.Delivered(bt.Last)
					if !once {
						once = true
						close(got1)
					}
				}
				if err != nil {
					return
				}
			}
		}()
		if _, err := str.Append(context.Background(), buffer.Entry{Fields: []byte("data: progress " + id + "\n")}); err != nil {
			t.Fatal(err)
		}
		type outcome struct {
			d     policy.Resume
			seqs  []uint64
			datas []string
			err   error
		}
		select {
		case <-got1:
		case <-time.After(10 * time.Second):
			t.Fatalf("call %d: A's client never got event 1", i)
		}
		out := make(chan outcome, 1)
		delay := time.Duration(i%8) * 400 * time.Microsecond
		go func() {
			time.Sleep(delay)
			var o outcome
			var strB buffer.Stream
			for deadline := time.Now().Add(5 * time.Second); strB == nil && time.Now().Before(deadline); {
				strB, _ = sb.Stream(num)
			}
			if strB == nil {
				o.err = errors.New("B never saw the stream")
				out <- o
				return
			}
			var rdB buffer.Reader
			o.d, rdB, o.err = strB.Resume(1, func(v policy.StreamView) policy.Resume {
				return policy.DecideResume(policy.ResumeInput{SessionHeader: true,
					Cursor:  policy.Cursor{Valid: true, Minted: true, Epoch: sb.Epoch(), Stream: num, Seq: 1},
					Session: policy.SessionView{Known: true, Epoch: sb.Epoch(), NextStream: sb.NextStream()}, Stream: &v})
			})
			if o.err != nil || rdB == nil {
				out <- o
				return
			}
			defer rdB.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			for {
				bt, err := rdB.Read(ctx, nil, 1<<20, time.Hour)
				for k, d := range bt.Data {
					o.seqs = append(o.seqs, bt.First+uint64(k))
					o.datas = append(o.datas, string(d))
				}
				if err != nil {
					if !errors.Is(err, io.EOF) {
						o.err = err
					}
					break
				}
			}
			out <- o
		}()
		result := `data: {"jsonrpc":"2.0","id":` + id + `,"result":{}}` + "\n"
		if _, err := str.Append(context.Background(), buffer.Entry{Fields: []byte(result), Answers: []string{id}}); err != nil {
			t.Fatal(err)
		}
		str.Complete()
		p.Done()
		o := <-out
		<-relayed
		kinds[o.d.Kind.String()]++
		switch {
		case o.err != nil:
			t.Fatalf("call %d, resume on B after %v: %+v: %v (read %v)", i, delay, o.d, o.err, o.seqs)
		case o.d.Kind == policy.Replay && (len(o.seqs) != 1 || o.seqs[0] != 2 || !strings.Contains(o.datas[0], `"id":`+id+`,`)):
			t.Fatalf("call %d, resume on B after %v: read %v %q, want event 2, the result", i, delay, o.seqs, o.datas)
		case o.d.Kind != policy.Replay && o.d.Kind != policy.Noop:
			t.Fatalf("call %d, resume on B after %v: %+v", i, delay, o.d)
		case o.d.Kind == policy.Noop && (len(o.seqs) != 1 || o.seqs[0] != 2):
			t.Fatalf("call %d, resume on B (at head, live) after %v: read %v, want event 2", i, delay, o.seqs)
		}
	}
}
