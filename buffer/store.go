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
// Store, Session, Stream and Reader are the data path's seam between the
// resume engine and a retention engine: MemoryStore (this package) keeps
// everything in the process; a shared store keeps it where several replicas
// can reach it. Inspector is what operators read of a store (the admin API,
// metrics), and Backend, a Store with its Inspector, is what a store
// implementation provides. Optional capabilities are named interfaces of
// their own (capabilities.go). The package knows nothing of HTTP or Caddy.
//
// Files: store.go (the seam, its errors and values), capabilities.go (the
// optional capabilities), memory.go (MemoryStore, its sessions' table and
// sweeper), session.go (a memory session), stream.go (a memory stream:
// append, resume, attach), reader.go (its reader), log.go (the chunked
// event log), budget.go (byte bounds and backpressure), counters.go
// (Counters, Hooks). buffer/storetest is the contract every store passes.
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
	// ErrStreamGone: the stream's record went while Resume read it (a
	// shared store retired it meanwhile); the session is still there.
	ErrStreamGone  = errors.New("stream is gone")
	ErrStreamEnded = errors.New("stream has ended")
	ErrTakenOver   = errors.New("another connection took over the stream")
	ErrBelowFloor  = errors.New("reader position is below the retained floor")
	// ErrProducerGone ends a reader of the standalone stream that has caught
	// up while no upstream response feeds the stream: its client should
	// reconnect, which starts a new upstream GET. A reader of a request
	// stream of a shared store is told it too, once (and again after each
	// idle wait), when it has caught up and the stream's producer replica
	// is gone: its replica may take the upstream read over (Takeover); the
	// reader goes on, to what the next producer stores or the stream's end.
	ErrProducerGone = errors.New("no upstream response feeds the stream")
	// ErrIdle is returned by Read when nothing arrived within its idle time.
	ErrIdle = errors.New("no event within the idle time")
)

// FromUndelivered, passed to Attach, starts at the first event never written
// to a client (for a client that reconnects without a Last-Event-ID).
const FromUndelivered uint64 = 0

// FailedError reports that a stream failed, and why. Appenders get it when
// their append cannot go on; readers get it at the end of a failed stream.
type FailedError struct{ Reason policy.Reason }

func (e *FailedError) Error() string { return "stream failed: " + string(e.Reason) }

// Limits bound what a store holds. Zero values are not defaults: callers
// (the Caddy module) fill in defaults and validate.
type Limits struct {
	MaxStreamBytes       int64
	MaxSessionBytes      int64
	MaxTotalBytes        int64
	MaxSessions          int
	MaxStreamsPerSession int           // live request streams (calls running at once)
	ResumeWindow         time.Duration // delivered events stay this long
	StallTimeout         time.Duration // a full log whose client makes no progress this long fails its stream
	SessionIdleTimeout   time.Duration // a session with no client this long expires
}

// SessionMeta is what a session is bound with when it is created. All of it
// is fixed for the session's life but Credential, which Rebind replaces when
// the upstream vouches for a refreshed token.
type SessionMeta struct {
	Version string // negotiated MCP protocol version
	// Fingerprint is a keyed hash of the bound identity: the values of the
	// Bind entries that are request headers or Caddy placeholders.
	Fingerprint [32]byte
	// Bind is the binding as configured when the session began: header
	// names, placeholders, and "bearer" for Credential.
	Bind       []string
	Credential Credential
	// Endpoint is the path (and query) the session began on: where the
	// upstream is asked to vouch for a changed credential.
	Endpoint string
	Origin   policy.SessionOrigin
}

// Credential is a session's bearer binding: keyed hashes of the token and of
// the principal it names, never the token.
type Credential struct {
	Hash      [32]byte // of the Authorization header's values; zero when none was sent
	Principal policy.Principal
}

// Past is what is remembered of an incarnation of a session that ended here,
// so a client that comes back late gets a precise answer instead of a 400.
type Past struct {
	Epoch  string
	Reason policy.Reason
	// Streams are its request streams whose answers a client may lack, by
	// number (at most MaxPastStreams).
	Streams map[uint32]policy.StreamView
}

// Tombstone remembers a session that ended here: its last incarnation, the
// credentials bound to it (a late request with others gets 403), and what
// came before. Tombstones are exact: kept for TombstoneTTL, at most
// MaxTombstones (a multiple of max_sessions) at a time.
type Tombstone struct {
	Past
	Fingerprint [32]byte
	Bind        []string
	Credential  Credential
	Endpoint    string
	Version     string
	Ended       time.Time
	Earlier     []Past // incarnations before the last, newest first
}

// Signal is an event the proxy itself puts into a stream: a gap notice, a
// JSON-RPC error for a request whose answer is lost. Signals bypass the byte
// bounds (they are small, and they are how a failure is told).
type Signal struct {
	Fields  []byte   // SSE fields, as Append takes them
	Answers []string // the request ids it answers (canonical JSON)
}

// Entry is one event as a producer appends it.
type Entry struct {
	Fields  []byte   // SSE fields, without id
	Answers []string // the request ids it answers (canonical JSON)
	// Upstream is the upstream's own event ID the event came with, "" if it
	// had none: the stream's upstream cursor moves to it as the event is
	// stored (Stream.UpstreamCursor).
	Upstream string
}

// Batch is a run of consecutive events as a reader hands them out, framed
// for the client (each with its "id:" line and closing blank line).
type Batch struct {
	First, Last uint64
	Data        [][]byte // the events' bytes, in order; valid until the next Read
}

// Backend is what a store implementation provides: the data path and its
// operator reads.
type Backend interface {
	Store
	Inspector
}

// Store holds sessions: the data path.
type Store interface {
	// CreateSession registers a session under the upstream's session ID,
	// minting its epoch. A tombstone of the same ID is consumed: what it
	// remembers becomes the new session's past.
	CreateSession(id string, meta SessionMeta) (Session, error)
	// Admit reports whether a session of origin o would be admitted now
	// (policy.AdmitSession); CreateSession decides again.
	Admit(o policy.SessionOrigin) bool
	Session(id string) (Session, bool)
	Tombstone(id string) (Tombstone, bool)
	// StandaloneClosed waits, bounded by ctx, until no producer of session
	// id's standalone stream, of any incarnation, holds its upstream GET
	// open (on any replica of a shared store): what adopting the session
	// must know before it opens one.
	StandaloneClosed(ctx context.Context, id string) error
	// Delete ends a session: its readers and appenders stop, its events go,
	// a tombstone remembers it.
	Delete(id string, reason policy.Reason) bool
	// Key is the secret that credential fingerprints and epochs are keyed
	// with; every replica of a shared store has the same.
	Key() []byte
	// SetLimits applies new limits (on config reload) to every session.
	SetLimits(Limits)
	// Close ends every session. The store must not be used afterwards.
	Close()
}

// Session is one MCP session's logs.
type Session interface {
	ID() string
	Epoch() string
	Meta() SessionMeta
	// Past returns what is remembered of an earlier incarnation by epoch.
	Past(epoch string) (Past, bool)
	// Context ends when the session ends; detached upstream reads use it.
	Context() context.Context
	// NewStream opens a request stream for the JSON-RPC requests ids
	// (canonical JSON). key identifies the request (ids and body), so a
	// repeated request can find it.
	NewStream(ids []string, key [32]byte) (Stream, error)
	Stream(num uint32) (Stream, bool)
	StreamByKey(key [32]byte) (Stream, bool)
	// AdmitStream reports whether another request stream would be admitted
	// now (policy.AdmitStream); NewStream decides again.
	AdmitStream() bool
	// NextStream is the number the next request stream will get; request
	// streams below it existed, even if retired since.
	NextStream() uint32
	// Standalone returns the session's standalone GET stream (stream 0): one
	// log for the session's life, fed by successive upstream GETs.
	Standalone() Stream
	// Confirm records that a resume proved the session (a cursor minted for
	// it): an Adopted session counts as Resumed from now on.
	Confirm()
	// Touch records client activity, which defers idle expiry.
	Touch()
	// Rebind binds the session to a refreshed credential the upstream has
	// accepted for it (policy.DecideRebind), on every replica.
	Rebind(Credential) error
}

// Stream is one retention log.
type Stream interface {
	Num() uint32
	Kind() policy.StreamKind
	View() policy.StreamView
	// Append adds an event framed under the ID it mints, blocking while the
	// log is full, and returns its seq.
	Append(ctx context.Context, e Entry) (uint64, error)
	// Complete ends a request stream whose requests were all answered.
	Complete()
	// Fail appends the signals and ends a request stream with reason. On the
	// standalone stream the signals go in and the stream goes on: it is the
	// session's for its whole life.
	Fail(reason policy.Reason, signals ...Signal)
	// Resume answers a client's Last-Event-ID in one step, so eviction cannot
	// move the floor between decision and replay: decide sees the stream; for
	// Noop, Replay, Gap and Ended the client's position ack is acknowledged,
	// and for Noop, Replay and a Gap that replays a reader is attached at the
	// decision's From.
	Resume(ack uint64, decide func(policy.StreamView) policy.Resume) (policy.Resume, Reader, error)
	// Attach returns a reader from seq from (FromUndelivered: the first event
	// no client was sent), taking the stream over from any attached reader.
	Attach(from uint64) (Reader, error)
	// TakeProducer hands the producer role over to the caller (producer.go):
	// at once if no producer holds it; once the holder is Done if it was
	// asked to stop (its session ended, its runtime drains, its lease
	// lapsed), bounded by ctx; never from a holder that runs
	// (ErrProducing: relay what it appends). The standalone stream's role
	// spans the session's incarnations: one upstream GET per session.
	TakeProducer(ctx context.Context) (Producer, error)
	// Connected reports whether a client reads the stream now.
	Connected() bool
	// UpstreamCursor is the upstream's own event ID as of the last event
	// the store holds durably (the Upstream of the last such entry that had
	// one, or a later NoteUpstream), on every handle of the stream: where a
	// producer that takes the stream over resumes the upstream, so that it
	// gets exactly what was not kept. Never shown to clients.
	UpstreamCursor() string
	// NoteUpstream moves the upstream cursor to id with no event: the
	// upstream gave an ID on something not stored (a priming event, an
	// event too large to keep). The note holds after every event appended
	// before it; it is durable with the next event appended, or once the
	// producer releases the stream, whichever comes first. An empty id
	// changes nothing.
	NoteUpstream(id string)
}

// Reader delivers a stream's events in order, from history then live.
type Reader interface {
	// Read returns the next events (at most about maxBytes, in dst's array),
	// waiting up to idle for one (then ErrIdle). At the end it returns io.EOF
	// (complete) or *FailedError (failed).
	Read(ctx context.Context, dst [][]byte, maxBytes int, idle time.Duration) (Batch, error)
	// Next is the seq of the next event Read returns.
	Next() uint64
	// Delivered records that every event up to seq was written and flushed.
	Delivered(seq uint64)
	// Done is closed when the reader is taken over or its session ends.
	Done() <-chan struct{}
	Close()
}

// Inspector is what operators read of a store: the admin API and the
// metrics use it, the data path does not.
type Inspector interface {
	Sessions() []SessionInfo
	// SessionInfo describes session id, if the store holds it.
	SessionInfo(id string) (SessionInfo, bool)
	Stats() Stats
	// Counters are the store's counts (this process's, for a shared store).
	Counters() *Counters
}

// SessionInfo describes a session for operators; it carries no payloads.
type SessionInfo struct {
	ID           string       `json:"id"`
	Epoch        string       `json:"epoch"`
	Version      string       `json:"protocol_version"`
	Origin       string       `json:"origin"`
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
	Stalls     uint64   `json:"stalls"` // times its producer waited on a full log (on a shared store: this replica's producer)
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
	Tombstones     int
}
