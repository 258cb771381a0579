package resume

import (
	"context"
	"maps"
	"net/http"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/buffer"
)

// serveStandalone serves the session's standalone stream (stream 0) to a
// GET: from rd's position after pre for a resume, or, without rd, from the
// first event no client was sent. If no upstream GET feeds the stream,
// this request opens one and keeps it (and its successors) going after the
// client leaves, for as long as the session lives.
//
// Retained events are the client's whatever the upstream says now: a resume
// that has something to send (a replay, a gap) is answered at once, and the
// upstream's answer only decides what follows. A GET with nothing to send
// waits for the upstream's answer, so a refusal (404: re-initialize; 405:
// no GET stream here) reaches the client as plain reverse_proxy would pass it.
func (h *Engine) serveStandalone(w http.ResponseWriter, r *http.Request, next Next,
	sess buffer.Session, rd buffer.Reader, pre []byte, replayUpTo uint64) error {
	stream := sess.Standalone()
	gap := pre != nil // a resume's gap preamble: it must go out now
	if rd == nil {
		var err error
		if rd, err = stream.Attach(buffer.FromUndelivered); err != nil {
			return h.refuse(w, refuseStandalone, to{sid: sess.ID()})
		}
		pre = priming(sess.Meta().Version, sess.Epoch(), stream.Num(), rd.Next())
	}
	if !stream.ClaimProducer() {
		return h.relayTo(w, r, sess, stream, rd, pre, replayUpTo) // an upstream GET feeds it already
	}
	t := h.newTap(r, next, sess, sess.Meta().Version)
	t.stream = stream
	defer t.close()
	defer context.AfterFunc(h.rt.drainCtx, t.cancel)() // it never ends by itself: a drain ends it
	t.lastID = stream.UpstreamCursor()
	answerNow := gap || rd.Next() <= stream.View().Head
	var out http.ResponseWriter = h.sessionWatch(w, sess.ID())
	start := func(http.Header) bool {
		t.startRelay(w, rd, pre, replayUpTo)
		return true
	}
	if answerNow {
		t.startRelay(w, rd, pre, replayUpTo)
		out, start = discard(), func(http.Header) bool { return true }
	}
	res := t.attemptStandalone(r, out, start, func() bool { return false })
	if !res.tapped && !answerNow {
		rd.Close() // the upstream's answer went to the client (a 404 ended the session)
		return res.proxied
	}
	t.followStandalone(res)
	return nil
}

// standaloneRequest is the GET that opens the upstream's standalone stream:
// the client's headers, and the upstream's own Last-Event-ID if an earlier
// upstream GET gave one, so what the upstream kept meanwhile comes too.
func (t *upstreamTap) standaloneRequest(r *http.Request) *http.Request {
	req := t.upstreamRequest(r)
	req.Header.Del(hdrLastEventID) // the proxy's: the upstream knows nothing of them
	if t.lastID != "" {
		req.Header.Set(hdrLastEventID, t.lastID)
	}
	return req
}

// attemptStandalone opens the upstream's standalone GET, asking again
// (up to conflictAttempts, 200 ms apart) while the upstream answers 409: it
// still holds another GET of the session for a moment (the proxy's own,
// closing as the session ended here, or another replica's that lost its
// producer lease), and the client must not get that 409. taken reports
// that the stream has another producer now: no retry. Any other answer
// goes to out as it comes.
func (t *upstreamTap) attemptStandalone(r *http.Request, out http.ResponseWriter, start func(http.Header) bool, taken func() bool) attemptResult {
	for attempt := 1; ; attempt++ {
		if attempt == conflictAttempts {
			return t.attempt(t.standaloneRequest(r), out, start, false)
		}
		res := t.attempt(t.standaloneRequest(r), &unlessConflict{out: out, header: http.Header{}}, start, false)
		if res.tapped || taken() || res.status != http.StatusConflict {
			return res
		}
		if !t.sleep(200 * time.Millisecond) {
			return res
		}
	}
}

// unlessConflict passes a response through to out unless it is a 409,
// which it drops (the GET is asked again).
type unlessConflict struct {
	out             http.ResponseWriter
	header          http.Header
	wrote, conflict bool
}

func (u *unlessConflict) Header() http.Header { return u.header }

func (u *unlessConflict) WriteHeader(status int) {
	if u.wrote {
		return
	}
	if status < http.StatusOK {
		// Informational (103 Early Hints): on to the client with its own
		// headers only, as reverse_proxy sends it; the answer is to come.
		h := u.out.Header()
		own := h.Clone()
		maps.Copy(h, u.header)
		u.out.WriteHeader(status)
		clear(h)
		maps.Copy(h, own)
		return
	}
	u.wrote = true
	if u.conflict = status == http.StatusConflict; u.conflict {
		return
	}
	for k, v := range u.header {
		u.out.Header()[k] = v
	}
	u.out.WriteHeader(status)
}

func (u *unlessConflict) Write(p []byte) (int, error) {
	u.WriteHeader(http.StatusOK) // if not written yet
	if u.conflict {
		return len(p), nil
	}
	return u.out.Write(p)
}

func (u *unlessConflict) Flush() {
	if !u.conflict {
		http.NewResponseController(u.out).Flush()
	}
}

// conflictAttempts bounds the upstream GETs of attemptStandalone.
const conflictAttempts = 5
