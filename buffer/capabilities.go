package buffer

// Optional capabilities: interfaces a store (or its streams) may implement
// beyond the core seam of store.go. Callers assert only these, never a
// store's concrete type, and buffer/storetest runs each one's contract
// against every store that has it.

import (
	"context"

	"github.com/cespare/xxhash/v2"
)

// BatchAppender is a Stream that appends several events in one step, as an
// upstream read that carried several delivers them: the memory store's
// streams take them under one hold of their lock and wake their reader
// once; the JetStream store's put them into one open batch. Use
// AppendBatch, which falls back to Append for a Stream without it.
type BatchAppender interface {
	// AppendBatch appends entries in order, each as Append would (framed
	// under the ID it mints, blocking while the log is full, the upstream
	// cursor moving with it). It returns the seq of the last event appended
	// and how many were; an error stops it at entries[n], which was not
	// appended.
	AppendBatch(ctx context.Context, entries []Entry) (last uint64, n int, err error)
}

// AppendBatch appends entries to s in order, in one step if s is a
// BatchAppender, else one Append each: the outcome is the same.
func AppendBatch(ctx context.Context, s Stream, entries []Entry) (last uint64, n int, err error) {
	if ba, ok := s.(BatchAppender); ok {
		return ba.AppendBatch(ctx, entries)
	}
	for n < len(entries) {
		seq, err := s.Append(ctx, entries[n])
		if err != nil {
			return last, n, err
		}
		last = seq
		n++
	}
	return last, n, nil
}

// CallOpener is a Session that opens a call's request stream with its
// producer role taken and its client attached from the first event in one
// step: what NewStream, TakeProducer and Attach(1) do in turn, as the glue
// does them for every POST it taps, which a shared store records in fewer
// writes (the JetStream store: the stream's record is created with its
// reader entry, one write where two were). Errors are NewStream's while
// the stream is nil; with the stream made, TakeProducer's or Attach's,
// and what the stream holds then is as after those calls failing.
type CallOpener interface {
	OpenCall(ctx context.Context, ids []string, key [32]byte) (Stream, Producer, Reader, error)
}

// Availability is a Store that can be out of reach (a shared one): while
// Available returns an error, the proxy refuses new sessions and calls with
// 503 before they reach the upstream. A Store without it is always
// available.
type Availability interface {
	Available() error
}

// Available reports why st cannot take new work now, or nil.
func Available(st Store) error {
	if a, ok := st.(Availability); ok {
		return a.Available()
	}
	return nil
}

// Takeover is a request Stream of a shared store, whose producer (the
// replica reading its upstream response) can die while the stream lives:
// another replica can then take the upstream read over from the stream's
// upstream cursor. storetest checks what one replica shows; what two
// replicas race for, natsstore's takeover_test.go.
type Takeover interface {
	// TakeOver hands this replica the producer role of the live stream,
	// whose producer is gone (its lease lapsed), as TakeProducer does
	// within a replica: exactly one replica succeeds, the others get an
	// error (ErrProducing) and relay what it stores. Nothing the producer
	// before stored late can come after what the new one stores. The
	// caller reads the upstream from UpstreamCursor on, and calls the
	// Producer's Done once its upstream response is closed.
	TakeOver(ctx context.Context) (Producer, Succession, error)
}

// UpstreamTail is a Stream that can say what its last events were: the
// upstream ID each came with and a sum of its fields. A producer that
// takes the stream over needs it to drop what the upstream's replay
// resends (the event at the cursor, and a few before it): events its
// client has acknowledged, which may be evicted by then, so a store keeps
// this much of them past their eviction while the stream is live. Only a
// takeover reads it, once; a store keeps it where that costs its appends
// least (natsstore: a header only where a message's cursor does not say
// it already, the sums computed at eviction or at the takeover).
type UpstreamTail interface {
	// UpstreamTail calls each, oldest first, with those of the stream's
	// last n events that came with an upstream ID. An event stored in
	// parts not all stored is none of them; of those evicted, a store
	// knows the ones among its last TailKeep.
	UpstreamTail(ctx context.Context, n int, each func(TailEvent)) error
}

// TailEvent is one of UpstreamTail's events.
type TailEvent struct {
	Seq uint64 // its seq in the stream
	ID  string // the upstream ID it came with: its own, never a note's
	Sum uint64 // FieldsSum of its fields
}

// TailKeep is how many of a live stream's last events a store that has
// UpstreamTail keeps the tail events of past their eviction: the "few"
// an upstream's replay may resend before its cursor.
const TailKeep = 16

// FieldsSum is a sum of an event's stored fields (Entry.Fields), the same
// on every replica: xxHash64, fast enough to take as every event is
// appended (a store that keeps its producer's last sums reads nothing
// back at an eviction).
func FieldsSum(fields []byte) uint64 { return xxhash.Sum64(fields) }

// StreamLookup is a Session whose reads of a stream can fail (a shared
// store out of reach): LookupStream tells a read that failed (an error)
// from a stream the session does not have (nil, nil), which Stream reports
// alike. A resume must not take a stream it could not read for one that
// does not exist: its cursor would be refused 400 or given a gap (review
// 50: a replica cut off from NATS refused a live call's resume with 400).
type StreamLookup interface {
	LookupStream(num uint32) (Stream, error)
}

// LookupStream is s's stream num: nil if it has none, an error if it could
// not tell.
func LookupStream(s Session, num uint32) (Stream, error) {
	if l, ok := s.(StreamLookup); ok {
		return l.LookupStream(num)
	}
	if str, ok := s.Stream(num); ok {
		return str, nil
	}
	return nil, nil
}

// SessionLookup is a Store whose reads of a session can fail (a shared one
// out of reach): LookupSession tells a read that failed (an error) from a
// session the store does not hold (nil, nil), which Session reports alike.
// The proxy must not take a session it could not read for one that does
// not exist: a request naming it would pass unchecked.
type SessionLookup interface {
	LookupSession(id string) (Session, error)
}

// LookupSession is st's session id: nil if it holds none, an error if it
// could not tell.
func LookupSession(st Store, id string) (Session, error) {
	if l, ok := st.(SessionLookup); ok {
		return l.LookupSession(id)
	}
	if s, ok := st.Session(id); ok {
		return s, nil
	}
	return nil, nil
}

// Succession names the producers of a stream taken over, for operators.
type Succession struct {
	Previous, Current string // replica IDs
}

var _ BatchAppender = (*memStream)(nil)

// ReadyReader is a Reader that can take what is ready without waiting, for
// a writer that must never block on it: the tap writing a short answer to
// its client itself, between two reads of its upstream (the memory store's
// readers; a shared store's reads are round trips, and its streams keep
// their relay in a goroutine of its own).
type ReadyReader interface {
	// ReadReady returns the events ready from the reader's position, at
	// most maxBytes of them, as Read would, without waiting: ErrIdle when
	// none is ready; more reports that more are ready than it returned
	// (with ErrIdle and no events: the next event alone is over maxBytes).
	// Its end errors are Read's (io.EOF, *FailedError, ErrProducerGone,
	// ErrBelowFloor, the reader closed).
	ReadReady(dst [][]byte, maxBytes int) (b Batch, more bool, err error)
}
