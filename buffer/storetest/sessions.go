package storetest

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"testing"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/buffer"
	"github.com/mcpresume/caddy-mcp-resume/internal/eventid"
	"github.com/mcpresume/caddy-mcp-resume/policy"
)

var sessionContracts = []contract{
	{"SessionAndStreamLimits", testLimits},
	{"AdoptedSessionsCannotCrowdOut", testAdoptedShare},
	{"DeleteSession", testDeleteSession},
	{"DeletedSessionHasItsTombstoneAtOnce", testDeleteSeenWhole},
	{"RebindCredential", testRebind},
	{"IdleExpiry", testIdleExpiry},
	{"EndedStreamsRetire", testEndedStreamsRetire},
	{"NewestEndedStreamsStayWhileAnOlderCannotGo", testNewestEndedStreamsStay},
	{"StreamLookup", testLookups},
}

func testLimits(t *testing.T, e *env) {
	lim := BigLimits()
	lim.MaxSessions = 2
	lim.MaxStreamsPerSession = 2
	st := e.store(lim)
	s := MustSession(t, st, "s1")
	if _, err := st.CreateSession("s1", buffer.SessionMeta{}); !errors.Is(err, buffer.ErrSessionExists) {
		t.Fatalf("duplicate session: %v", err)
	}
	MustSession(t, st, "s2")
	if st.Admit(policy.Initialized) {
		t.Fatal("Admit with max_sessions held")
	}
	if _, err := st.CreateSession("s3", buffer.SessionMeta{}); !errors.Is(err, buffer.ErrTooManySessions) {
		t.Fatalf("third session: %v", err)
	}
	g := s.Standalone()
	if got, ok := s.Stream(policy.StandaloneNum); !ok || got != g || s.Standalone() != g {
		t.Fatal("Stream(0) does not find the standalone stream")
	}
	if len(infoOf(t, st, s).Streams) != 0 {
		t.Fatal("a standalone stream no one used is not shown")
	}
	p := MustStream(t, s)
	MustStream(t, s)
	if p.Num() != 1 || s.NextStream() != 3 {
		t.Fatalf("request streams number from 1: %d, next %d", p.Num(), s.NextStream())
	}
	if s.AdmitStream() {
		t.Fatal("AdmitStream with max_streams_per_session live")
	}
	if _, err := s.NewStream([]string{"x"}, [32]byte{7}); !errors.Is(err, buffer.ErrTooManyStreams) {
		t.Fatalf("third live stream: %v", err)
	}
	// Only live request streams count: a complete one frees its slot at
	// once, even while it still holds events (the byte bounds cover those).
	AppendN(t, p, 1, EvSize)
	p.Complete()
	if !s.AdmitStream() {
		t.Fatal("the complete stream still counts")
	}
	q, err := s.NewStream([]string{"q"}, [32]byte{8})
	if err != nil {
		t.Fatalf("stream after the old one completed: %v", err)
	}
	if q.Num() != 3 {
		t.Fatalf("stream number %d, want 3", q.Num())
	}
	if _, ok := s.Stream(99); ok {
		t.Fatal("Stream(99) found")
	}
	info := infoOf(t, st, s)
	if len(info.Streams) != 3 || info.Streams[0].Num != 1 || info.Streams[0].State != "complete" || info.Streams[2].Num != 3 {
		t.Fatalf("info %+v", info)
	}
	prod := MustProduce(t, g)
	if info := infoOf(t, st, s); len(info.Streams) != 4 || info.Streams[0].Kind != "standalone" {
		t.Fatalf("info after the standalone stream was used %+v", info)
	}
	prod.Done()
	if s := st.Stats(); s.Sessions != 2 || s.Streams != 4 {
		t.Fatalf("stats %+v", s)
	}
}

// Sessions adopted on a POST alone have their own quarter of max_sessions:
// made-up session IDs can neither lock initialize out nor take more.
func testAdoptedShare(t *testing.T, e *env) {
	lim := BigLimits()
	lim.MaxSessions = 8
	st := e.store(lim)
	for i := 0; i < 2; i++ {
		if _, err := st.CreateSession(fmt.Sprintf("made-up-%d", i), buffer.SessionMeta{Origin: policy.Adopted}); err != nil {
			t.Fatal(err)
		}
	}
	if st.Admit(policy.Adopted) {
		t.Fatal("Admit(Adopted) with its share full")
	}
	if _, err := st.CreateSession("made-up-2", buffer.SessionMeta{Origin: policy.Adopted}); !errors.Is(err, buffer.ErrTooManySessions) {
		t.Fatalf("third adopted session: %v", err)
	}
	for i := 0; i < 8; i++ {
		if _, err := st.CreateSession(fmt.Sprintf("real-%d", i), buffer.SessionMeta{}); err != nil {
			t.Fatalf("initialized session %d refused: %v", i, err)
		}
	}
	if _, err := st.CreateSession("real-8", buffer.SessionMeta{}); !errors.Is(err, buffer.ErrTooManySessions) {
		t.Fatalf("beyond max_sessions: %v", err)
	}
	// A confirmed adopted session moves to the others' share.
	st.Delete("real-0", policy.ReasonDeleted)
	a, _ := st.Session("made-up-0")
	a.Confirm()
	if a.Meta().Origin != policy.Resumed {
		t.Fatalf("origin after Confirm: %v", a.Meta().Origin)
	}
	if _, err := st.CreateSession("made-up-3", buffer.SessionMeta{Origin: policy.Adopted}); err != nil {
		t.Fatalf("adopted share not freed by Confirm: %v", err)
	}
	if _, err := st.CreateSession("real-9", buffer.SessionMeta{}); !errors.Is(err, buffer.ErrTooManySessions) {
		t.Fatalf("the confirmed session must count among the others: %v", err)
	}
}

func testDeleteSession(t *testing.T, e *env) {
	st := e.store(BigLimits())
	meta := buffer.SessionMeta{Version: "2025-11-25", Fingerprint: [32]byte{9, 9}, Bind: []string{"X-Api-Key", "bearer"}, Endpoint: "/mcp?t=1",
		Credential: buffer.Credential{Hash: [32]byte{4}, Principal: policy.Principal{Known: true, Hash: [32]byte{5}}}}
	s, err := st.CreateSession("s1", meta)
	if err != nil {
		t.Fatal(err)
	}
	if s.ID() != "s1" || !reflect.DeepEqual(s.Meta(), meta) || len(s.Epoch()) != eventid.EpochLen {
		t.Fatalf("session %q %+v %q", s.ID(), s.Meta(), s.Epoch())
	}
	if got, ok := st.Session("s1"); !ok || got.Epoch() != s.Epoch() {
		t.Fatal("Session(s1)")
	}
	a, b := MustStream(t, s, "1"), MustStream(t, s, "2")
	AppendN(t, a, 4, EvSize)
	AppendN(t, b, 3, EvSize)
	keep := MustStream(t, MustSession(t, st, "s2"))
	AppendN(t, keep, 2, EvSize)
	r, _ := a.Attach(1)
	if !st.Delete("s1", policy.ReasonDeleted) {
		t.Fatal("Delete = false")
	}
	if st.Delete("s1", policy.ReasonDeleted) {
		t.Fatal("second Delete = true")
	}
	select {
	case <-r.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("reader not done after delete")
	}
	if _, err := r.Read(context.Background(), nil, 1<<20, time.Second); !errors.Is(err, buffer.ErrSessionGone) {
		t.Fatalf("read after delete: %v", err)
	}
	r.Close()
	if s.Context().Err() == nil {
		t.Fatal("session context not cancelled")
	}
	// A handle kept past the end still tells which requests the stream
	// had (a relay fails the ones its client was owed): failed, nothing
	// retained.
	if v := a.View(); v.State != policy.Failed || v.Head != 4 || v.Floor != 5 ||
		len(v.Requests) != 1 || v.Requests[0].ID != "1" || v.Requests[0].AnsweredAt != 0 {
		t.Fatalf("view of a stream of the deleted session: %+v", v)
	}
	if _, ok := st.Session("s1"); ok {
		t.Fatal("session still there")
	}
	tomb, ok := st.Tombstone("s1")
	if !ok || tomb.Reason != policy.ReasonDeleted || tomb.Epoch != s.Epoch() || tomb.Fingerprint != meta.Fingerprint ||
		tomb.Version != "2025-11-25" || !reflect.DeepEqual(tomb.Bind, meta.Bind) || tomb.Credential != meta.Credential || tomb.Endpoint != meta.Endpoint {
		t.Fatalf("tombstone %+v, %v", tomb, ok)
	}
	// It remembers the requests whose answers the client may lack.
	if len(tomb.Streams) != 2 || tomb.Streams[a.Num()].Requests[0].ID != "1" || tomb.Streams[a.Num()].Floor != 5 {
		t.Fatalf("tombstone streams %+v", tomb.Streams)
	}
	if _, err := s.NewStream([]string{"3"}, [32]byte{3}); !errors.Is(err, buffer.ErrSessionGone) {
		t.Fatalf("NewStream on deleted session: %v", err)
	}
	if _, err := a.Attach(5); !errors.Is(err, buffer.ErrSessionGone) {
		t.Fatalf("Attach on deleted session: %v", err)
	}
	if n := st.Counters().EventsEvicted.Load(); n != 7 {
		t.Fatalf("EventsEvicted = %d", n)
	}
	if n := st.Counters().FailedStreams()[policy.ReasonDeleted]; n != 2 {
		t.Fatalf("FailedStreams[deleted] = %d", n)
	}
	// A new session under the same ID consumes the tombstone: what it knew
	// becomes the new incarnation's past, under a new epoch minted for the
	// same session ID.
	s1b := MustSession(t, st, "s1")
	if _, ok := st.Tombstone("s1"); ok {
		t.Fatal("tombstone survived re-creation")
	}
	if s1b.Epoch() == s.Epoch() || !eventid.Minted(st.Key(), "s1", s.Epoch()) || !eventid.Minted(st.Key(), "s1", s1b.Epoch()) {
		t.Fatalf("epochs %q then %q", s.Epoch(), s1b.Epoch())
	}
	past, ok := s1b.Past(s.Epoch())
	if !ok || past.Reason != policy.ReasonDeleted || len(past.Streams) != 2 {
		t.Fatalf("past %+v %v", past, ok)
	}
	if str := MustStream(t, s1b); str.Num() != 1 || str.View().Head != 0 {
		t.Fatalf("the new incarnation's first stream: %d %+v", str.Num(), str.View())
	}
	st.Delete("s2", policy.ReasonDeleted)
	st.Delete("s1", policy.ReasonPurged)
	WaitFor(t, "everything to go", func() bool {
		s := st.Stats()
		return s.RetainedBytes == 0 && s.Sessions == 0 && s.Tombstones == 2
	})
	// The second tombstone remembers the first incarnation too.
	tomb, _ = st.Tombstone("s1")
	if tomb.Reason != policy.ReasonPurged || len(tomb.Earlier) != 1 || tomb.Earlier[0].Epoch != s.Epoch() {
		t.Fatalf("second tombstone %+v", tomb)
	}
}

// A request that looks the session up while a Delete ends it finds it, or
// finds its whole tombstone: never no session and no tombstone (it would
// be adopted, under any credential), nor a tombstone without the streams
// that owed their clients an answer (a resume could not fail those calls).
func testDeleteSeenWhole(t *testing.T, e *env) {
	st := e.store(BigLimits())
	for i := range 50 {
		id := fmt.Sprintf("s%d", i)
		str := MustStream(t, MustSession(t, st, id), "1")
		AppendN(t, str, 2, EvSize)
		looked := make(chan struct{})
		seen := Async(func() error {
			close(looked)
			for {
				if _, ok := st.Session(id); ok {
					continue
				}
				tomb, ok := st.Tombstone(id)
				switch {
				case !ok:
					return errors.New("neither the session nor its tombstone")
				case tomb.Reason != policy.ReasonDeleted || len(tomb.Streams[str.Num()].Requests) != 1:
					return fmt.Errorf("a tombstone without what the stream owed: %s %+v", tomb.Reason, tomb.Streams)
				}
				return nil
			}
		})
		<-looked
		if !st.Delete(id, policy.ReasonDeleted) {
			t.Fatal("Delete = false")
		}
		if err := <-seen; err != nil {
			t.Fatalf("%s, looked up while it was deleted: %v", id, err)
		}
	}
}

// A session rebound to a refreshed credential keeps everything else, shows
// the new binding wherever it is looked up, and its tombstone keeps it.
func testRebind(t *testing.T, e *env) {
	st := e.store(BigLimits())
	meta := buffer.SessionMeta{Version: "2025-11-25", Fingerprint: [32]byte{9}, Bind: []string{"bearer"},
		Credential: buffer.Credential{Hash: [32]byte{1}, Principal: policy.Principal{Known: true, Hash: [32]byte{7}}}}
	s, err := st.CreateSession("s1", meta)
	if err != nil {
		t.Fatal(err)
	}
	str := MustStream(t, s)
	AppendN(t, str, 2, EvSize)
	for _, c := range []buffer.Credential{
		{Hash: [32]byte{2}, Principal: policy.Principal{Known: true, Hash: [32]byte{7}}},
		{Hash: [32]byte{3}}, // an opaque token: no principal
	} {
		if err := s.Rebind(c); err != nil {
			t.Fatalf("Rebind: %v", err)
		}
		want := meta
		want.Credential = c
		if got := s.Meta(); !reflect.DeepEqual(got, want) {
			t.Fatalf("Meta after Rebind = %+v, want %+v", got, want)
		}
		again, ok := st.Session("s1")
		if !ok || again.Meta().Credential != c {
			t.Fatalf("Session(s1) after Rebind: %v %+v", ok, again)
		}
	}
	if v := str.View(); v.Head != 2 {
		t.Fatalf("the stream after Rebind: %+v", v)
	}
	st.Delete("s1", policy.ReasonDeleted)
	if tomb, ok := st.Tombstone("s1"); !ok || tomb.Credential != (buffer.Credential{Hash: [32]byte{3}}) {
		t.Fatalf("tombstone %+v, %v", tomb, ok)
	}
	if err := s.Rebind(buffer.Credential{Hash: [32]byte{4}}); !errors.Is(err, buffer.ErrSessionGone) {
		t.Fatalf("Rebind of a deleted session: %v", err)
	}
}

func testIdleExpiry(t *testing.T, e *env) {
	const idle = 500 * time.Millisecond
	lim := BigLimits()
	lim.SessionIdleTimeout = idle
	st := e.store(lim)
	start := time.Now() // before the idle session's last activity, its creation: the setup below may take a while on a loaded machine
	idleS := MustSession(t, st, "idle")
	AppendN(t, MustStream(t, idleS), 3, EvSize)
	touched := MustSession(t, st, "touched")
	connected := MustSession(t, st, "connected")
	r, _ := MustStream(t, connected).Attach(1)

	stop := make(chan struct{})
	done := Async(func() bool {
		for {
			select {
			case <-stop:
				return true
			case <-time.After(idle / 5):
				touched.Touch()
			}
		}
	})
	WaitFor(t, "the idle session to expire", func() bool { _, ok := st.Session("idle"); return !ok })
	if time.Since(start) < idle {
		t.Fatalf("expired after %s, before its idle timeout", time.Since(start))
	}
	if tomb, ok := st.Tombstone("idle"); !ok || tomb.Reason != policy.ReasonExpired {
		t.Fatalf("tombstone %+v %v", tomb, ok)
	}
	time.Sleep(2 * idle)
	if _, ok := st.Session("touched"); !ok {
		t.Fatal("a touched session expired")
	}
	if _, ok := st.Session("connected"); !ok {
		t.Fatal("a session with a client connected expired")
	}
	close(stop)
	<-done
	// Once the client leaves, the idle clock starts from then.
	left := time.Now() // before Close: a store may take the client's leaving as of its start
	r.Close()
	WaitFor(t, "the disconnected session to expire", func() bool { _, ok := st.Session("connected"); return !ok })
	if time.Since(left) < idle {
		t.Fatal("expired before its idle timeout after disconnect")
	}
	WaitFor(t, "the session no longer touched to expire", func() bool { _, ok := st.Session("touched"); return !ok })
	// A shared store counts an expiry a moment after the session's record
	// went (natsstore: its tally after the removal), so a look at once
	// could see the count not yet down.
	WaitFor(t, "the stats to count nothing", func() bool { s := st.Stats(); return s.Sessions == 0 && s.RetainedBytes == 0 })
}

// answeredCall is call i of s: one event, its answer, and the stream
// complete, not yet delivered.
func answeredCall(t *testing.T, s buffer.Session, i int) buffer.Stream {
	t.Helper()
	str := MustStream(t, s, fmt.Sprint(i))
	if _, err := str.Append(context.Background(), buffer.Entry{Fields: Fields(Payload(1, EvSize)), Answers: []string{fmt.Sprint(i)}}); err != nil {
		t.Fatal(err)
	}
	str.Complete()
	return str
}

// Ended request streams leave the session once they hold nothing and more
// than EndedStreamsKept others ended after them: a session that makes many
// short calls keeps a bounded number of records.
func testEndedStreamsRetire(t *testing.T, e *env) {
	st := e.store(windowLimits())
	s := MustSession(t, st, "s1")
	const calls = buffer.EndedStreamsKept + 6
	for i := 0; i < calls; i++ {
		str := answeredCall(t, s, i)
		DeliverAndClose(t, str, 1)
	}
	held := func() int {
		n := 0
		for num := uint32(1); num <= calls; num++ {
			if _, ok := s.Stream(num); ok {
				n++
			}
		}
		return n
	}
	WaitFor(t, "ended streams to retire", func() bool { return held() == buffer.EndedStreamsKept })
	time.Sleep(3 * window)
	if n := held(); n != buffer.EndedStreamsKept {
		t.Fatalf("%d stream records held after %d calls, want %d", n, calls, buffer.EndedStreamsKept)
	}
	if _, ok := s.Stream(calls); !ok {
		t.Fatal("the newest stream was retired")
	}
	if _, ok := s.Stream(1); ok {
		t.Fatal("the oldest stream was not retired")
	}
	if s.NextStream() != calls+1 {
		t.Fatal("retiring must not reuse stream numbers")
	}
	WaitFor(t, "the bytes to go", func() bool { return st.Stats().RetainedBytes == 0 })
}

// The newest EndedStreamsKept ended streams stay while an older one cannot
// go yet (a client reads it, its event not yet delivered): none of them
// goes in its place, so a late resume of any of them gets its precise
// answer. The older one goes once it can.
func testNewestEndedStreamsStay(t *testing.T, e *env) {
	st := e.store(windowLimits())
	s := MustSession(t, st, "s1")
	const calls = buffer.EndedStreamsKept + 3
	for i := 0; i < calls; i++ {
		str := answeredCall(t, s, i)
		if i > 0 {
			DeliverAndClose(t, str, 1)
		}
	}
	first, ok := s.Stream(1)
	if !ok {
		t.Fatal("no stream 1")
	}
	rd, err := first.Attach(1) // its client reads it: it cannot go
	if err != nil {
		t.Fatal(err)
	}
	held := func(num uint32) bool { _, ok := s.Stream(num); return ok }
	WaitFor(t, "streams 2 and 3 to retire", func() bool { return !held(2) && !held(3) })
	time.Sleep(3 * window) // sweeps enough for a wrong one to go
	for num := uint32(4); num <= calls; num++ {
		if !held(num) {
			t.Fatalf("stream %d, one of the newest %d ended, retired while stream 1 could not go", num, buffer.EndedStreamsKept)
		}
	}
	if !held(1) {
		t.Fatal("stream 1 retired under its reader")
	}
	rd.Close()
	DeliverAndClose(t, first, 1) // its client has it all now
	WaitFor(t, "stream 1 to retire once delivered", func() bool { return !held(1) })
	if !held(4) {
		t.Fatal("stream 4 retired with stream 1")
	}
}

func testLookups(t *testing.T, e *env) {
	st := e.store(BigLimits())
	s := MustSession(t, st, "s1")
	a, err := s.NewStream([]string{"1"}, [32]byte{1})
	if err != nil {
		t.Fatal(err)
	}
	if got, ok := s.StreamByKey([32]byte{1}); !ok || got.Num() != a.Num() {
		t.Fatal("StreamByKey")
	}
	if _, ok := s.StreamByKey([32]byte{2}); ok {
		t.Fatal("StreamByKey of an unknown request")
	}
	if got, ok := s.Stream(a.Num()); !ok || got.Num() != a.Num() || got.Kind() != policy.RequestStream {
		t.Fatal("Stream(num)")
	}
	a.Complete()
	b, _ := s.NewStream([]string{"1"}, [32]byte{1}) // the same request again
	if got, ok := s.StreamByKey([32]byte{1}); !ok || got.Num() != b.Num() {
		t.Fatal("StreamByKey must find the latest stream of a request")
	}
	if s.NextStream() != 3 {
		t.Fatalf("NextStream = %d", s.NextStream())
	}
}
