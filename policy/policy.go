// Package policy holds mcp-resume's decisions as pure functions: whether an
// event may be appended, how a resume is answered, whether an event may be
// evicted. No I/O, no clocks, no locks: callers pass in what they observed,
// and each rule of the design lives here exactly once.
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
	ReasonUpstreamFailed Reason = "upstream_failed" // the upstream response broke off
	ReasonTooLarge       Reason = "too_large"       // an upstream event exceeded max_event_bytes
	ReasonDeleted        Reason = "deleted"         // the session was deleted (DELETE, or the upstream's 404)
	ReasonPurged         Reason = "purged"          // an operator purged the session through the admin API
)

// StreamState is the lifecycle of one retention log.
type StreamState uint8

const (
	Live     StreamState = iota // the upstream response is (or may be) still producing
	Complete                    // the upstream ended normally
	Failed                      // the stream ended abnormally; see its Reason
)

func (s StreamState) String() string {
	return [...]string{"live", "complete", "failed"}[s]
}

// StreamKind tells the session's standalone GET stream from POST request streams.
type StreamKind uint8

const (
	RequestStream    StreamKind = iota // the SSE response to one POST
	StandaloneStream                   // the session's GET stream
)

func (k StreamKind) String() string {
	return [...]string{"request", "standalone"}[k]
}

// ---- enqueue -------------------------------------------------------------

// Budget is the byte accounting an appender sees at one instant. Max values
// are the configured bounds; Sessions counts the sessions holding bytes.
type Budget struct {
	StreamBytes, StreamMax   int64
	SessionBytes, SessionMax int64
	TotalBytes, TotalMax     int64
	Sessions                 int
}

// AppendAction is the enqueue decision.
type AppendAction uint8

const (
	Append       AppendAction = iota // there is room: take the bytes
	Block                            // wait for room: stop reading the upstream
	FailStalled                      // waited past the stall timeout
	FailTooLarge                     // can never fit, however long we wait
)

// ReserveFraction of the total budget is kept for sessions below their fair
// share, so sessions that stall at their own bound cannot starve the others.
const ReserveFraction = 4 // 1/4 of max_total_bytes

// DecideAppend decides whether size more bytes may enter a log now. An event
// that does not fit blocks (backpressure) until stallTimeout has passed, then
// fails; nothing is ever evicted to make room.
func DecideAppend(b Budget, size int64, stalledFor, stallTimeout time.Duration) AppendAction {
	if size > b.StreamMax || size > b.SessionMax || size > b.TotalMax {
		return FailTooLarge
	}
	if fits(b, size) {
		return Append
	}
	if stalledFor >= stallTimeout {
		return FailStalled
	}
	return Block
}

func fits(b Budget, size int64) bool {
	if b.StreamBytes+size > b.StreamMax || b.SessionBytes+size > b.SessionMax {
		return false
	}
	total := b.TotalBytes + size
	if total > b.TotalMax {
		return false
	}
	sessions := int64(max(b.Sessions, 1))
	if b.SessionBytes+size <= b.TotalMax/sessions {
		return true // within its fair share: may use the reserve too
	}
	return total <= b.TotalMax-b.TotalMax/ReserveFraction
}

// ---- eviction -----------------------------------------------------------

// EventView is what eviction needs to know about one retained event.
type EventView struct {
	Seq            uint64
	Acked          uint64    // the stream's acknowledged position
	DeliveredAt    time.Time // when written and flushed to a client; zero if not (or no longer) delivered
	SessionDeleted bool
}

// Evictable reports whether an event may leave its log: it was acknowledged,
// or its session is gone, or it was delivered at least window ago (no resume
// can still need it). Nothing else evicts.
func Evictable(e EventView, now time.Time, window time.Duration) bool {
	switch {
	case e.SessionDeleted, e.Seq <= e.Acked:
		return true
	case e.DeliveredAt.IsZero():
		return false
	default:
		return now.Sub(e.DeliveredAt) >= window
	}
}
