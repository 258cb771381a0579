package resume

import (
	"bytes"
	"crypto/sha256"
	"io"
	"net/http"

	"go.uber.org/zap"

	"github.com/mcpresume/caddy-mcp-resume/buffer"
	"github.com/mcpresume/caddy-mcp-resume/internal/jsonrpc"
	"github.com/mcpresume/caddy-mcp-resume/policy"
)

// peekLimit bounds what is read of a POST body before the proxy knows the
// request belongs to a session it holds (whose credentials ServeHTTP has
// checked): enough to recognise initialize or adopt a session, so no client
// without credentials can make the proxy buffer more. Larger such bodies
// pass through untouched.
const peekLimit = 64 << 10

// servePost handles a POST: initialize (learn the session), requests of a
// session (tap the SSE response), and everything else (pass through).
func (h *Engine) servePost(w http.ResponseWriter, r *http.Request, next Next, sid string, seen buffer.Session) error {
	st := h.rt.store
	var sess buffer.Session
	known := false
	if sid != "" {
		sess, known = st.Session(sid)
		if goOn, err := h.reauthorize(w, r, next, sid, policy.Call, seen, sess); !goOn {
			return err
		}
	}
	limit := int64(peekLimit)
	if known {
		limit = h.MaxRequestBytes
	}
	body, err := readBody(r, limit)
	if err != nil {
		return h.refuse(w, refuseUnreadable, to{sid: sid})
	}
	if int64(len(body)) > limit {
		if known {
			return h.refuse(w, refuseMaxRequestBytes, to{sid: sid}, h.MaxRequestBytes)
		}
		r.Body = struct {
			io.Reader
			io.Closer
		}{io.MultiReader(bytes.NewReader(body), r.Body), r.Body}
		return next.ServeHTTP(w, r) // not the proxy's to inspect
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	calls, _, err := jsonrpc.ParseBody(body)
	if err != nil {
		return next.ServeHTTP(w, r) // not JSON-RPC: the upstream answers it
	}
	if len(calls) == 1 && calls[0].Kind == jsonrpc.Request && calls[0].Method == "initialize" {
		if v := calls[0].ProtocolVersion; (v == "" || resumable(v)) && h.refuseNew(w, jsonrpc.CanonicalID(calls[0].ID), true) {
			return nil
		}
		return h.serveInitialize(w, r, next, calls[0])
	}
	if sid == "" || known && !resumable(sess.Meta().Version) {
		return next.ServeHTTP(w, r) // no session, or one that is never tapped
	}
	var ids []string
	for _, c := range calls {
		if c.Kind == jsonrpc.Request {
			ids = append(ids, jsonrpc.CanonicalID(c.ID))
		}
	}
	if len(ids) == 0 {
		// Notifications and responses get 202 and no stream; watch for the
		// upstream saying the session is gone.
		return next.ServeHTTP(h.sessionWatch(w, sid), r)
	}
	if h.refuseNew(w, ids[0], true) {
		return nil
	}
	key := requestKey(ids, body)
	if !known {
		return h.adoptOnPost(w, r, next, sid, ids, key)
	}
	sess.Touch()
	if !sess.AdmitStream() {
		return h.refuse(w, refuseMaxStreams, to{id: ids[0], sid: sid})
	}
	if served := h.serveRepeat(w, r, next, sess, ids, key); served {
		return nil
	}
	return h.serveCall(w, r, next, sess, sess.Meta().Version, ids, key)
}

// presizeMax bounds the buffer readBody takes for a body before its bytes
// come: no more than net/http's own read buffer per connection, so that
// declaring a length commits the proxy to nothing (review 55: a declared
// 8 MiB, one byte sent, held 8 MiB).
const presizeMax = 4 << 10

// readBody reads up to limit+1 bytes of r's body: into one buffer of its
// size when the client declared a small one (io.ReadAll grows from 512
// bytes, and most calls are smaller), else as io.ReadAll does.
func readBody(r *http.Request, limit int64) ([]byte, error) {
	n := r.ContentLength
	if n < 0 || n > limit || n > presizeMax {
		return io.ReadAll(io.LimitReader(r.Body, limit+1))
	}
	body := make([]byte, n+1)
	if _, err := io.ReadFull(r.Body, body[:n]); err != nil {
		return nil, err
	}
	// More than declared (net/http's server stops at the length; other
	// callers may not): the rest is read as ReadAll would.
	switch m, err := io.ReadFull(r.Body, body[n:]); {
	case m == 0 && err == io.EOF:
		return body[:n], nil
	case err != nil && err != io.EOF:
		return nil, err
	}
	rest, err := io.ReadAll(io.LimitReader(r.Body, limit-n))
	return append(body, rest...), err
}

// requestKey identifies a request by its ids and body, so a repeat of it can
// find the stream that answers it.
func requestKey(ids []string, body []byte) [32]byte {
	h := sha256.New()
	for _, id := range ids {
		h.Write([]byte(id))
		h.Write([]byte{0})
	}
	h.Write([]byte{1})
	h.Write(body)
	var k [32]byte
	h.Sum(k[:0])
	return k
}

// serveRepeat answers a repeated request (same session, ids and body) from
// the stream of the first, if it is retained from its start, instead of
// running the tool twice. The replay is a resume from 0: everything is
// acknowledged as not delivered, so nothing the replay still needs can go.
// If the stream's producer is gone (its replica died), the repeat may take
// the upstream read over, as a resume would.
func (h *Engine) serveRepeat(w http.ResponseWriter, r *http.Request, next Next, sess buffer.Session, ids []string, key [32]byte) bool {
	stream, ok := sess.StreamByKey(key)
	if !ok {
		return false
	}
	d, rd, err := stream.Resume(0, func(v policy.StreamView) policy.Resume {
		if v.Floor != 1 || !sameIDs(v.Requests, ids) {
			return policy.Resume{Kind: policy.PassThrough} // not all of it is here: run it again
		}
		return policy.Resume{Kind: policy.Replay, From: 1}
	})
	if err != nil || d.Kind != policy.Replay {
		return false
	}
	retriesServed.Inc()
	h.logger.Info("repeated request answered from the retained stream",
		zap.String("session", sess.ID()), zap.Uint32("stream", stream.Num()), zap.Strings("request_ids", ids))
	prepareSSEHeaders(w.Header())
	w.WriteHeader(http.StatusOK)
	rl := h.newRelay(w, sess, stream, rd)
	rl.replayUpTo = stream.View().Head
	rl.takeover = func() bool { return h.offerTakeover(r, next, sess, stream) }
	if rl.write(priming(sess.Meta().Version, sess.Epoch(), stream.Num(), 1)) {
		rl.run(r.Context())
	} else {
		rd.Close()
	}
	return true
}

func sameIDs(reqs []policy.RequestView, ids []string) bool {
	if len(reqs) != len(ids) {
		return false
	}
	for i := range reqs {
		if reqs[i].ID != ids[i] {
			return false
		}
	}
	return true
}

// sessionWatch passes a response through and ends the session if the
// upstream says it no longer exists.
func (h *Engine) sessionWatch(w http.ResponseWriter, sid string) http.ResponseWriter {
	return &statusWriter{
		writerWrapper: writerWrapper{ResponseWriter: w},
		onStatus:      func(status int) { h.sessionGone(sid, status) },
	}
}

// adoptOnPost forwards requests of a session the proxy does not hold (it
// restarted, or the session expired or was purged here) and adopts the
// session if the upstream answers with a stream. Such sessions have a share
// of their own (policy.Adopted), so made-up session IDs cannot crowd out
// real ones; a session deleted here is not adopted.
func (h *Engine) adoptOnPost(w http.ResponseWriter, r *http.Request, next Next, sid string, ids []string, key [32]byte) error {
	if tomb, ok := h.rt.store.Tombstone(sid); ok && tomb.Reason == policy.ReasonDeleted {
		return next.ServeHTTP(w, r)
	}
	version := r.Header.Get(hdrVersion)
	if version == "" {
		version = defaultVersion
	}
	if h.identityMissing(r) {
		h.logger.Warn("session not adopted: its bind placeholders are empty for this request; passed through",
			zap.String("session", sid))
		return next.ServeHTTP(w, r)
	}
	if !h.rt.store.Admit(policy.Adopted) {
		limitsHit.WithLabelValues("adopted_sessions").Inc()
		h.logger.Warn("session not adopted: the share of adopted sessions is full; passed through",
			zap.String("session", sid))
		return next.ServeHTTP(w, r)
	}
	return h.serveCall(w, r, next, nil, version, ids, key)
}

// statusWriter passes a response through and reports its status.
type statusWriter struct {
	writerWrapper
	onStatus func(int)
	done     bool
}

func (s *statusWriter) WriteHeader(status int) {
	if !s.done && status >= 200 {
		s.done = true
		s.onStatus(status)
	}
	s.writerWrapper.WriteHeader(status)
}

func (s *statusWriter) Write(p []byte) (int, error) {
	if !s.done {
		s.WriteHeader(http.StatusOK)
	}
	return s.writerWrapper.Write(p)
}

// sessionGone handles an upstream 404 for the session: it no longer exists
// there, so it ends here too.
func (h *Engine) sessionGone(sid string, status int) bool {
	if policy.Classify(status) != policy.UpstreamSessionGone {
		return false
	}
	h.rt.store.Delete(sid, policy.ReasonDeleted)
	return true
}
