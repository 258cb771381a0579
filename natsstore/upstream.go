package natsstore

// The upstream's own cursor on a stream: where a producer that takes the
// stream over asks the upstream to resume. It travels with what is stored
// (each batch's Mcpr-Upstream header: the cursor as of its last event), so
// it is the cursor of exactly what is stored, however the producer before
// ended. A note (an upstream ID on nothing stored) rides with the open
// batch, else with the next one, else the stream record holds it once the
// producer lets go (writer.note, writer.recordNote).

import "errors"

// UpstreamCursor implements buffer.Stream: the one the last stored batch
// carries, or the record's if that was recorded at or after it (a note at
// release, or what eviction kept of a purged subject). It reads both from
// JetStream, not the mirror: the producer before this one (on another
// replica) wrote them a moment ago, and a stale cursor would have the
// upstream send again what the stream has (or skip what it lacks).
func (s *stream) UpstreamCursor() string {
	ctx, cancel := s.sess.st.opCtx()
	defer cancel()
	if _, _, err := s.sess.st.streams.fetch(ctx, s.key); err != nil && !errors.Is(err, errNotFound) {
		s.sess.st.fault("stream", err)
	}
	rec, ok := s.record()
	if !ok {
		return ""
	}
	m, err := s.sess.st.lastMsg(ctx, s.sess.st.names.subject(s.key))
	if err == nil && m != nil && m.upstream != "" && m.last() > rec.UpstreamAt {
		return m.upstream
	}
	return rec.Upstream
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
