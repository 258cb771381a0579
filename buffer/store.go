// Package buffer keeps mcp-resume's per-session, per-stream retention logs.
//
// Every event that reaches a client goes through a log: Append assigns the
// event its sequence number (and so its ID) before any byte is written, and
// readers deliver from the log. A reader may start at any retained position
// and then follows live; since history and live are one sequence there is no
// seam at which an event could be lost or repeated.
//
// Append blocks while a byte bound is reached (backpressure); it never evicts
// to make room. Events leave a log only when policy.Evictable says so.
//
// The package knows nothing of HTTP or Caddy.
package buffer

import (
	"context"
	"errors"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/policy"
)

// Errors returned by stores, streams and readers.
var (
	ErrSessionExists   = errors.New("session already exists")
	ErrTooManySessions = errors.New("too many sessions")
	ErrTooManyStreams  = errors.New("too many streams in this session")
	ErrSessionGone     = errors.New("session is gone")
	ErrStreamEnded     = errors.New("stream has ended")
	ErrTakenOver       = errors.New("another connection took over the stream")
	ErrBelowFloor      = errors.New("reader position is below the retained floor")
	// ErrProducerGone ends a reader of a standalone stream that has caught up
	// while no upstream response feeds the stream: its client should
	// reconnect, which starts a new upstream GET.
	ErrProducerGone = errors.New("no upstream response feeds the stream")
)

// FromUndelivered, passed to Attach, starts at the first event never written
// to a client (for a client that reconnects without a Last-Event-ID).
const FromUndelivered uint64 = 0

// FailedError reports that a stream failed, and why. Appenders get it when
// their append failed the stream; readers get it at the end of a failed stream.
type FailedError struct{ Reason policy.Reason }

func (e *FailedError) Error() string { return "stream failed: " + string(e.Reason) }

// Limits bound what a store holds. Zero values are not defaults: callers
// (the Caddy module) fill in defaults and validate.
type Limits struct {
	MaxStreamBytes       int64
	MaxSessionBytes      int64
	MaxTotalBytes        int64
	MaxSessions          int
	MaxStreamsPerSession int           // live streams
	ResumeWindow         time.Duration // delivered events stay this long
	StallTimeout         time.Duration // a full log this long fails its stream
	SessionIdleTimeout   time.Duration // a session with no client this long expires
}

// SessionMeta is fixed when a session is created.
type SessionMeta struct {
	Version     string   // negotiated MCP protocol version
	Fingerprint [32]byte // keyed hash of the bound credential headers
}

// Tombstone remembers a session that ended here, so a late resume gets a
// precise answer.
type Tombstone struct {
	Epoch       string
	Fingerprint [32]byte
	Reason      policy.Reason
}

// Event is one retained event as a reader sees it. Data is immutable.
type Event struct {
	Seq  uint64
	Data []byte
}

// Store holds sessions. It is the seam for a shared store: callers use only
// these interfaces.
type Store interface {
	// NewSession registers a session under the upstream's session ID.
	NewSession(id string, meta SessionMeta) (Session, error)
	Session(id string) (Session, bool)
	Tombstone(id string) (Tombstone, bool)
	// Delete ends a session: its readers and appenders stop, its events go.
	Delete(id string, reason policy.Reason) bool
	Sessions() []SessionInfo
	SessionCount() int
	Stats() Stats
	Counters() *Counters
	SetLimits(Limits)
	Limits() Limits
	// Close ends every session. The store must not be used afterwards.
	Close()
}

// Session is one MCP session's logs.
type Session interface {
	ID() string
	Epoch() string
	Meta() SessionMeta
	// Context ends when the session ends; detached upstream reads use it.
	Context() context.Context
	NewStream(kind policy.StreamKind, requestIDs []string) (Stream, error)
	Stream(num uint32) (Stream, bool)
	// ActiveStreams counts live streams.
	ActiveStreams() int
	// Standalone returns the session's standalone GET stream, creating it on
	// first use, or anew if the previous one failed. It stays live across
	// upstream GETs.
	Standalone() (Stream, error)
	// Touch records client activity, which defers idle expiry.
	Touch()
	Info() SessionInfo
}

// Stream is one retention log.
type Stream interface {
	Num() uint32
	Kind() policy.StreamKind
	RequestIDs() []string
	// Append adds an event, blocking while the log is full. The returned seq
	// is the event's position; response marks the request's final response.
	Append(ctx context.Context, data []byte, response bool) (uint64, error)
	Complete()
	Fail(reason policy.Reason)
	View() policy.StreamView
	// Ack records that the client holds everything up to seq (a resume's
	// cursor): those events go, and later ones count as not delivered.
	Ack(seq uint64)
	// Attach returns a reader from seq from, taking the stream over from any
	// attached reader.
	Attach(from uint64) (Reader, error)
	// Resume answers a client's Last-Event-ID (its seq in this stream) in one
	// step, so eviction cannot move the floor between decision and replay:
	// decide sees the stream, and for Noop, Replay and Gap the cursor is
	// acknowledged and, unless the gap ends the stream, a reader attached at
	// the decision's From.
	Resume(cursor uint64, decide func(policy.StreamView) policy.Resume) (policy.Resume, Reader, error)
	// ClaimProducer marks an upstream response as feeding this stream; false
	// if one already does. ReleaseProducer undoes it.
	ClaimProducer() bool
	ReleaseProducer()
	Producing() bool
}

// Reader delivers a stream's events in order, from history then live.
type Reader interface {
	// Read returns the next events (at most cap(buf), in buf's array), blocking
	// until there is one. At the end it returns io.EOF (complete) or
	// *FailedError (failed).
	Read(ctx context.Context, buf []Event) ([]Event, error)
	// Delivered records that every event up to seq was written and flushed.
	Delivered(seq uint64)
	// Done is closed when the reader is taken over or its session ends.
	Done() <-chan struct{}
	Close()
}

// SessionInfo describes a session for operators; it carries no payloads.
type SessionInfo struct {
	ID           string       `json:"id"`
	Epoch        string       `json:"epoch"`
	Version      string       `json:"protocol_version"`
	Created      time.Time    `json:"created"`
	LastActivity time.Time    `json:"last_activity"`
	Connected    int          `json:"connected_clients"`
	Bytes        int64        `json:"retained_bytes"`
	Streams      []StreamInfo `json:"streams"`
}

// StreamInfo describes one stream for operators.
type StreamInfo struct {
	Num        uint32   `json:"stream"`
	Kind       string   `json:"kind"`
	State      string   `json:"state"`
	FailReason string   `json:"fail_reason,omitempty"`
	Floor      uint64   `json:"floor"`
	Head       uint64   `json:"head"`
	Acked      uint64   `json:"acked"`
	Bytes      int64    `json:"retained_bytes"`
	Connected  bool     `json:"connected"`
	Producing  bool     `json:"producing"`
	Stalled    bool     `json:"stalled"`
	RequestIDs []string `json:"request_ids,omitempty"`
}

// Stats is a point-in-time view of a store's gauges.
type Stats struct {
	Sessions       int
	Streams        int
	RetainedBytes  int64
	Connected      int
	Producing      int // streams an upstream response is feeding
	Detached       int // of those, streams no client is reading: the upstream is read for a client that left
	StalledStreams int
}
