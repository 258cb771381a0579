package resume

import (
	"context"
	"errors"
	"net/http"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/mcpresume/caddy-mcp-resume/buffer"
	"github.com/mcpresume/caddy-mcp-resume/internal/eventid"
	"github.com/mcpresume/caddy-mcp-resume/policy"
)

// serveGet handles GET text/event-stream: the standalone stream, and resumes
// (Last-Event-ID) of any stream, answered from the log. seen is the
// session authorize found.
func (h *Engine) serveGet(w http.ResponseWriter, r *http.Request, next Next, sid string, seen buffer.Session) error {
	sess, known := h.rt.store.Session(sid)
	if goOn, err := h.reauthorize(w, r, next, sid, policy.ReadsLog, seen, sess); !goOn {
		return err
	}
	if known && !resumable(sess.Meta().Version) {
		return next.ServeHTTP(w, r) // a session that is never tapped
	}
	lastID := r.Header.Get(hdrLastEventID)
	if lastID == "" {
		if !known {
			return next.ServeHTTP(w, r)
		}
		if h.refuseNew(w, "", false) {
			return nil
		}
		sess.Touch()
		return h.serveStandalone(w, r, next, sess, nil, nil, 0)
	}
	return h.serveResume(w, r, next, sid, sess, lastID)
}

// sessionEnded reports whether sess (looked up as sid) has ended since.
func (h *Engine) sessionEnded(sid string, sess buffer.Session) bool {
	if sess.Context().Err() != nil {
		return true
	}
	_, ok := h.rt.store.Session(sid)
	return !ok
}

// serveResume answers a GET with Last-Event-ID from what the proxy holds
// and remembers; policy.DecideResume says how.
func (h *Engine) serveResume(w http.ResponseWriter, r *http.Request, next Next,
	sid string, sess buffer.Session, lastID string) error {
	st := h.rt.store
	in := policy.ResumeInput{SessionHeader: true}
	cur, perr := eventid.Parse(lastID)
	if perr == nil {
		in.Cursor = policy.Cursor{Valid: true, Minted: eventid.Minted(st.Key(), sid, cur.Epoch),
			Epoch: cur.Epoch, Stream: cur.Stream, Seq: cur.Seq}
	}
	var stream buffer.Stream
	ack := cur.Seq
	if sess != nil {
		in.Session = policy.SessionView{Known: true, Epoch: sess.Epoch(), NextStream: sess.NextStream()}
		switch {
		case !in.Cursor.Minted:
		case cur.Epoch == sess.Epoch():
			var err error
			if stream, err = buffer.LookupStream(sess, cur.Stream); err != nil {
				// A shared store that could not read the stream: taken
				// for none, the cursor would be refused or given a gap.
				h.logger.Warn("resume refused: the shared store is unavailable", zap.String("session", sid), zap.Error(err))
				return h.refuse(w, refuseUnavailable, to{sid: sid, lastID: lastID})
			}
		default: // an earlier incarnation of the session
			if p, ok := sess.Past(cur.Epoch); ok {
				in.Past = pastView(p, cur.Stream)
			}
			if cur.Stream == policy.StandaloneNum {
				stream, ack = sess.Standalone(), 0 // the client has nothing of the current one
			}
		}
	} else if tomb, ok := st.Tombstone(sid); ok && in.Cursor.Minted {
		p := tomb.Past
		for _, e := range tomb.Earlier {
			if e.Epoch == cur.Epoch {
				p = e
			}
		}
		in.Past = pastView(p, cur.Stream)
	}

	var d policy.Resume
	var rd buffer.Reader
	if stream != nil {
		// Decide, acknowledge and attach in one step, so the floor cannot
		// move between the decision and the replay.
		var err error
		d, rd, err = stream.Resume(ack, func(v policy.StreamView) policy.Resume {
			in.Stream = &v
			return policy.DecideResume(in)
		})
		switch {
		case errors.Is(err, buffer.ErrStreamGone):
			// Retired while this resume read it: decided as for a stream
			// the session no longer has.
			in.Stream = nil
			d = policy.DecideResume(in)
		case errors.Is(err, buffer.ErrSessionGone):
			// The session ended meanwhile (a DELETE raced this resume):
			// answer as for any ended session, from its tombstone.
			return h.serveResume(w, r, next, sid, nil, lastID)
		case err != nil: // a shared store that cannot answer now
			h.logger.Warn("resume refused: the shared store is unavailable", zap.String("session", sid), zap.Error(err))
			return h.refuse(w, refuseUnavailable, to{sid: sid, lastID: lastID})
		}
	} else {
		d = policy.DecideResume(in)
	}
	if d.Kind == policy.Reject && sess != nil && h.sessionEnded(sid, sess) {
		// The session ended while this resume looked at it (a DELETE raced
		// it: a shared store's stream records go with the session, and a
		// cursor on a stream no longer there reads as one it never had):
		// answer as for any ended session, from its tombstone.
		if rd != nil {
			rd.Close()
		}
		return h.serveResume(w, r, next, sid, nil, lastID)
	}
	resumes.WithLabelValues(d.Kind.String()).Inc()
	if sess != nil && in.Cursor.Minted {
		sess.Confirm() // a cursor minted for it: an adopted session has proved itself
		sess.Touch()
	}
	logFields := []zap.Field{zap.String("session", sid), zap.Uint32("stream", cur.Stream), zap.Uint64("seq", cur.Seq),
		zap.String("outcome", d.Kind.String())}

	switch d.Kind {
	case policy.PassThrough:
		return next.ServeHTTP(w, r)
	case policy.Reject:
		return h.refuse(w, refuseCursor, to{sid: sid, lastID: lastID}, d.Detail) // policy refuses cursors with 400
	case policy.Adopt:
		return h.serveAdopt(w, r, next, sid, lastID, d.Reason)
	case policy.Ended:
		h.logger.Debug("resume", logFields...)
		w.WriteHeader(http.StatusNoContent) // nothing more will come: SSE clients stop reconnecting
		return nil
	case policy.Noop, policy.Replay:
		h.logger.Debug("resume", logFields...)
		return h.serveStream(w, r, next, sess, stream, rd, nil, stream.View().Head)
	}

	// A gap: signal it, then what follows.
	if d.Reason == policy.ReasonEvicted {
		st.Counters().ResumesFromEvicted.Add(1)
	}
	gaps.WithLabelValues(string(d.Reason)).Inc()
	h.logger.Warn("resume could not be answered in full: gap signalled",
		append(logFields, zap.String("reason", string(d.Reason)), zap.Int64("lost", d.Lost),
			zap.Strings("lost_request_ids", d.LostIDs))...)
	epoch, num, at := cur.Epoch, cur.Stream, cur.Seq // a hold leaves the cursor where it was
	switch {
	case stream != nil:
		epoch, num, at = sess.Epoch(), stream.Num(), d.From-1
	case d.Then == policy.ThenEnd:
		at = d.From - 1
	}
	moved := eventid.Append(nil, epoch, num, at)
	g := gapInfo{LastEventID: lastID, Lost: d.Lost, Reason: d.Reason}
	if stream != nil {
		g.ResumeFrom = string(eventid.Append(nil, epoch, num, d.From))
	}
	pre := gapPreamble(moved, g, d.LostIDs, d.Then == policy.ThenReplay)
	switch d.Then {
	case policy.ThenReplay:
		return h.serveStream(w, r, next, sess, stream, rd, pre, stream.View().Head)
	case policy.ThenHold:
		prepareSSEHeaders(w.Header())
		w.WriteHeader(http.StatusOK)
		w.Write(pre)
		http.NewResponseController(w).Flush()
		var done <-chan struct{}
		if sess != nil {
			done = sess.Context().Done()
		}
		h.hold(r.Context(), w, done, time.Duration(h.SessionIdleTimeout))
		return nil
	default: // ThenEnd
		prepareSSEHeaders(w.Header())
		w.WriteHeader(http.StatusOK)
		w.Write(pre)
		return nil
	}
}

// pastView is what policy needs of an earlier incarnation, for the
// cursor's stream.
func pastView(p buffer.Past, num uint32) *policy.PastView {
	v := &policy.PastView{Reason: p.Reason}
	if s, ok := p.Streams[num]; ok {
		v.Stream = &s
	}
	return v
}

// serveStream relays a resumed stream from rd, after pre. A standalone
// stream that no upstream GET feeds gets one (this request's).
func (h *Engine) serveStream(w http.ResponseWriter, r *http.Request, next Next, sess buffer.Session,
	stream buffer.Stream, rd buffer.Reader, pre []byte, replayUpTo uint64) error {
	if stream.Kind() == policy.StandaloneStream {
		return h.serveStandalone(w, r, next, sess, rd, pre, replayUpTo)
	}
	// This client's request (authorized for the session just now) is what
	// a takeover of the upstream read carries.
	return h.relayWith(w, r, sess, stream, rd, pre, replayUpTo, func() bool { return h.offerTakeover(r, next, sess, stream) })
}

// serveAdopt answers a resume of the standalone stream of a session the
// proxy does not hold, with a cursor it minted for that session: the proxy
// restarted, or the session expired or was purged here. If the upstream
// still knows the session (it answers a GET with a stream), the proxy takes
// it over: a gap event tells the client what was lost, then the session's
// standalone stream follows live. Otherwise the upstream's answer (typically
// 404: re-initialize) goes to the client, and nothing is held: a session is
// bound only to credentials the upstream accepted for it.
func (h *Engine) serveAdopt(w http.ResponseWriter, r *http.Request, next Next, sid, lastID string, reason policy.Reason) error {
	if h.identityMissing(r) {
		h.logger.Warn("session not adopted: its bind placeholders are empty for this request; passed through",
			zap.String("session", sid))
		return next.ServeHTTP(w, r)
	}
	version := r.Header.Get(hdrVersion)
	if version == "" {
		version = defaultVersion
	}
	// One adoption of a session runs at a time here, until the upstream
	// answered it; the upstream GET of an ended incarnation of the session
	// (here or on another replica) is closed before the adopting one opens.
	ctx, cancel := context.WithTimeout(r.Context(), handoverTimeout)
	defer cancel()
	unlock, err := h.rt.adoptions.lock(ctx, sid)
	if err != nil {
		return h.refuse(w, refuseStandalone, to{sid: sid, lastID: lastID})
	}
	unlock = sync.OnceFunc(unlock)
	defer unlock()
	if s, ok := h.rt.store.Session(sid); ok { // adopted meanwhile
		unlock()
		return h.serveAdopted(w, r, next, s, lastID, reason)
	}
	if err := h.rt.store.StandaloneClosed(ctx, sid); err != nil {
		h.logger.Warn("session not adopted: its previous upstream GET did not close in time",
			zap.String("session", sid), zap.Error(err))
		return h.refuse(w, refuseStandalone, to{sid: sid, lastID: lastID})
	}
	t := h.newTap(r, next, nil, version)
	defer t.close()
	defer context.AfterFunc(h.rt.drainCtx, t.cancel)()
	var existing buffer.Session // adopted meanwhile on another replica, or by a call
	var attachErr error         // adopted, but this client could not be attached
	start := func(http.Header) bool {
		s, err := h.rt.store.CreateSession(sid, h.sessionMeta(r, version, policy.Resumed))
		if errors.Is(err, buffer.ErrSessionExists) {
			existing, _ = h.rt.store.Session(sid)
			t.failure = err // drop this upstream GET: the session has its own
			return existing != nil
		}
		if err != nil {
			h.logger.Warn("session not adopted", zap.String("session", sid), zap.Error(err))
			return false
		}
		t.tie(s)
		stream := s.Standalone()
		p, err := stream.TakeProducer(t.ctx) // the session is new: no other producer
		if err == nil {
			t.produce(stream, p)
		}
		var rd buffer.Reader
		if err == nil {
			rd, err = stream.Attach(1)
		}
		if err != nil {
			// The session is adopted; this upstream GET is closed before
			// a byte of it is read (so nothing taken is lost) and the
			// client is told at once. Its next GET opens the stream again.
			attachErr, t.failure = err, err
			t.cancel()
			return true
		}
		t.startRelay(w, rd, h.adoptionGap(s, lastID, reason), 0)
		return true
	}
	// A new session here: its producer role comes with it, from no lease.
	t.holdCut = true
	res := t.openStandalone(r, w, start, time.Time{}, nil)
	unlock() // the upstream answered: the session is adopted, or not to be
	switch {
	case res.cut && !res.tapped && existing == nil && attachErr == nil:
		// The proxy ended the upstream GET before its answer (a drain, the
		// process stopping): nothing is adopted, and reverse_proxy's 499
		// for it is not for this client (see serveStandalone). The
		// connection is aborted, as a stopping reverse_proxy leaves it:
		// the client asks again, from the same cursor, elsewhere.
		panic(http.ErrAbortHandler)
	case attachErr != nil:
		return h.refuse(w, refuseStandalone, to{sid: sid, lastID: lastID})
	case existing != nil:
		h.rt.closedGETs.closed(sid) // this GET, dropped: the upstream notices a moment later
		return h.serveAdopted(w, r, next, existing, lastID, reason)
	case !res.tapped:
		return res.proxied // the upstream's answer went to the client
	}
	t.followStandalone(res)
	return nil
}

// serveAdopted serves the standalone stream of a session adopted by
// another request, to an adopting client: the gap, then the stream. A
// session found with the cursor's own epoch was never lost: the first
// look missed it (a shared store's read that failed, another replica's
// creation not yet visible), and it is answered as the resume it is.
func (h *Engine) serveAdopted(w http.ResponseWriter, r *http.Request, next Next, s buffer.Session, lastID string, reason policy.Reason) error {
	// The request was let through for a session unknown; this one is known
	// now, and holds a log: it is served only to its own credential.
	if goOn, err := h.authorize(w, r, next, s.ID(), policy.ReadsLog); !goOn {
		return err
	}
	if cur, err := eventid.Parse(lastID); err == nil && cur.Epoch == s.Epoch() {
		return h.serveResume(w, r, next, s.ID(), s, lastID)
	}
	rd, err := s.Standalone().Attach(1)
	if err != nil {
		return h.refuse(w, refuseStandalone, to{sid: s.ID(), lastID: lastID})
	}
	return h.serveStandalone(w, r, next, s, rd, h.adoptionGap(s, lastID, reason), 0)
}

// adoptionGap is the preamble of an adopted session's standalone stream:
// the client's cursor moves to the stream's start, and it is told that
// what came before is lost.
func (h *Engine) adoptionGap(s buffer.Session, lastID string, reason policy.Reason) []byte {
	moved := eventid.Append(nil, s.Epoch(), policy.StandaloneNum, 0)
	gaps.WithLabelValues(string(reason)).Inc()
	h.logger.Warn("session adopted after a resume the proxy could not answer: gap signalled",
		zap.String("session", s.ID()), zap.String("last_event_id", truncate(lastID, 80)), zap.String("reason", string(reason)))
	return gapPreamble(moved, gapInfo{LastEventID: lastID, ResumeFrom: string(moved), Lost: -1, Reason: reason}, nil, true)
}
