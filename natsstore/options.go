// Package natsstore implements buffer.Backend (and buffer.Availability) on
// NATS JetStream, so several
// Caddy replicas share every session, stream and retained event, and a
// restart or a rolling deploy loses nothing. DESIGN.md describes where each
// piece of state lives and why.
//
// Every replica mirrors the records (sessions, streams, producer leases) of
// the sessions it serves, kept current by the notifications of the replicas
// that write them, so reads are local; every write is a compare-and-set on
// KV, so replicas never overwrite each other. Events are
// stored in one JetStream stream, one message per batch of consecutive
// events, and readers read them from JetStream only: a client never sees an
// event the store has not accepted.
//
// Files: options.go (Options), open.go (Open, Close, the Store), store.go
// (sessions: create, look up, delete; the Inspector's reads), session.go
// and stream.go (this replica's handles), writer.go (a stream's producer:
// batches, publishing, the record's sync), budget.go (the bounds and
// backpressure), publish.go (messages and the one publish path), locate.go
// (what a message's headers say; finding an event), reader.go (a client's
// reader), upstream.go (the upstream cursor), evict.go, sweep.go (each
// replica's sweep of what it serves, the sweeper's scan of the zone: eviction,
// idle expiry, dead producers), leases.go,
// mirror.go and records.go (the KV records and their local copies),
// health.go (Available and its probe), recover.go (recreating a zone whose
// data NATS lost), retry.go, signals.go, embedded.go.
package natsstore

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"regexp"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/mcpresume/caddy-mcp-resume/buffer"
	"github.com/mcpresume/caddy-mcp-resume/policy"
)

// Options configure a Store.
type Options struct {
	// URLs of the NATS servers to connect to. Ignored when Embedded is set.
	URLs []string
	// Embedded starts an in-process nats-server with JetStream and file
	// storage in Dir, listening on loopback only, and connects in-process.
	Embedded bool
	Dir      string
	// ServerLogs lets the embedded server log to stderr (off by default).
	ServerLogs bool
	// Server, if set, is an in-process server (see StartEmbedded) the store
	// connects to; the caller runs it and shuts it down, so several stores
	// can share it. URLs and Embedded are then ignored.
	Server *server.Server

	// Replicas of every JetStream stream and KV bucket (1 or 3; default 1).
	Replicas int

	// Authentication (at most one of a credentials file, a token, or a user
	// and password).
	CredentialsFile string
	Token           string
	User, Password  string
	// TLS: the CA that signs the servers' certificates, and a client
	// certificate and key for mutual TLS.
	TLSCAFile   string
	TLSCertFile string
	TLSKeyFile  string

	// Prefix names the zone's streams, buckets and subjects (letters,
	// digits, '_' and '-'; default "mcpr"). Zones sharing a NATS system need
	// different prefixes.
	Prefix string

	Limits buffer.Limits
	Hooks  buffer.Hooks

	// SweepInterval is how often each replica evicts, expires and retires
	// for the sessions it serves. Default 500ms.
	SweepInterval time.Duration
	// ScanInterval is how often the replica holding the sweeper lease
	// sweeps the zone whole (sessions no live replica serves, old
	// tombstones) and publishes its tally; a zone whose scan takes long is
	// scanned less often (see scan). Default 10 x SweepInterval.
	ScanInterval time.Duration
	// TombstoneTTL is how long ended sessions are remembered. Default 1h.
	TombstoneTTL time.Duration
	// MaxTombstones bounds the ended sessions remembered; default 4 x
	// MaxSessions, at least 1024.
	MaxTombstones int
	// DrainTimeout is how long Close waits for this replica's producing
	// streams to end by themselves before it fails them. Default 0: the
	// Caddy glue drains before it closes the store.
	DrainTimeout time.Duration
	// ReplicaID names this replica in leases and reader entries. Default
	// random.
	ReplicaID string
	// LeaseTTL is how long a producer lease or a reader entry outlives its
	// replica: after it, another replica ends the dead producer's stream.
	// Default 15s; at least 1s.
	LeaseTTL time.Duration
	// TakeoverWait is how long a request stream whose producer died and
	// which recorded an upstream cursor waits, after its lease lapsed, for
	// a client to come back and take the upstream read over (DESIGN.md,
	// "Takeover") before the sweeper fails it. Default 1m. A stream without
	// an upstream cursor is failed at LeaseTTL.
	TakeoverWait time.Duration
	// BatchBytes bounds a message of consecutive events. Default 256 KiB,
	// at most the server's max_payload less room for headers.
	BatchBytes int

	// FailureSignals builds what a stream whose producer died gets appended
	// before its end: a gap event and a JSON-RPC error for each request still
	// waiting for its answer. The Caddy glue sets its own; the default
	// builds the same shape.
	FailureSignals func(reason policy.Reason, lastEventID string, pending []string) []buffer.Signal
	// OnPublish, if set, is told of every batch stored: how long JetStream
	// took to acknowledge it (retries included) and how many events it held.
	// It must not block.
	OnPublish func(took time.Duration, events int)
	// OnError, if set, is told of every failed NATS operation, by operation
	// name (metrics, logs). It must not block.
	OnError func(op string, err error)
	// OnDataLost, if set, is told when NATS no longer held the zone's data
	// (a server back with an empty store): the store recreated what was
	// missing and ended the sessions it held. It must not block.
	OnDataLost func(DataLoss)
}

var prefixRE = regexp.MustCompile(`^[A-Za-z0-9_-]{1,32}$`)

// Defaults.
const (
	defaultPrefix        = "mcpr"
	defaultSweepInterval = 500 * time.Millisecond
	defaultTombstoneTTL  = time.Hour
	DefaultLeaseTTL      = 15 * time.Second
	DefaultTakeoverWait  = time.Minute
	defaultBatchBytes    = 256 << 10
	embeddedMaxPayload   = 64 << 20
	headerRoom           = 64 << 10 // what a batch's headers may take of a message
	minPartRoom          = 4 << 10  // the least payload a message must take besides headerRoom
)

func (o *Options) setDefaults() error {
	if o.Prefix == "" {
		o.Prefix = defaultPrefix
	}
	if !prefixRE.MatchString(o.Prefix) {
		return fmt.Errorf("natsstore: prefix %q: use 1 to 32 letters, digits, '_' or '-'", o.Prefix)
	}
	if o.Replicas <= 0 {
		o.Replicas = 1
	}
	if o.Embedded && o.Dir == "" && o.Server == nil {
		return errors.New("natsstore: an embedded server needs a storage directory (Dir)")
	}
	if !o.Embedded && o.Server == nil && len(o.URLs) == 0 {
		return errors.New("natsstore: no NATS URLs, and no embedded server")
	}
	if o.SweepInterval <= 0 {
		o.SweepInterval = defaultSweepInterval
	}
	if o.ScanInterval <= 0 {
		o.ScanInterval = 10 * o.SweepInterval
	}
	if o.TombstoneTTL <= 0 {
		o.TombstoneTTL = defaultTombstoneTTL
	}
	if o.LeaseTTL <= 0 {
		o.LeaseTTL = DefaultLeaseTTL
	}
	o.LeaseTTL = max(o.LeaseTTL, time.Second) // per-key TTLs are whole seconds
	if o.TakeoverWait <= 0 {
		o.TakeoverWait = DefaultTakeoverWait
	}
	if o.BatchBytes <= 0 {
		o.BatchBytes = defaultBatchBytes
	}
	if o.ReplicaID == "" {
		b := make([]byte, 6)
		rand.Read(b)
		o.ReplicaID = hex.EncodeToString(b)
	}
	if o.FailureSignals == nil {
		o.FailureSignals = defaultFailureSignals
	}
	return nil
}

func (o *Options) maxTombstones(l buffer.Limits) int {
	if o.MaxTombstones > 0 {
		return o.MaxTombstones
	}
	return max(4*l.MaxSessions, 1024)
}
