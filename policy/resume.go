package policy

import "net/http"

// StandaloneNum is the stream number of a session's standalone GET stream;
// request streams are numbered from 1.
const StandaloneNum uint32 = 0

// Cursor is a parsed Last-Event-ID.
type Cursor struct {
	Valid  bool // it has the proxy's ID shape
	Minted bool // its epoch was minted by this proxy for the session named (in any incarnation)
	Epoch  string
	Stream uint32
	Seq    uint64
}

// SessionView is what the resume decision needs to know about the session
// named by Mcp-Session-Id.
type SessionView struct {
	Known bool   // the proxy holds the session
	Epoch string // its current epoch, when known
	// NextStream is the number the session's next request stream will get:
	// request streams 1..NextStream-1 existed, even if retired since.
	NextStream uint32
}

// RequestView is one JSON-RPC request a stream answers.
type RequestView struct {
	ID         string // canonical JSON of the request id
	AnsweredAt uint64 // seq of the event that answered it (a response or the proxy's error); 0 while pending
}

// StreamView is what the resume decision needs to know about a stream.
// Floor is the lowest retained seq (Head+1 when none is retained).
type StreamView struct {
	Kind        StreamKind
	State       StreamState
	Floor, Head uint64
	Requests    []RequestView
}

// PastView is what is remembered of an earlier incarnation of the session:
// it ended here (expired, purged, deleted) and the client's cursor names it.
type PastView struct {
	Reason Reason
	// Stream is the cursor's stream in that incarnation, if remembered.
	Stream *StreamView
}

// ResumeInput is one GET with a Last-Event-ID, as observed.
type ResumeInput struct {
	SessionHeader bool        // the request carries Mcp-Session-Id
	Session       SessionView // the session it names
	Cursor        Cursor
	// Stream is the stream a client resuming this cursor reads: the held
	// session's stream with the cursor's number, or, for a cursor on the
	// standalone stream of an earlier incarnation, the current standalone
	// stream. Nil if there is none.
	Stream *StreamView
	// Past is the earlier incarnation the cursor's epoch names, if remembered
	// (for a session not held: its tombstone).
	Past *PastView
}

// ResumeKind is the row of the decision table that applied.
type ResumeKind uint8

const (
	PassThrough ResumeKind = iota // not ours: forward unchanged
	Reject                        // answer Status with a JSON-RPC error
	Noop                          // cursor at head of a live stream: replay nothing, follow live
	Replay                        // replay From.., then follow live (or end)
	Gap                           // events are gone: signal, then Then
	Adopt                         // session not held, our cursor on its standalone stream: take the session over, signal a gap
	Ended                         // cursor at head of an ended stream: 204, nothing more will come
)

func (k ResumeKind) String() string {
	return [...]string{"pass_through", "rejected", "noop", "replayed", "gap", "adopted", "ended"}[k]
}

// GapThen is what follows the gap signal (and the errors for LostIDs).
type GapThen uint8

const (
	ThenReplay GapThen = iota // replay from From, then follow live or end with the stream
	ThenEnd                   // nothing of the stream is left to send: end the response
	ThenHold                  // nothing is known of the stream (a restart lost it): keep the response open, send nothing
)

// Resume is the answer to one resume.
type Resume struct {
	Kind   ResumeKind
	Status int    // for Reject
	Detail string // for Reject: what was wrong, for the error body and logs
	From   uint64 // first seq to send, for Noop, Replay and Gap; the gap event's ID names From-1
	Reason Reason // for Gap and Adopt
	Lost   int64  // for Gap: events between the cursor and the floor; -1 when unknown
	// LostIDs are the requests whose answers are gone: each gets a JSON-RPC
	// error, so the client's call fails now instead of waiting forever.
	LostIDs []string
	Then    GapThen
}

// DecideResume answers a GET carrying Last-Event-ID; each branch is one row of
// the decision table in the README ("Resume decisions"). It is asked only
// about requests Authorize let through.
func DecideResume(in ResumeInput) Resume {
	if !in.SessionHeader {
		return Resume{Kind: PassThrough}
	}
	s, c := in.Session, in.Cursor
	if !s.Known {
		if !c.Valid || !c.Minted {
			return Resume{Kind: PassThrough} // not a cursor of ours: the upstream answers it
		}
		if in.Past != nil && in.Past.Reason == ReasonDeleted {
			// The session was deleted (by its client, or the upstream's 404):
			// the upstream's answer (404: re-initialize) is the true one.
			return Resume{Kind: PassThrough}
		}
		reason := ReasonProxyRestarted
		if in.Past != nil {
			reason = in.Past.Reason
		}
		if c.Stream == StandaloneNum {
			return Resume{Kind: Adopt, Reason: reason}
		}
		return pastRequestGap(in.Past, reason, c.Seq)
	}
	switch {
	case !c.Valid:
		return reject(http.StatusBadRequest, "Last-Event-ID is not an event ID of this proxy")
	case !c.Minted:
		return reject(http.StatusBadRequest, "Last-Event-ID belongs to another session")
	case c.Epoch != s.Epoch:
		// An earlier incarnation of this session: nothing of it is retained.
		reason := ReasonProxyRestarted
		if in.Past != nil {
			reason = in.Past.Reason
		}
		if c.Stream == StandaloneNum && in.Stream != nil {
			return Resume{Kind: Gap, Reason: reason, Lost: -1, From: in.Stream.Floor, Then: ThenReplay}
		}
		return pastRequestGap(in.Past, reason, c.Seq)
	case in.Stream == nil && c.Stream != StandaloneNum && c.Stream < s.NextStream:
		// A request stream that ended long ago and was retired with its
		// events: which requests it answered is forgotten too.
		return Resume{Kind: Gap, Reason: ReasonEvicted, Lost: -1, Then: ThenHold}
	case in.Stream == nil:
		return reject(http.StatusBadRequest, "Last-Event-ID names no stream of this session")
	}
	st := in.Stream
	switch {
	case c.Seq > st.Head:
		return reject(http.StatusBadRequest, "Last-Event-ID is ahead of the stream")
	case c.Seq == st.Head && st.State != Live:
		return Resume{Kind: Ended}
	case c.Seq == st.Head:
		return Resume{Kind: Noop, From: c.Seq + 1}
	case c.Seq+1 >= st.Floor:
		return Resume{Kind: Replay, From: c.Seq + 1}
	}
	g := Resume{Kind: Gap, From: st.Floor, Reason: ReasonEvicted, Lost: int64(st.Floor - 1 - c.Seq), Then: ThenReplay}
	for _, r := range st.Requests {
		if r.AnsweredAt > c.Seq && r.AnsweredAt < st.Floor {
			g.LostIDs = append(g.LostIDs, r.ID) // answered, but the answer is gone
		}
	}
	if st.State != Live && st.Floor > st.Head {
		g.Then = ThenEnd
	}
	return g
}

// pastRequestGap answers a cursor on a request stream of an incarnation that
// ended here. Every request the client has no answer for gets an error, and
// the gap moves the client's cursor to Head+1, past the stream's end and the
// errors, so a client that reconnects anyway (the TypeScript SDK 1.x does
// after an error response) next gets Ended. If the proxy remembers nothing
// of the stream it cannot name the requests, and holds the response open
// instead of ending it, which would only make the client reconnect.
func pastRequestGap(past *PastView, reason Reason, seq uint64) Resume {
	g := Resume{Kind: Gap, Reason: reason, Lost: -1, Then: ThenHold}
	if past == nil || past.Stream == nil {
		return g
	}
	switch {
	case seq == past.Stream.Head+1:
		return Resume{Kind: Ended} // the cursor this gap hands out: the client has its answer already
	case seq > past.Stream.Head+1:
		return reject(http.StatusBadRequest, "Last-Event-ID is ahead of the stream")
	}
	for _, r := range past.Stream.Requests {
		if r.AnsweredAt == 0 || r.AnsweredAt > seq {
			g.LostIDs = append(g.LostIDs, r.ID)
		}
	}
	if len(g.LostIDs) == 0 {
		return Resume{Kind: Ended} // the client has every answer
	}
	g.Then, g.From = ThenEnd, past.Stream.Head+2
	return g
}

func reject(status int, detail string) Resume {
	return Resume{Kind: Reject, Status: status, Detail: detail}
}
