package natsstore

// The upstream's own cursor on a stream: where a producer that takes the
// stream over asks the upstream to resume. It travels with what is stored
// (each batch's Mcpr-Upstream header: the cursor as of its last event), so
// it is the cursor of exactly what is stored, however the producer before
// ended. A note (an upstream ID on nothing stored) rides with the open
// batch, else with the next one, else the stream record holds it once the
// producer lets go (writer.note, writer.recordNote).

import (
	"context"
	"errors"
)

// UpstreamCursor implements buffer.Stream: the one the last stored batch
// carries, or the record's if that was recorded at or after it (a note at
// release, or what eviction kept of a purged subject). It reads both from
// JetStream, not the mirror: the producer before this one (on another
// replica) wrote them a moment ago, and a stale cursor would have the
// upstream send again what the stream has (or skip what it lacks).
func (s *stream) UpstreamCursor() string {
	st := s.sess.st
	ctx, cancel := st.opCtx()
	defer cancel()
	// The message first, then the record from KV: an eviction writes the
	// cursor of the messages it purges into the record before it purges
	// them, so one of the two has it whenever the eviction comes.
	var hint uint64
	if rec, ok := s.record(); ok {
		hint = rec.FloorMsg
	}
	m, err := st.lastWhole(ctx, st.names.subject(s.key), hint)
	if _, _, err := st.streams.fetch(ctx, s.key); err != nil && !errors.Is(err, errNotFound) {
		st.fault("stream", err)
	}
	rec, ok := s.record()
	if !ok {
		return ""
	}
	if err == nil && m != nil && m.upstream != "" && m.last() > rec.UpstreamAt {
		return m.upstream
	}
	return rec.Upstream
}

// lastWhole is the last message of subject that ends with a whole event
// (or holds none: a marker), nil if there is none. A producer that died
// between the parts of an event left a part last, which carries no cursor:
// the cursor is the one of the message holding the event before (the
// upstream's replay brings the torn event again, whole). hint is a message
// sequence at or before it, to start the search from.
func (st *Store) lastWhole(ctx context.Context, subject string, hint uint64) (*msgInfo, error) {
	m, err := st.lastMsg(ctx, subject)
	if err != nil || m == nil || m.parts == 0 || m.part == m.parts {
		return m, err
	}
	if m.first <= 1 {
		return nil, nil // the torn event was the stream's first
	}
	at, _, err := st.locate(ctx, subject, m.first-1, hint)
	if err != nil || at == nil || at.last() != m.first-1 {
		return nil, err
	}
	return at, nil
}

// NoteUpstream implements buffer.Stream.
func (s *stream) NoteUpstream(id string) {
	if id == "" {
		return
	}
	if w, err := s.writer(); err == nil {
		w.note(id)
	}
}
