package caddymodule

import (
	"context"
	"errors"
	"net/http"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/mcpresume/caddy-mcp-resume/buffer"
	"github.com/mcpresume/caddy-mcp-resume/internal/eventid"
	"github.com/mcpresume/caddy-mcp-resume/internal/jsonrpc"
	"github.com/mcpresume/caddy-mcp-resume/policy"
)

// serveGet handles GET text/event-stream: the standalone stream, and resumes
// (Last-Event-ID) of any stream, answered from the log.
func (h *Handler) serveGet(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	if v := r.Header.Get(hdrVersion); v != "" && !resumable(v) {
		return next.ServeHTTP(w, r)
	}
	sid := r.Header.Get(hdrSessionID)
	lastID := r.Header.Get(hdrLastEventID)
	if sid == "" {
		return next.ServeHTTP(w, r)
	}
	st := h.zone.store
	sess, known := st.Session(sid)
	if lastID == "" {
		if !known {
			return next.ServeHTTP(w, r)
		}
		stream, err := sess.Standalone()
		if err != nil {
			return next.ServeHTTP(w, r)
		}
		return h.serveStandalone(w, r, next, sess, stream)
	}

	// A resume: decide from what the proxy holds (design §5).
	in := policy.ResumeInput{SessionHeader: true}
	cur, perr := eventid.Parse(lastID)
	if perr == nil {
		in.Cursor = policy.Cursor{Valid: true, Epoch: cur.Epoch, Stream: cur.Stream, Seq: cur.Seq}
	}
	var stream buffer.Stream
	if known {
		// ServeHTTP has already refused requests whose credentials differ
		// from the session's (or the tombstone's), whatever their method.
		in.Session = policy.SessionView{Known: true, Epoch: sess.Epoch(), CredentialOK: true}
		if in.Cursor.Valid && cur.Epoch == sess.Epoch() {
			stream, _ = sess.Stream(cur.Stream)
		}
	} else if tomb, ok := st.Tombstone(sid); ok {
		in.Session = policy.SessionView{Tombstoned: true, TombReason: tomb.Reason, TombEpoch: tomb.Epoch, CredentialOK: true}
	}
	var d policy.Resume
	var rd buffer.Reader
	if stream != nil {
		// Decide, acknowledge and attach in one step, so the floor cannot
		// move between the decision and the replay.
		var err error
		d, rd, err = stream.Resume(cur.Seq, func(v policy.StreamView) policy.Resume {
			in.Stream = &v
			return policy.DecideResume(in)
		})
		if err != nil { // the session ended meanwhile
			return h.reject(w, sid, lastID, http.StatusBadRequest, "the session ended")
		}
	} else {
		d = policy.DecideResume(in)
	}
	resumes.WithLabelValues(d.Kind.String()).Inc()

	switch d.Kind {
	case policy.PassThrough:
		return next.ServeHTTP(w, r)
	case policy.Reject:
		return h.reject(w, sid, lastID, d.Status, d.Detail)
	case policy.Adopt:
		return h.serveAdopt(w, r, next, sid, lastID, d.Reason)
	}

	sess.Touch()
	var pre []byte
	logFields := []zap.Field{zap.String("session", sid), zap.Uint32("stream", cur.Stream), zap.Uint64("seq", cur.Seq),
		zap.String("outcome", d.Kind.String())}
	if d.Kind == policy.Gap {
		st.Counters().ResumesFromEvicted.Add(1)
		gaps.WithLabelValues(string(d.Reason)).Inc()
		epoch := sess.Epoch()
		moved := string(eventid.Append(nil, epoch, cur.Stream, d.From-1))
		pre = appendGapEvent(pre, moved, gapInfo{
			LastEventID: lastID,
			ResumeFrom:  string(eventid.Append(nil, epoch, cur.Stream, d.From)),
			Lost:        int64(d.Lost),
			Reason:      d.Reason,
		})
		h.logger.Warn("resume below the retained floor: gap signalled",
			append(logFields, zap.String("reason", string(d.Reason)), zap.Uint64("lost", d.Lost))...)
		if d.Then == policy.ThenError {
			pre = appendPendingErrors(pre, stream.RequestIDs(), d.Reason, lastID, int64(d.Lost))
			h.writeSSE(w, pre)
			return nil
		}
		pre = appendDataEvent(pre, warning(d.Reason, lastID, int64(d.Lost)))
	} else {
		h.logger.Debug("resume", logFields...)
	}
	v := stream.View()
	if stream.Kind() == policy.StandaloneStream && v.State == policy.Live && stream.ClaimProducer() {
		// No upstream GET feeds the standalone stream: this request opens one.
		return h.produceStandalone(w, r, next, sess, stream, rd, pre)
	}
	return h.relayTo(w, r, sess, stream, rd, pre, v.Head)
}

// reject answers a request or resume the proxy refuses, with a JSON-RPC
// error body.
func (h *Handler) reject(w http.ResponseWriter, sid, lastID string, status int, detail string) error {
	h.logger.Warn("request rejected", zap.String("session", sid), zap.String("last_event_id", truncate(lastID, 80)),
		zap.Int("status", status), zap.String("why", detail))
	writeError(w, status, jsonrpc.CodeResumeDenied, "mcp-resume: "+detail)
	return nil
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}

// writeSSE starts an SSE response from the proxy with the given bytes.
func (h *Handler) writeSSE(w http.ResponseWriter, b []byte) bool {
	prepareSSEHeaders(w.Header())
	w.WriteHeader(http.StatusOK)
	if len(b) == 0 {
		b = []byte(": mcp-resume\n\n")
	}
	if _, err := w.Write(b); err != nil {
		return false
	}
	return http.NewResponseController(w).Flush() == nil
}

// relayTo starts an SSE response with pre and relays the stream from the
// reader's position until the stream ends, the client leaves or another
// connection takes over. Events up to replayUpTo count as replayed.
func (h *Handler) relayTo(w http.ResponseWriter, r *http.Request, sess buffer.Session, stream buffer.Stream,
	rd buffer.Reader, pre []byte, replayUpTo uint64) error {
	if !h.writeSSE(w, pre) {
		rd.Close()
		return nil
	}
	rl := h.newRelay(w, sess, stream, rd)
	rl.replayUpTo = replayUpTo
	rl.run(r.Context())
	return nil
}

// serveStandalone serves a GET without Last-Event-ID on the session's
// standalone stream, from the first event no client was sent.
func (h *Handler) serveStandalone(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler,
	sess buffer.Session, stream buffer.Stream) error {
	producer := stream.ClaimProducer()
	rd, err := stream.Attach(buffer.FromUndelivered)
	if err != nil {
		if producer {
			stream.ReleaseProducer()
		}
		return h.reject(w, sess.ID(), "", http.StatusServiceUnavailable, "the session's standalone stream is unavailable")
	}
	if producer {
		return h.produceStandalone(w, r, next, sess, stream, rd, nil)
	}
	return h.relayTo(w, r, sess, stream, rd, preamble(nil, sess, stream), 0)
}

// produceStandalone opens the upstream GET that feeds the session's
// standalone stream (without the client's Last-Event-ID, which the upstream
// knows nothing of) and keeps reading it after the client leaves, for as long
// as the session lives. The caller claimed the producer role and attached rd.
func (h *Handler) produceStandalone(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler,
	sess buffer.Session, stream buffer.Stream, rd buffer.Reader, pre []byte) (err error) {
	defer stream.ReleaseProducer()
	ctx, cancel := h.detach(r)
	defer cancel()
	defer context.AfterFunc(sess.Context(), cancel)()

	up := r.Clone(ctx)
	up.Header.Del(hdrLastEventID)
	tw := h.newTapWriter(w, ctx, nil)
	sid := sess.ID()
	tw.onStatus = func(status int) {
		if status == http.StatusNotFound {
			h.zone.store.Delete(sid, policy.ReasonDeleted)
		}
	}
	replayUpTo := stream.View().Head
	var relayDone chan struct{}
	tw.start = func(int) buffer.Stream {
		if len(pre) == 0 {
			pre = preamble(nil, sess, stream)
		}
		if !h.writeSSE(w, pre) {
			rd.Close()
			return stream
		}
		rl := h.newRelay(w, sess, stream, rd)
		rl.replayUpTo = replayUpTo
		relayDone = make(chan struct{})
		go func() {
			defer close(relayDone)
			rl.run(r.Context())
		}()
		return stream
	}
	defer func() {
		if !tw.tapping {
			rd.Close() // the upstream answered without a stream: its answer went to the client
			return
		}
		p := recover()
		if p != nil && p != http.ErrAbortHandler {
			panic(p)
		}
		// The standalone stream outlives one upstream GET; only a failed
		// append (stall, oversized event) ends it.
		if p == nil && tw.appendErr == nil {
			tw.appendErr = tw.parser.Finish(tw.appendEvent) // an event the upstream left unterminated
		}
		if tw.appendErr != nil {
			var fe *buffer.FailedError
			switch {
			case errors.As(tw.appendErr, &fe):
				stream.Fail(fe.Reason)
			case !errors.Is(tw.appendErr, buffer.ErrStreamEnded):
				stream.Fail(policy.ReasonTooLarge)
			}
		}
		stream.ReleaseProducer()
		if relayDone != nil {
			<-relayDone
		}
		err = nil
	}()
	return next.ServeHTTP(tw, up)
}

// serveAdopt answers a resume for a session the proxy does not hold, with an
// ID in its format: the proxy restarted, or the session expired here. If the
// upstream still knows the session (it answers a fresh GET with a stream),
// the proxy takes it over: a gap event tells the client what was lost, then
// the session's new standalone stream follows live. Otherwise the upstream's
// answer (typically 404: re-initialize) goes to the client.
func (h *Handler) serveAdopt(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler, sid, lastID string, reason policy.Reason) error {
	version := r.Header.Get(hdrVersion)
	if version == "" {
		version = defaultVersion
	}
	ctx, cancel := h.detach(r)
	defer cancel()
	up := r.Clone(ctx)
	up.Header.Del(hdrLastEventID)
	tw := h.newTapWriter(w, ctx, nil)
	var (
		sess      buffer.Session
		stream    buffer.Stream
		relayDone chan struct{}
		stopSess  func() bool
	)
	tw.start = func(int) buffer.Stream {
		s, err := h.zone.store.NewSession(sid, buffer.SessionMeta{Version: version, Fingerprint: h.fingerprint(r)})
		if err != nil {
			h.logger.Warn("session not adopted", zap.String("session", sid), zap.Error(err))
			return nil
		}
		sess = s
		stopSess = context.AfterFunc(s.Context(), cancel)
		str, err := s.Standalone()
		if err != nil || !str.ClaimProducer() {
			return nil
		}
		stream = str
		rd, err := str.Attach(1)
		if err != nil {
			return nil
		}
		moved := string(eventid.Append(nil, s.Epoch(), str.Num(), 0))
		pre := appendGapEvent(nil, moved, gapInfo{LastEventID: lastID, ResumeFrom: moved, Lost: -1, Reason: reason})
		pre = appendDataEvent(pre, warning(reason, lastID, -1))
		gaps.WithLabelValues(string(reason)).Inc()
		h.logger.Warn("session adopted after a resume the proxy could not answer: gap signalled",
			zap.String("session", sid), zap.String("last_event_id", truncate(lastID, 80)), zap.String("reason", string(reason)))
		if !h.writeSSE(w, pre) {
			rd.Close()
			return str
		}
		relayDone = make(chan struct{})
		go func() {
			defer close(relayDone)
			h.newRelay(w, s, str, rd).run(r.Context())
		}()
		return str
	}
	defer func() {
		if stopSess != nil {
			stopSess()
		}
		if !tw.tapping {
			return
		}
		p := recover()
		if p != nil && p != http.ErrAbortHandler {
			panic(p)
		}
		stream.ReleaseProducer()
		if relayDone != nil {
			<-relayDone
		}
	}()
	_ = sess
	return next.ServeHTTP(tw, up)
}

// serveDelete forwards a session's DELETE and purges its logs once the
// upstream accepted it.
func (h *Handler) serveDelete(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	sid := r.Header.Get(hdrSessionID)
	if sid == "" {
		return next.ServeHTTP(w, r)
	}
	if _, known := h.zone.store.Session(sid); !known {
		return next.ServeHTTP(w, r)
	}
	return next.ServeHTTP(&statusWriter{
		ResponseWriterWrapper: &caddyhttp.ResponseWriterWrapper{ResponseWriter: w},
		onStatus: func(status int) {
			if status/100 == 2 || status == http.StatusNotFound {
				h.zone.store.Delete(sid, policy.ReasonDeleted)
			}
		},
	}, r)
}
