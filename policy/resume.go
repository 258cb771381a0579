package policy

import "net/http"

// Cursor is a parsed Last-Event-ID. Valid is false when the header does not
// have the proxy's ID shape.
type Cursor struct {
	Valid  bool
	Epoch  string
	Stream uint32
	Seq    uint64
}

// SessionView is what the resume decision needs to know about the session
// named by Mcp-Session-Id.
type SessionView struct {
	Known        bool   // the proxy holds the session
	Epoch        string // its epoch, when known
	CredentialOK bool   // the request's credential fingerprint matches the session's (or the tombstone's)
	Tombstoned   bool   // not known, but recently expired or deleted here
	TombReason   Reason // why, when Tombstoned
	TombEpoch    string // the ended session's epoch, when Tombstoned
}

// StreamView is what the resume decision needs to know about the stream the
// cursor names. Floor is the lowest retained seq (Head+1 when none is
// retained); ResponseSeq is the seq of the final JSON-RPC response, 0 if none.
type StreamView struct {
	Kind        StreamKind
	State       StreamState
	Floor, Head uint64
	ResponseSeq uint64
}

// ResumeInput is one GET with a Last-Event-ID, as observed.
type ResumeInput struct {
	SessionHeader bool        // the request carries Mcp-Session-Id
	Session       SessionView // the session it names
	Cursor        Cursor
	Stream        *StreamView // the session's stream Cursor.Stream names; nil if none
}

// ResumeKind is the row of the decision table that applied.
type ResumeKind uint8

const (
	PassThrough ResumeKind = iota // not ours: forward unchanged
	Reject                        // answer Status with a JSON-RPC error
	Noop                          // cursor at head: replay nothing, follow live
	Replay                        // replay From.., then follow live (or end)
	Gap                           // events below the floor are gone: signal, then Then
	Adopt                         // unknown session, our ID: take the session over, signal a gap
)

func (k ResumeKind) String() string {
	return [...]string{"pass_through", "rejected", "noop", "replayed", "gap", "adopted"}[k]
}

// GapThen is what follows the gap signal.
type GapThen uint8

const (
	ThenReplay GapThen = iota // replay from the floor: the final response is retained or still to come
	ThenError                 // the final response is lost: a JSON-RPC error for the pending request, then end
	ThenLive                  // standalone stream: a warning notification, then follow live
)

// Resume is the answer to one resume.
type Resume struct {
	Kind   ResumeKind
	Status int    // for Reject
	Detail string // for Reject: what was wrong, for the error body and logs
	From   uint64 // first seq to send, for Noop, Replay and Gap
	Reason Reason // for Gap and Adopt
	Lost   uint64 // for Gap: events between the cursor and the floor
	Then   GapThen
}

// DecideResume answers a GET carrying Last-Event-ID; each branch is one row of
// the design's decision table (design.md §5).
func DecideResume(in ResumeInput) Resume {
	if !in.SessionHeader {
		return Resume{Kind: PassThrough}
	}
	s := in.Session
	if !s.Known {
		switch {
		case !in.Cursor.Valid:
			return Resume{Kind: PassThrough}
		case s.Tombstoned && !s.CredentialOK:
			return reject(http.StatusForbidden, "credentials differ from the session's")
		case s.Tombstoned && s.TombEpoch != "" && in.Cursor.Epoch != s.TombEpoch:
			return reject(http.StatusBadRequest, "Last-Event-ID belongs to another session")
		case s.Tombstoned:
			return Resume{Kind: Adopt, Reason: s.TombReason}
		default:
			return Resume{Kind: Adopt, Reason: ReasonProxyRestarted}
		}
	}
	if !s.CredentialOK {
		return reject(http.StatusForbidden, "credentials differ from the session's")
	}
	c := in.Cursor
	switch {
	case !c.Valid:
		return reject(http.StatusBadRequest, "Last-Event-ID is not an event ID of this proxy")
	case c.Epoch != s.Epoch:
		return reject(http.StatusBadRequest, "Last-Event-ID belongs to another session")
	case in.Stream == nil:
		return reject(http.StatusBadRequest, "Last-Event-ID names no stream of this session")
	}
	st := in.Stream
	switch {
	case c.Seq > st.Head:
		return reject(http.StatusBadRequest, "Last-Event-ID is ahead of the stream")
	case c.Seq == st.Head:
		return Resume{Kind: Noop, From: c.Seq + 1}
	case c.Seq+1 >= st.Floor:
		return Resume{Kind: Replay, From: c.Seq + 1}
	}
	g := Resume{Kind: Gap, From: st.Floor, Reason: ReasonEvicted, Lost: st.Floor - 1 - c.Seq}
	switch {
	case st.Kind == StandaloneStream:
		g.Then = ThenLive
	case st.ResponseSeq >= st.Floor, st.ResponseSeq == 0 && st.State == Live:
		g.Then = ThenReplay
	default:
		g.Then = ThenError
	}
	return g
}

func reject(status int, detail string) Resume {
	return Resume{Kind: Reject, Status: status, Detail: detail}
}
