package policy

import (
	"math"
	"net/http"
	"testing"
)

// FuzzDecideResume feeds DecideResume arbitrary observations and checks the
// security invariants of design.md §5 on every answer:
//
//   - it never panics, and every kind has a name (metrics label);
//   - nothing is replayed or followed (Noop, Replay, Gap) unless the request
//     names a session the proxy holds, the credentials match, and the cursor
//     is a valid ID of that session's epoch naming one of its streams;
//   - Replay starts at the cursor's successor, inside the retained window
//     (From >= Floor, From <= Head): never below the floor, never from head;
//   - Gap happens only when seq+1 < Floor, and moves the client to the floor;
//   - Reject answers only 400 or 403, with a detail for the error body;
//   - credentials that differ from a held (or tombstoned) session's are 403.
//
// Inputs are bounded by what a real log can present: Head < MaxUint64 (it
// counts appended events), Floor <= Head+1 (Head+1 when nothing is
// retained), ResponseSeq <= Head.
func FuzzDecideResume(f *testing.F) {
	type seed struct {
		hdr, known, credOK, tomb bool
		tombReason               string
		sessEpoch                string
		valid                    bool
		curEpoch                 string
		curStream                uint32
		curSeq                   uint64
		hasStream                bool
		kind, state              uint8
		floor, head, resp        uint64
	}
	const e = "k3j9x2qa"
	for _, s := range []seed{
		{true, true, true, false, "", e, true, e, 3, 7, true, 0, 0, 5, 10, 0},          // replay
		{true, true, true, false, "", e, true, e, 3, 10, true, 0, 0, 5, 10, 0},         // noop at head
		{true, true, true, false, "", e, true, e, 3, 2, true, 0, 1, 5, 10, 8},          // gap, response retained
		{true, true, true, false, "", e, true, e, 3, 2, true, 0, 2, 5, 10, 3},          // gap, response lost
		{true, true, true, false, "", e, true, e, 1, 0, true, 1, 0, 4, 9, 0},           // gap, standalone
		{true, true, true, false, "", e, true, e, 3, 11, true, 0, 0, 5, 10, 0},         // ahead of head
		{true, true, false, false, "", e, true, e, 3, 7, true, 0, 0, 5, 10, 0},         // credentials differ
		{true, true, true, false, "", e, true, "aaaaaaaa", 3, 7, true, 0, 0, 5, 10, 0}, // foreign epoch
		{true, true, true, false, "", e, true, e, 9, 1, false, 0, 0, 0, 0, 0},          // no such stream
		{true, true, true, false, "", e, false, "", 0, 0, true, 0, 0, 5, 10, 0},        // malformed
		{true, false, false, true, "expired", "", true, e, 3, 7, false, 0, 0, 0, 0, 0}, // tombstone, other creds
		{true, false, true, true, "deleted", "", true, e, 3, 7, false, 0, 0, 0, 0, 0},  // tombstone adopt
		{true, false, false, false, "", "", true, e, 3, 7, false, 0, 0, 0, 0, 0},       // proxy restarted
		{false, true, true, false, "", e, true, e, 3, 7, true, 0, 0, 5, 10, 0},         // no session header
		{true, true, true, false, "", e, true, e, 3, math.MaxUint64 - 1, true, 0, 0, 1, math.MaxUint64 - 1, 0},
		{true, true, true, false, "", e, true, e, 3, 0, true, 0, 1, math.MaxUint64 - 1, math.MaxUint64 - 2, 0},
		{true, true, true, false, "", "", true, "", 0, 0, true, 200, 200, 0, 0, 0}, // empty epochs, odd enums
	} {
		f.Add(s.hdr, s.known, s.credOK, s.tomb, s.tombReason, s.sessEpoch, s.valid, s.curEpoch, s.curStream, s.curSeq,
			s.hasStream, s.kind, s.state, s.floor, s.head, s.resp)
	}
	f.Fuzz(func(t *testing.T, hdr, known, credOK, tomb bool, tombReason, sessEpoch string, valid bool, curEpoch string,
		curStream uint32, curSeq uint64, hasStream bool, kind, state uint8, floor, head, resp uint64) {
		if head == math.MaxUint64 {
			head--
		}
		if floor > head+1 {
			floor = head + 1
		}
		if resp > head {
			resp = head
		}
		if tombReason == "" {
			tombReason = string(ReasonExpired) // a tombstone always records why
		}
		in := ResumeInput{
			SessionHeader: hdr,
			Session: SessionView{Known: known, Epoch: sessEpoch, CredentialOK: credOK,
				Tombstoned: tomb && !known, TombReason: Reason(tombReason)},
			Cursor: Cursor{Valid: valid, Epoch: curEpoch, Stream: curStream, Seq: curSeq},
		}
		if hasStream {
			in.Stream = &StreamView{Kind: StreamKind(kind % 2), State: StreamState(state % 3),
				Floor: floor, Head: head, ResponseSeq: resp}
		}
		d := DecideResume(in)
		checkResumeInvariants(t, in, d)
	})
}

func checkResumeInvariants(t *testing.T, in ResumeInput, d Resume) {
	t.Helper()
	if d.Kind > Adopt {
		t.Fatalf("unknown kind %d for %+v", d.Kind, in)
	}
	_ = d.Kind.String() // must not panic: it labels a metric
	fail := func(why string) { t.Fatalf("%s: %+v -> %+v", why, in, d) }

	if !in.SessionHeader && d.Kind != PassThrough {
		fail("without Mcp-Session-Id the request must pass through")
	}
	switch d.Kind {
	case Reject:
		if d.Status != http.StatusBadRequest && d.Status != http.StatusForbidden {
			fail("reject status must be 400 or 403")
		}
		if d.Detail == "" {
			fail("reject without a detail for the error body")
		}
	case Adopt:
		if in.Session.Known || !in.Cursor.Valid {
			fail("adopt needs an unknown session and a cursor in the proxy's format")
		}
		if in.Session.Tombstoned && !in.Session.CredentialOK {
			fail("adopted a tombstoned session with other credentials")
		}
		if d.Reason == "" {
			fail("adopt without a reason for the gap")
		}
	case Noop, Replay, Gap:
		switch {
		case !in.Session.Known:
			fail("followed a session the proxy does not hold")
		case !in.Session.CredentialOK:
			fail("followed a stream with other credentials")
		case !in.Cursor.Valid:
			fail("followed an invalid cursor")
		case in.Cursor.Epoch != in.Session.Epoch:
			fail("followed a cursor of another epoch")
		case in.Stream == nil:
			fail("followed a stream the session does not have")
		}
	}
	// Credentials that differ from a held session's are always 403, whatever
	// else is wrong; likewise for a tombstoned session with our ID.
	if in.SessionHeader && in.Session.Known && !in.Session.CredentialOK &&
		(d.Kind != Reject || d.Status != http.StatusForbidden) {
		fail("credential mismatch on a held session must be 403")
	}
	if in.SessionHeader && !in.Session.Known && in.Session.Tombstoned && !in.Session.CredentialOK && in.Cursor.Valid &&
		(d.Kind != Reject || d.Status != http.StatusForbidden) {
		fail("credential mismatch on a tombstoned session must be 403")
	}
	st, c := in.Stream, in.Cursor
	switch d.Kind {
	case Noop:
		if c.Seq != st.Head || d.From != c.Seq+1 {
			fail("noop only at head, continuing after it")
		}
	case Replay:
		if d.From != c.Seq+1 || d.From < st.Floor || d.From > st.Head {
			fail("replay must start right after the cursor, inside [Floor, Head]")
		}
	case Gap:
		if c.Seq+1 >= st.Floor {
			fail("gap although the cursor's successor is retained")
		}
		if d.From != st.Floor || d.Lost != st.Floor-1-c.Seq || d.Reason == "" {
			fail("gap must move the client to the floor and count what was lost")
		}
		if st.Kind == StandaloneStream && d.Then != ThenLive {
			fail("a standalone stream's gap must continue live")
		}
		if st.Kind == RequestStream && d.Then == ThenLive {
			fail("a request stream's gap must replay or answer the pending requests")
		}
		if d.Then == ThenReplay && st.ResponseSeq != 0 && st.ResponseSeq < st.Floor {
			fail("gap replays although the final response is evicted")
		}
	}
	// A valid cursor of the session's own epoch on a held session with the
	// right credentials is never rejected unless it names no stream or is
	// ahead of head.
	if in.SessionHeader && in.Session.Known && in.Session.CredentialOK && c.Valid && c.Epoch == in.Session.Epoch &&
		st != nil && c.Seq <= st.Head && d.Kind == Reject {
		fail("a cursor inside the stream was rejected")
	}
}
