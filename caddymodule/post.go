package caddymodule

import (
	"bytes"
	"context"
	"errors"
	"io"
	"mime"
	"net/http"
	"strconv"
	"strings"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/mcpresume/caddy-mcp-resume/buffer"
	"github.com/mcpresume/caddy-mcp-resume/internal/jsonrpc"
	"github.com/mcpresume/caddy-mcp-resume/internal/sse"
	"github.com/mcpresume/caddy-mcp-resume/policy"
)

// Header names (canonical form; matching is case-insensitive).
const (
	hdrSessionID   = "Mcp-Session-Id"
	hdrVersion     = "Mcp-Protocol-Version"
	hdrLastEventID = "Last-Event-Id"
)

// resumable reports whether a protocol version has resumable streams.
// 2026-07-28 removed them (a closed stream is a cancellation there), and
// versions this proxy does not know pass through untouched.
func resumable(version string) bool {
	switch version {
	case "2025-03-26", "2025-06-18", "2025-11-25":
		return true
	}
	return false
}

// defaultVersion is what the spec says to assume without a version header.
const defaultVersion = "2025-03-26"

func acceptsSSE(r *http.Request) bool {
	for _, v := range r.Header.Values("Accept") {
		if strings.Contains(v, "text/event-stream") {
			return true
		}
	}
	return false
}

func isJSON(contentType string) bool {
	ct, _, _ := mime.ParseMediaType(contentType)
	return ct == "application/json"
}

// writeError answers with an HTTP status and a JSON-RPC error body.
func writeError(w http.ResponseWriter, status, code int, message string) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Del("Content-Length")
	if status == http.StatusServiceUnavailable {
		w.Header().Set("Retry-After", "5")
	}
	w.WriteHeader(status)
	w.Write(jsonrpc.ErrorResponse(nil, code, message, nil))
}

func (h *Handler) servePost(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	if !isJSON(r.Header.Get("Content-Type")) {
		return next.ServeHTTP(w, r)
	}
	if v := r.Header.Get(hdrVersion); v != "" && !resumable(v) {
		return next.ServeHTTP(w, r)
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, h.MaxRequestBytes+1))
	if err != nil {
		return caddyhttp.Error(http.StatusBadRequest, err)
	}
	if int64(len(body)) > h.MaxRequestBytes {
		limitsHit.WithLabelValues("max_request_bytes").Inc()
		writeError(w, http.StatusRequestEntityTooLarge, jsonrpc.CodeLimit,
			"mcp-resume: request body exceeds max_request_bytes ("+strconv.FormatInt(h.MaxRequestBytes, 10)+")")
		return nil
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	calls, _, err := jsonrpc.ParseBody(body)
	if err != nil {
		return next.ServeHTTP(w, r) // not JSON-RPC: the upstream answers it
	}
	if len(calls) == 1 && calls[0].Kind == jsonrpc.Request && calls[0].Method == "initialize" {
		return h.serveInitialize(w, r, next)
	}
	sid := r.Header.Get(hdrSessionID)
	if sid == "" {
		return next.ServeHTTP(w, r) // no session: nothing to resume into
	}
	st := h.zone.store
	sess, known := st.Session(sid)
	if known {
		sess.Touch() // credentials were checked in ServeHTTP
	}
	var ids []string
	for _, c := range calls {
		if c.Kind == jsonrpc.Request {
			ids = append(ids, string(bytes.TrimSpace(c.ID)))
		}
	}
	if len(ids) == 0 {
		// Notifications and responses get 202 and no stream; watch for the
		// upstream saying the session is gone.
		return next.ServeHTTP(h.sessionWatch(w, sid), r)
	}
	if !known {
		// A session the proxy does not hold (it restarted, or the session
		// expired here): adopt it if the upstream answers with a stream.
		if tomb, ok := st.Tombstone(sid); ok && tomb.Reason == policy.ReasonDeleted {
			return next.ServeHTTP(w, r)
		}
		v := r.Header.Get(hdrVersion)
		if v == "" {
			v = defaultVersion
		}
		if !resumable(v) {
			return next.ServeHTTP(w, r)
		}
		return h.serveCall(w, r, next, nil, sid, v, ids, "")
	}
	if sess.ActiveStreams() >= h.MaxStreamsPerSession {
		limitsHit.WithLabelValues("max_streams_per_session").Inc()
		writeError(w, http.StatusServiceUnavailable, jsonrpc.CodeLimit, "mcp-resume: too many open streams in this session (max_streams_per_session)")
		return nil
	}
	key := retryKey(sid, ids, body)
	if num, ok := h.zone.retries.Get(key); ok {
		if stream, ok := sess.Stream(num); ok {
			// The same request again: if the first one's stream is retained
			// from its start, replay it rather than run the tool twice.
			if rd, err := stream.Attach(1); err == nil {
				retriesServed.Inc()
				h.logger.Info("repeated request answered from the retained stream",
					zap.String("session", sid), zap.Uint32("stream", num), zap.Strings("request_ids", ids))
				return h.relayTo(w, r, sess, stream, rd, preamble(nil, sess, stream), stream.View().Head)
			}
		}
	}
	return h.serveCall(w, r, next, sess, sid, "", ids, key)
}

// sessionWatch passes a response through and ends the session if the
// upstream says it no longer exists.
func (h *Handler) sessionWatch(w http.ResponseWriter, sid string) http.ResponseWriter {
	return &statusWriter{
		ResponseWriterWrapper: &caddyhttp.ResponseWriterWrapper{ResponseWriter: w},
		onStatus: func(status int) {
			if status == http.StatusNotFound {
				h.zone.store.Delete(sid, policy.ReasonDeleted)
			}
		},
	}
}

// serveCall forwards a POST carrying requests and, if the upstream answers
// with an SSE stream, taps it: the upstream is read to its end whatever the
// client does, and a relay feeds the client from the log. sess is nil when
// the session is adopted (created once the upstream answers with a stream).
func (h *Handler) serveCall(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler,
	sess buffer.Session, sid, version string, ids []string, retryKey string) (err error) {
	ctx, cancel := h.detach(r)
	defer cancel()
	tw := h.newTapWriter(w, ctx, ids)
	var relayDone chan struct{}
	var stopSess func() bool
	defer func() {
		if stopSess != nil {
			stopSess()
		}
	}()
	tw.onStatus = func(status int) {
		if status == http.StatusNotFound && sess != nil {
			h.zone.store.Delete(sid, policy.ReasonDeleted)
		}
	}
	tw.start = func(int) buffer.Stream {
		if sess == nil {
			s, err := h.zone.store.NewSession(sid, buffer.SessionMeta{Version: version, Fingerprint: h.fingerprint(r)})
			if err != nil {
				if s2, ok := h.zone.store.Session(sid); ok && errors.Is(err, buffer.ErrSessionExists) {
					s = s2 // a concurrent request adopted it first
				} else {
					h.logger.Warn("session not adopted", zap.String("session", sid), zap.Error(err))
					return nil
				}
			} else {
				h.logger.Info("session adopted", zap.String("session", sid), zap.String("protocol_version", version))
			}
			sess = s
		}
		stream, err := sess.NewStream(policy.RequestStream, ids)
		if err != nil {
			h.logger.Warn("stream not retained", zap.String("session", sid), zap.Error(err))
			return nil
		}
		stream.ClaimProducer()
		if retryKey != "" {
			h.zone.retries.Set(retryKey, stream.Num(), 1)
			h.zone.retries.Wait() // visible to the very next request
		}
		stopSess = context.AfterFunc(sess.Context(), cancel) // the session's end ends the upstream read
		prepareSSEHeaders(w.Header())
		w.WriteHeader(http.StatusOK)
		rd, err := stream.Attach(1)
		if err != nil {
			return stream
		}
		rl := h.newRelay(w, sess, stream, rd)
		rl.write(preamble(nil, sess, stream))
		relayDone = make(chan struct{})
		go func() {
			defer close(relayDone)
			rl.run(r.Context())
		}()
		if c := h.logger.Check(zap.DebugLevel, "tapping request stream"); c != nil {
			c.Write(zap.String("session", sid), zap.Uint32("stream", stream.Num()), zap.Strings("request_ids", ids))
		}
		return stream
	}
	defer func() {
		if !tw.tapping {
			return
		}
		p := recover()
		if p != nil && p != http.ErrAbortHandler {
			panic(p)
		}
		h.finishRequestStream(tw, p != nil || err != nil)
		tw.stream.ReleaseProducer()
		if relayDone != nil {
			<-relayDone
		}
		err = nil // the client already has its response headers
	}()
	return next.ServeHTTP(tw, r.WithContext(ctx))
}

func (h *Handler) finishRequestStream(tw *tapWriter, broken bool) {
	s := tw.stream
	switch {
	case tw.appendErr != nil:
		var fe *buffer.FailedError
		if errors.As(tw.appendErr, &fe) {
			s.Fail(fe.Reason)
		} else if errors.Is(tw.appendErr, sse.ErrEventTooLarge) {
			limitsHit.WithLabelValues("max_event_bytes").Inc()
			s.Fail(policy.ReasonTooLarge)
		} else {
			s.Fail(policy.ReasonUpstreamFailed)
		}
	case broken:
		s.Fail(policy.ReasonUpstreamFailed)
	default:
		// An event the upstream ended without its blank line is complete
		// as far as clients go (the SDK clients dispatch it at EOF).
		if err := tw.parser.Finish(tw.appendEvent); err != nil {
			s.Fail(policy.ReasonTooLarge)
			return
		}
		s.Complete()
	}
}
