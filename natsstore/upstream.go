package natsstore

// The upstream's own cursor on the standalone stream: where a producer
// that takes the stream over asks the upstream to resume. It must be the
// cursor of exactly what is stored, however the producer before ended.

import (
	"errors"

	"github.com/mcpresume/caddy-mcp-resume/policy"
)

// UpstreamCursor implements buffer.Stream: the cursor recorded by the
// producer before this one, or the one the last stored batch carries if it
// is newer (its producer died without recording one). It reads both from
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
	if err == nil && m != nil && m.upstream != "" && m.end == policy.Live && m.last() > rec.UpstreamAt {
		return m.upstream
	}
	return rec.Upstream
}

// WaitStored waits, as ReleaseProducer does, until what this replica
// appended to the stream is stored or can never be, and returns the last
// seq stored. The tap records the upstream cursor of that event, not of
// the last one it appended.
func (s *stream) WaitStored() uint64 {
	w := s.currentWriter()
	if w == nil {
		return s.View().Head
	}
	w.waitStored(s.sess.st.endTimeout())
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.stored
}

func (s *stream) SetUpstreamCursor(id string) {
	ctx, cancel := s.sess.st.opCtx()
	defer cancel()
	// The cursor holds for what is stored now: this replica's writer knows,
	// else the last stored message says (the record's head may lag).
	var at uint64
	if w := s.currentWriter(); w != nil {
		w.mu.Lock()
		at = w.stored
		w.mu.Unlock()
	} else if m, err := s.sess.st.lastMsg(ctx, s.subject); err == nil && m != nil {
		at = m.last()
	} else {
		at = s.View().Head
	}
	_, err := s.sess.st.streams.update(ctx, s.key, func(r *streamRecord) error {
		if r.Upstream == id && r.UpstreamAt == at {
			return errUnchanged
		}
		r.Upstream, r.UpstreamAt = id, at
		return nil
	})
	if err != nil && !errors.Is(err, errNotFound) {
		s.sess.st.fault("stream", err)
	}
}

// NextUpstream tells the stream the upstream's event ID of the event
// appended next: the batch that stores it carries it, so a producer that
// dies leaves the exact cursor with what it stored.
func (s *stream) NextUpstream(id string) {
	if w, err := s.writer(); err == nil {
		w.mu.Lock()
		w.nextUp = id
		w.mu.Unlock()
	}
}
