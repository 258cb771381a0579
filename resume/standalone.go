package resume

import (
	"context"
	"errors"
	"net/http"
	"sync"
	"time"

	"go.uber.org/zap"

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
// no GET stream here; 409: the upstream's own) reaches the client as plain
// reverse_proxy would pass it. A 409 that is the proxy's own conflict (see
// openStandalone) never does: the client gets its stream.
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
	// The previous upstream GET of the session (this replica's, closing,
	// or another's whose lease went) is closed before this one opens, so
	// the upstream's answer, a 409 too, is for the client.
	ctx, cancel := context.WithTimeout(r.Context(), handoverTimeout)
	p, err := stream.TakeProducer(ctx)
	cancel()
	switch {
	case errors.Is(err, buffer.ErrProducing), errors.Is(err, buffer.ErrSessionGone):
		// An upstream GET feeds it already (the relay follows it), or the
		// session ended meanwhile (the relay tells the client).
		return h.relayTo(w, r, sess, stream, rd, pre, replayUpTo)
	case err != nil:
		rd.Close()
		h.logger.Warn("standalone stream refused: its previous upstream GET did not close in time",
			zap.String("session", sess.ID()), zap.Error(err))
		return h.refuse(w, refuseStandalone, to{sid: sess.ID()})
	}
	t := h.newTap(r, next, sess, sess.Meta().Version)
	t.produce(stream, p)
	defer t.close()
	defer context.AfterFunc(h.rt.drainCtx, t.cancel)() // it never ends by itself: a drain ends it
	t.lastID = stream.UpstreamCursor()
	if t.lastID != "" {
		// Resumed from the stored cursor: what the upstream's replay
		// resends of the last events is dropped, whichever tap or
		// replica took them.
		t.seedRecent(stream)
	}
	answered := false
	answer := func() {
		t.startRelay(w, rd, pre, replayUpTo)
		answered = true
	}
	var out http.ResponseWriter = h.sessionWatch(w, sess.ID())
	start := func(http.Header) bool {
		answer()
		return true
	}
	if gap || rd.Next() <= stream.View().Head {
		answer()
		out, start = discard(), func(http.Header) bool { return true }
	}
	var own time.Time // until when a 409 is the proxy's own conflict
	if l, ok := p.(buffer.Lapsed); ok && l.Lapsed() {
		own = time.Now().Add(ownConflictBound)
	}
	t.holdCut = true
	res := t.openStandalone(r, out, start, own, answer)
	switch {
	case res.cut && !answered:
		// The proxy ended the upstream GET before its answer: a drain (the
		// next GET goes to another replica), the process stopping, the
		// session's end. reverse_proxy answers such a cancellation 499,
		// which is for a client that left, not for this one: the SDKs
		// take a non-2xx answer to a reconnect of the standalone stream
		// for a broken session (the Go SDK's "standalone SSE stream: ",
		// 499 having no status text). The client gets its stream, its
		// position first, and it ends as the drain ends the open ones: the
		// client reconnects.
		answer()
	case !res.tapped && !answered:
		rd.Close() // the upstream's answer went to the client (a 404 ended the session)
		return res.proxied
	}
	t.followStandalone(res)
	return nil
}

// openStandalone sends the upstream GET of the standalone stream; its
// answer goes to out (start at a stream). The previous GET of the session
// is closed by now, but an upstream notices a closed connection a moment
// later (1 to 40 ms measured, on a loaded machine, for the Go SDK server,
// which answers 409 meanwhile). So a 409 within noticeGrace of this
// runtime's own close of the session's previous GET is asked again after
// a pause.
//
// Until own (the producer role was taken from a lapsed lease: the previous
// holder may be frozen with its GET still open, and closes it once it runs
// again) a 409 is the proxy's own conflict too: the client waiting for the
// answer gets its stream now (answer), and the GET is asked again with
// backoff. Any other 409, and one past own, is the upstream's answer: for
// the client if it still waits, else the refusal ends the tap (the client's
// stream ends, its next GET asks again).
func (t *upstreamTap) openStandalone(r *http.Request, out http.ResponseWriter, start func(http.Header) bool,
	own time.Time, answer func()) attemptResult {
	sid := r.Header.Get(hdrSessionID)
	noticed := t.h.rt.closedGETs.closedAt(sid).Add(noticeGrace)
	defer func() { t.dropConflict = nil }()
	began, conflicts := time.Now(), 0
	for pause := 10 * time.Millisecond; ; {
		lapsed := false
		switch {
		case time.Until(noticed) > pause:
			t.dropConflict = func() bool { return time.Until(noticed) > pause }
		case time.Until(own) > pause:
			lapsed = true
			t.dropConflict = func() bool { return time.Until(own) > pause }
		default:
			t.dropConflict = nil
		}
		res := t.attempt(t.standaloneRequest(r), out, start, false)
		if !res.dropped {
			if conflicts > 0 && !res.tapped && !res.cut {
				upstreamReconnects.WithLabelValues("own_conflict_exhausted").Inc()
				t.h.logger.Warn("standalone GET not opened within the bound after a lapsed-lease takeover: the upstream's answer stands",
					zap.String("session", sid), zap.Int("conflicts", conflicts),
					zap.Duration("after", time.Since(began)), zap.Int("status", res.status))
			}
			return res
		}
		if !lapsed {
			t.h.logger.Debug("upstream answered 409 right after the proxy closed the session's previous GET: asked again",
				zap.String("session", sid))
			pause = min(2*pause, 200*time.Millisecond)
		} else {
			if conflicts == 0 {
				upstreamReconnects.WithLabelValues("own_conflict").Inc()
				t.h.logger.Info("upstream answered 409 after the standalone stream was taken from a lapsed lease: the previous producer's GET may still be open, asking again",
					zap.String("session", sid), zap.Duration("for_at_most", time.Until(own)))
			}
			conflicts++
			if answer != nil { // the client gets its stream now; the upstream's answer follows
				answer()
				answer, out = nil, discard()
			}
			n := conflicts
			start = func(http.Header) bool {
				t.h.logger.Info("upstream opened the standalone GET after the previous producer's GET closed",
					zap.String("session", sid), zap.Int("conflicts", n), zap.Duration("after", time.Since(began)))
				return true // the client has its stream (answered now, or before the first attempt)
			}
			pause = min(2*pause, time.Second)
		}
		if !t.sleep(pause) {
			res.cut = true // the 409 was held back: the client waiting has no answer
			return res
		}
	}
}

// ownConflictBound bounds how long after taking the standalone stream from
// a lapsed lease an upstream 409 is taken for the previous producer's GET,
// still open on a replica frozen past its lease: it closes that GET as soon
// as it runs again.
const ownConflictBound = 15 * time.Second

// noticeGrace bounds how long after the proxy closed a session's
// standalone GET the upstream may still take it for open.
const noticeGrace = time.Second

// closedGETs remember when this runtime last closed each session's
// standalone GET itself (not the upstream ending it), for noticeGrace.
type closedGETs struct {
	mu sync.Mutex
	m  map[string]time.Time
}

func (c *closedGETs) closed(sid string) {
	now := time.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	for id, at := range c.m {
		if now.Sub(at) > noticeGrace {
			delete(c.m, id)
		}
	}
	if c.m == nil {
		c.m = make(map[string]time.Time)
	}
	c.m[sid] = now
}

// closedAt is when sid's standalone GET was last closed here (zero if not
// within noticeGrace).
func (c *closedGETs) closedAt(sid string) time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.m[sid]
}

// handoverTimeout bounds the wait for the previous producer of a stream
// to close its upstream response: a few milliseconds on this replica; up
// to lease_ttl for one on a replica that died.
const handoverTimeout = 20 * time.Second

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

// adoptions serialise the adoptions of a session on this replica: the
// second finds the session the first adopted and relays its stream,
// instead of opening a second upstream GET.
type adoptions struct {
	mu sync.Mutex
	m  map[string]chan struct{} // closed when the session's adoption ends
}

// lock waits for the adoption of sid running here, if any (bounded by
// ctx), and starts this one; unlock ends it.
func (a *adoptions) lock(ctx context.Context, sid string) (unlock func(), err error) {
	for {
		a.mu.Lock()
		running := a.m[sid]
		if running == nil {
			if a.m == nil {
				a.m = make(map[string]chan struct{})
			}
			mine := make(chan struct{})
			a.m[sid] = mine
			a.mu.Unlock()
			return func() {
				a.mu.Lock()
				delete(a.m, sid)
				a.mu.Unlock()
				close(mine)
			}, nil
		}
		a.mu.Unlock()
		select {
		case <-running:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}
