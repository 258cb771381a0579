package policy

import (
	"math"
	"net/http"
	"testing"
)

// FuzzDecideResume feeds Authorize and DecideResume arbitrary observations
// and checks the security and liveness invariants of the decision table on
// every answer:
//
//   - it never panics, and every kind has a name (metrics label);
//   - nothing is replayed or followed (Noop, Replay, Gap from a log) unless
//     the request names a session the proxy holds, passes Authorize, and the
//     cursor is an ID the proxy minted for that session naming one of its
//     streams;
//   - Replay starts at the cursor's successor, inside the retained window
//     (From >= Floor, From <= Head): never below the floor, never from head;
//   - a gap on a held stream happens only when seq+1 < Floor, and moves the
//     client to the floor;
//   - an error goes only to a request whose answer the client cannot get;
//   - Reject answers only 400 (403 is Authorize's), with a detail;
//   - a cursor the proxy did not mint never adopts a session.
//
// Inputs are bounded by what a real log can present: Head < 2^63 (it
// counts appended events; below 2^63 here), Floor <= Head+1 (Head+1 when nothing is
// retained), answers <= Head.
func FuzzDecideResume(f *testing.F) {
	type seed struct {
		hdr, known, remembered, credOK bool
		sessEpoch                      string
		nextStream                     uint32
		valid, minted                  bool
		curEpoch                       string
		curStream                      uint32
		curSeq                         uint64
		hasStream                      bool
		kind, state                    uint8
		floor, head, answered          uint64
		pastReason                     string
		hasPastStream                  bool
	}
	const e = "k3j9x2qa"
	for _, s := range []seed{
		{true, true, false, true, e, 5, true, true, e, 3, 7, true, 0, 0, 5, 10, 0, "", false},               // replay
		{true, true, false, true, e, 5, true, true, e, 3, 10, true, 0, 0, 5, 10, 0, "", false},              // noop at head
		{true, true, false, true, e, 5, true, true, e, 3, 10, true, 0, 1, 5, 10, 10, "", false},             // ended
		{true, true, false, true, e, 5, true, true, e, 3, 2, true, 0, 1, 5, 10, 8, "", false},               // gap, response retained
		{true, true, false, true, e, 5, true, true, e, 3, 2, true, 0, 2, 5, 10, 3, "", false},               // gap, response lost
		{true, true, false, true, e, 5, true, true, e, 0, 0, true, 1, 0, 4, 9, 0, "", false},                // gap, standalone
		{true, true, false, true, e, 5, true, true, e, 3, 11, true, 0, 0, 5, 10, 0, "", false},              // ahead of head
		{true, true, false, false, e, 5, true, true, e, 3, 7, true, 0, 0, 5, 10, 0, "", false},              // credentials differ
		{true, true, false, true, e, 5, true, false, "aaaaaaaa", 3, 7, true, 0, 0, 5, 10, 0, "", false},     // foreign epoch
		{true, true, false, true, e, 5, true, true, "vq2xa7ab", 3, 7, false, 0, 0, 0, 0, 0, "purged", true}, // earlier epoch
		{true, true, false, true, e, 5, true, true, e, 2, 1, false, 0, 0, 0, 0, 0, "", false},               // retired stream
		{true, true, false, true, e, 5, true, true, e, 9, 1, false, 0, 0, 0, 0, 0, "", false},               // no such stream
		{true, true, false, true, e, 5, false, false, "", 0, 0, true, 0, 0, 5, 10, 0, "", false},            // malformed
		{true, false, true, false, "", 0, true, true, e, 0, 7, false, 0, 0, 0, 0, 0, "expired", false},      // tombstone, other creds
		{true, false, true, true, "", 0, true, true, e, 0, 7, false, 0, 0, 0, 0, 0, "deleted", false},       // tombstone adopt
		{true, false, true, true, "", 0, true, true, e, 3, 7, false, 0, 0, 0, 9, 8, "purged", true},         // tombstone, request stream
		{true, false, false, true, "", 0, true, true, e, 3, 7, false, 0, 0, 0, 0, 0, "", false},             // proxy restarted: hold
		{true, false, false, true, "", 0, true, false, e, 0, 7, false, 0, 0, 0, 0, 0, "", false},            // made-up epoch: pass through
		{false, true, false, true, e, 5, true, true, e, 3, 7, true, 0, 0, 5, 10, 0, "", false},              // no session header
		{true, true, false, true, e, 5, true, true, e, 3, math.MaxUint64 - 1, true, 0, 0, 1, math.MaxUint64 - 1, 0, "", false},
		{true, true, false, true, e, 5, true, true, e, 3, 0, true, 0, 1, math.MaxUint64 - 1, math.MaxUint64 - 2, 0, "", false},
		{true, true, false, true, "", 0, true, true, "", 0, 0, true, 200, 200, 0, 0, 0, "", false}, // empty epochs, odd enums
	} {
		f.Add(s.hdr, s.known, s.remembered, s.credOK, s.sessEpoch, s.nextStream, s.valid, s.minted, s.curEpoch, s.curStream,
			s.curSeq, s.hasStream, s.kind, s.state, s.floor, s.head, s.answered, s.pastReason, s.hasPastStream)
	}
	f.Fuzz(func(t *testing.T, hdr, known, remembered, credOK bool, sessEpoch string, nextStream uint32, valid, minted bool,
		curEpoch string, curStream uint32, curSeq uint64, hasStream bool, kind, state uint8, floor, head, answered uint64,
		pastReason string, hasPastStream bool) {
		if head >= math.MaxInt64 {
			head = math.MaxInt64 - 1 // a log counts its events; Lost is an int64
		}
		if floor > head+1 {
			floor = head + 1
		}
		if answered > head {
			answered = head
		}
		access := Access{Named: hdr, Remembered: known || remembered, IdentityMatch: credOK, Kind: ReadsLog}
		in := ResumeInput{
			SessionHeader: hdr,
			Session:       SessionView{Known: known, Epoch: sessEpoch, NextStream: nextStream},
			Cursor:        Cursor{Valid: valid, Minted: valid && minted, Epoch: curEpoch, Stream: curStream, Seq: curSeq},
		}
		if hasStream {
			in.Stream = &StreamView{Kind: RequestStream, State: StreamState(state % 3),
				Floor: floor, Head: head, Requests: []RequestView{{ID: "1", AnsweredAt: answered}}}
			if curStream == StandaloneNum { // the standalone stream is one log for the session's life
				in.Stream = &StreamView{Kind: StandaloneStream, Floor: floor, Head: head}
			}
		}
		if pastReason != "" {
			in.Past = &PastView{Reason: Reason(pastReason)}
			if hasPastStream {
				in.Past.Stream = &StreamView{Head: head, Requests: []RequestView{{ID: "1", AnsweredAt: answered}}}
			}
		}
		if Authorize(access) != Allow {
			if !hdr || !access.Remembered || credOK {
				t.Fatalf("Authorize refused %+v", access)
			}
			return // 403: DecideResume is never asked
		}
		d := DecideResume(in)
		checkResumeInvariants(t, in, d)
	})
}

func checkResumeInvariants(t *testing.T, in ResumeInput, d Resume) {
	t.Helper()
	if d.Kind > Ended {
		t.Fatalf("unknown kind %d for %+v", d.Kind, in)
	}
	_ = d.Kind.String() // must not panic: it labels a metric
	fail := func(why string) { t.Fatalf("%s: %+v -> %+v", why, in, d) }

	if !in.SessionHeader && d.Kind != PassThrough {
		fail("without Mcp-Session-Id the request must pass through")
	}
	c, st := in.Cursor, in.Stream
	switch d.Kind {
	case Reject:
		if d.Status != http.StatusBadRequest || d.Detail == "" {
			fail("reject must be 400 with a detail for the error body")
		}
	case Adopt:
		if in.Session.Known || !c.Minted || c.Stream != StandaloneNum || d.Reason == "" {
			fail("adopt needs an unknown session, a cursor minted for it on the standalone stream, and a reason")
		}
	case Noop, Replay:
		switch {
		case !in.Session.Known || !c.Minted || c.Epoch != in.Session.Epoch:
			fail("followed a cursor that is not of the held session's epoch")
		case st == nil:
			fail("followed a stream the session does not have")
		}
	case Gap:
		if !c.Minted {
			fail("a gap for a cursor the proxy did not mint")
		}
		if d.Reason == "" {
			fail("gap without a reason")
		}
	case PassThrough:
		if in.SessionHeader && in.Session.Known {
			fail("a held session's resume passed through")
		}
		if in.SessionHeader && c.Minted && (in.Past == nil || in.Past.Reason != ReasonDeleted) {
			fail("a cursor the proxy minted passed through, though its session was not deleted")
		}
	}
	if !c.Minted || c.Epoch != in.Session.Epoch || !in.Session.Known || st == nil {
		return
	}
	switch d.Kind {
	case Noop:
		if c.Seq != st.Head || d.From != c.Seq+1 || st.State != Live {
			fail("noop only at the head of a live stream, continuing after it")
		}
	case Ended:
		if c.Seq != st.Head || st.State == Live {
			fail("ended only at the head of an ended stream")
		}
	case Replay:
		if d.From != c.Seq+1 || d.From < st.Floor || d.From > st.Head {
			fail("replay must start right after the cursor, inside [Floor, Head]")
		}
	case Gap:
		if c.Seq+1 >= st.Floor {
			fail("gap although the cursor's successor is retained")
		}
		if d.From != st.Floor || d.Lost != int64(st.Floor-1-c.Seq) {
			fail("gap must move the client to the floor and count what was lost")
		}
		for _, id := range d.LostIDs {
			for _, r := range st.Requests {
				if r.ID == id && (r.AnsweredAt == 0 || r.AnsweredAt >= st.Floor || r.AnsweredAt <= c.Seq) {
					fail("an error for a request whose answer is retained, still to come, or already with the client")
				}
			}
		}
		if st.Kind == StandaloneStream && (d.Then != ThenReplay || len(d.LostIDs) > 0) {
			fail("a standalone stream's gap must continue")
		}
	}
	// A cursor inside a held stream is never rejected.
	if c.Seq <= st.Head && d.Kind == Reject {
		fail("a cursor inside the stream was rejected")
	}
}
