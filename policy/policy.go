// Package policy holds mcp-resume's rules as pure functions: whether a
// session or stream may be created, whether an event may be appended, how a
// resume is answered, whether an event may be evicted. No I/O, no clocks, no
// locks: callers pass in what they observed. Each rule lives here once;
// package buffer keeps the state and asks, package resume (the engine)
// speaks HTTP and asks. upstream.go reads upstream statuses.
package policy

import "time"

// Reason says why events were lost or a stream failed. The values appear on
// the wire (gap events), in logs and in metric labels.
type Reason string

const (
	ReasonEvicted        Reason = "evicted"         // the cursor is below the retained floor
	ReasonExpired        Reason = "expired"         // the session expired at the proxy
	ReasonStalled        Reason = "stalled"         // the log stayed full past stall_timeout
	ReasonProxyRestarted Reason = "proxy_restarted" // the proxy no longer knows the session
	ReasonUpstreamFailed Reason = "upstream_failed" // the upstream response broke off or refused to go on
	ReasonUpstreamClosed Reason = "upstream_closed" // the upstream ended the stream early and gave no way to resume it
	ReasonTooLarge       Reason = "too_large"       // an upstream event exceeded max_event_bytes
	ReasonDeleted        Reason = "deleted"         // the session was deleted (DELETE, or the upstream's 404)
	ReasonPurged         Reason = "purged"          // an operator purged the session through the admin API
)

// Reasons lists every reason, for metrics that expose them all.
var Reasons = []Reason{ReasonEvicted, ReasonExpired, ReasonStalled, ReasonProxyRestarted,
	ReasonUpstreamFailed, ReasonUpstreamClosed, ReasonTooLarge, ReasonDeleted, ReasonPurged}

// StreamState is the lifecycle of one retention log.
type StreamState uint8

const (
	Live     StreamState = iota // the upstream response is (or may be) still producing
	Complete                    // every request the stream answers got its response
	Failed                      // the stream ended abnormally; see its Reason
)

func (s StreamState) String() string {
	return [...]string{"live", "complete", "failed"}[s]
}

// StreamKind tells the session's standalone GET stream from POST request streams.
type StreamKind uint8

const (
	RequestStream    StreamKind = iota // the SSE response to one POST
	StandaloneStream                   // the session's GET stream: one log for the session's life
)

func (k StreamKind) String() string {
	return [...]string{"request", "standalone"}[k]
}

// ---- admission -------------------------------------------------------------

// SessionOrigin is how the proxy came to hold a session.
type SessionOrigin uint8

const (
	// Initialized: the proxy saw the initialize exchange.
	Initialized SessionOrigin = iota
	// Resumed: adopted on a resume whose Last-Event-ID carries an epoch the
	// proxy minted for that session ID (after a restart, expiry or purge).
	Resumed
	// Adopted: adopted on a POST for a session the proxy did not hold. Nothing
	// proves the proxy ever knew it (a stateless upstream accepts any ID), so
	// such sessions have their own small share and never crowd out the others.
	Adopted
	// Untapped: a session whose protocol version has no resumable streams
	// (2026-07-28, or unknown). It is remembered only so its traffic is never
	// tapped; it holds nothing and has a share of its own.
	Untapped
)

func (o SessionOrigin) String() string {
	return [...]string{"initialized", "resumed", "adopted", "untapped"}[o]
}

// AdoptedFraction of max_sessions may be sessions adopted on a POST alone.
const AdoptedFraction = 4 // 1/4

// SessionCounts is what session admission needs to know.
type SessionCounts struct {
	Sessions    int // held sessions that are Initialized or Resumed
	Adopted     int // held sessions that are Adopted
	Untapped    int // held sessions that are Untapped
	MaxSessions int
}

// AdmitSession decides whether a session of the given origin may be created.
// Initialized and Resumed sessions share max_sessions; Adopted ones have
// max_sessions/4 of their own, so requests naming made-up session IDs can
// neither lock initialize out nor take more than that; Untapped ones, which
// hold nothing, have max_sessions of their own.
func AdmitSession(o SessionOrigin, c SessionCounts) bool {
	switch {
	case c.MaxSessions <= 0:
		return true
	case o == Adopted:
		return c.Adopted < max(c.MaxSessions/AdoptedFraction, 1)
	case o == Untapped:
		return c.Untapped < c.MaxSessions
	}
	return c.Sessions < c.MaxSessions
}

// AdmitStream decides whether a session with live request streams (calls
// running now) may start another. The standalone stream is not counted.
func AdmitStream(live, maxStreams int) bool {
	return maxStreams <= 0 || live < maxStreams
}

// ---- enqueue -------------------------------------------------------------

// Budget is the byte accounting an appender sees at one instant. Max values
// are the configured bounds.
type Budget struct {
	StreamBytes, StreamMax   int64
	SessionBytes, SessionMax int64
	TotalBytes, TotalMax     int64
	// Attached: a client reads the stream now. Only such streams may use the
	// reserve (the last 1/ReserveFraction of TotalMax), so streams whose
	// clients left can never take the room clients that are there need.
	Attached bool
}

// AppendAction is the enqueue decision.
type AppendAction uint8

const (
	Append       AppendAction = iota // there is room: take the bytes
	Block                            // wait for room: stop reading the upstream
	FailStalled                      // waited past the stall timeout without the client making progress
	FailTooLarge                     // can never fit, however long we wait
)

// ReserveFraction of the total budget is kept for streams a client is reading.
const ReserveFraction = 4 // 1/4 of max_total_bytes

// DecideAppend decides whether size more bytes may enter a log now. An event
// that does not fit blocks (backpressure); it fails only once its stream has
// been stalled for stallTimeout. Stalled counts the time the append has waited
// while its client made no progress: the caller keeps it at zero while the
// client has everything retained (a reader at full speed waiting for the
// resume window to release room is being slowed down, not stalled). Nothing is
// ever evicted to make room.
func DecideAppend(b Budget, size int64, stalled, stallTimeout time.Duration) AppendAction {
	if size > b.StreamMax || size > b.SessionMax || size > b.TotalMax {
		return FailTooLarge
	}
	if fits(b, size) {
		return Append
	}
	if stalled >= stallTimeout {
		return FailStalled
	}
	return Block
}

func fits(b Budget, size int64) bool {
	if b.StreamBytes+size > b.StreamMax || b.SessionBytes+size > b.SessionMax {
		return false
	}
	limit := b.TotalMax
	if !b.Attached {
		limit -= b.TotalMax / ReserveFraction
	}
	return b.TotalBytes+size <= limit
}

// ---- eviction -----------------------------------------------------------

// EventView is what eviction needs to know about one retained event.
type EventView struct {
	Seq            uint64
	Acked          uint64    // the stream's acknowledged position
	DeliveredAt    time.Time // when written and flushed to a client; zero if not (or no longer) delivered
	ReaderNext     uint64    // the next seq the attached reader will read; 0 if none is attached
	SessionDeleted bool
}

// Evictable reports whether an event may leave its log: its session is gone,
// or no attached reader still has to read it and it was acknowledged or
// delivered at least window ago. Nothing else evicts.
func Evictable(e EventView, now time.Time, window time.Duration) bool {
	switch {
	case e.SessionDeleted:
		return true
	case e.ReaderNext != 0 && e.Seq >= e.ReaderNext:
		return false // a connected client is about to read it
	case e.Seq <= e.Acked:
		return true
	case e.DeliveredAt.IsZero():
		return false
	default:
		return now.Sub(e.DeliveredAt) >= window
	}
}

// ---- following the upstream ---------------------------------------------

// UpstreamEvent is what the follower knows of one upstream event with an
// ID when deciding whether it is a repeat.
type UpstreamEvent struct {
	HasID bool
	// Resumed: the response it came in answers a GET the proxy sent with
	// the upstream's own Last-Event-ID (a reconnect), not the client's
	// request nor a fresh GET.
	Resumed bool
	// TakenEarlier: the stream took an event with this ID from an earlier
	// upstream response (before that reconnect).
	TakenEarlier bool
	// SameContent: that event had the same type and data.
	SameContent bool
}

// UpstreamRepeat reports whether the follower drops an upstream event as a
// repeat of one the stream has. Only a replay can repeat: the upstream
// resends events after the Last-Event-ID the proxy sent, and some resend
// that event itself or a few before it. Within one response nothing is a
// repeat, however the upstream numbers its events (an ID used twice, IDs
// that restart on each connection): dropping there loses events the
// upstream sent once. Nor is an event with a taken ID but other content:
// an upstream whose IDs restart on each connection reuses IDs for new
// events. The IDs break the spec's uniqueness rule, but plain
// reverse_proxy would deliver them, so the proxy does.
func UpstreamRepeat(e UpstreamEvent) bool {
	return e.HasID && e.Resumed && e.TakenEarlier && e.SameContent
}
