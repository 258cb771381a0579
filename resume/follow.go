package resume

// Following the upstream: when its response ends before the call is
// answered (SEP-1699 polling, a dropped connection), or its standalone
// stream ends while the session lives, the tap asks again with GET and the
// upstream's own Last-Event-ID, into the same stream, until it is answered
// or fails (failureReason: why a stream cannot go on). The follower also
// takes a call over from a replica that died (takeOver), and takes its own
// back once the store is reachable again (takeBack).

import (
	"context"
	"errors"
	"net/http"
	"time"

	"go.uber.org/zap"

	"github.com/mcpresume/caddy-mcp-resume/buffer"
	"github.com/mcpresume/caddy-mcp-resume/internal/sse"
	"github.com/mcpresume/caddy-mcp-resume/policy"
)

// reconnectRequest is the GET that resumes the upstream's stream: the
// client's headers (session, version, credentials), the upstream's own
// Last-Event-ID when it gave one.
func (t *upstreamTap) reconnectRequest() *http.Request {
	// The freshest credential a client of the session brought: the
	// request the tap began with may carry a token that expired since.
	req := t.h.rt.freshest.with(t.client, t.sess).Clone(t.ctx)
	if t.takeover {
		// The client request is a resume, or a repeat, on any path under
		// the route: the upstream's stream is the session's endpoint's.
		atEndpoint(req, t.sess.Meta().Endpoint)
	}
	req.Method = http.MethodGet
	req.Body, req.ContentLength, req.GetBody = http.NoBody, 0, nil
	for _, k := range []string{"Content-Type", "Content-Length", "Accept-Encoding", hdrLastEventID, "Expect"} {
		req.Header.Del(k)
	}
	req.Header.Set("Accept", "text/event-stream")
	if t.lastID != "" {
		req.Header.Set(hdrLastEventID, t.lastID)
	}
	return req
}

// delay is how long to wait before reconnect attempt n (from 0): the
// upstream's retry: if it sent one, else a backoff.
func (t *upstreamTap) delay(n int) time.Duration {
	if t.retry > 0 {
		return min(t.retry, reconnectMax)
	}
	d := reconnectFirst
	for i := 0; i < n && d < reconnectMax; i++ {
		d = d * 3 / 2
	}
	return min(d, reconnectMax)
}

// retryDelay is an upstream's retry: field (milliseconds) as a wait, at
// most reconnectMax: compared before it is multiplied, so no value (the
// parser takes any digits, saturating at math.MaxInt64) wraps around into
// a short wait; the upstream that asked for the longest gets the longest.
func retryDelay(ms int64) time.Duration {
	if ms >= int64(reconnectMax/time.Millisecond) {
		return reconnectMax
	}
	return time.Duration(ms) * time.Millisecond
}

func (t *upstreamTap) sleep(d time.Duration) bool {
	tm := time.NewTimer(d)
	defer tm.Stop()
	select {
	case <-tm.C:
		return true
	case <-t.ctx.Done():
		return false
	}
}

// followRequest keeps a request stream fed until each of its requests is
// answered: after the first response ends early, it resumes the upstream's
// stream with GETs, within maxReconnects attempts without progress and
// never past stall_timeout without progress; else the stream fails loudly.
// attempts is how many of those first was (a takeover's first is one).
func (t *upstreamTap) followRequest(first attemptResult, attempts int) {
	res := first
	lastProgress := time.Now()
	for {
		switch {
		case t.failure != nil || res.proxied != nil && res.tapped:
			t.fail(t.failureReason(t.failure, res.broken))
			return
		case len(t.pending) == 0:
			t.stream.Complete()
			return
		case t.ctx.Err() != nil:
			return // the session ended, or the runtime stopped
		case t.h.sessionGone(t.sess.ID(), res.status):
			return
		case res.tapped && t.lastID == "":
			// Ended early with no way to ask for the rest.
			t.fail(t.failureReason(nil, res.broken))
			return
		case !res.tapped && attempts > 0 && policy.Classify(res.status).Refused():
			// Counted and logged as refused with its attempt.
			if t.credentialRefused(res.status) {
				// Let go: the client's next resume gets the upstream's
				// verdict; a fresher credential brought here takes it back.
				t.h.takeBack(t.client, t.next, t.sess, t.stream)
				return
			}
			t.fail(policy.ReasonUpstreamFailed)
			return
		}
		if t.progress {
			attempts, lastProgress = 0, time.Now()
		}
		d := t.delay(attempts)
		if attempts >= maxReconnects || time.Since(lastProgress)+d > time.Duration(t.h.StallTimeout) {
			upstreamReconnects.WithLabelValues("exhausted").Inc()
			t.h.logger.Warn("upstream reconnects exhausted: stream failed",
				zap.String("session", t.sess.ID()), zap.Uint32("stream", t.stream.Num()),
				zap.String("upstream_last_event_id", truncate(t.lastID, 80)), zap.Int("attempts", attempts))
			t.fail(policy.ReasonUpstreamFailed)
			return
		}
		if !t.sleep(d) {
			return
		}
		attempts++
		res = t.attempt(t.reconnectRequest(), discard(), func(http.Header) bool { return true }, true)
		t.h.reconnected(t, attempts, res, "")
	}
}

// reconnected logs and counts one reconnect attempt.
func (h *Engine) reconnected(t *upstreamTap, attempt int, res attemptResult, outcome string) {
	if outcome == "" {
		switch {
		case res.tapped:
			outcome = "resumed"
		case policy.Classify(res.status).Refused():
			outcome = "refused"
		default:
			outcome = "failed"
		}
	}
	upstreamReconnects.WithLabelValues(outcome).Inc()
	t.lastStatus = res.status
	if t.takeover && !t.takeoverCounted && res.tapped {
		t.takeoverCounted = true
		takeovers.WithLabelValues("resumed").Inc()
	}
	fields := []zap.Field{zap.String("session", t.sess.ID()), zap.Uint32("stream", t.stream.Num()),
		zap.String("upstream_last_event_id", truncate(t.lastID, 80)), zap.Int("attempt", attempt),
		zap.String("outcome", outcome), zap.Int("status", res.status)}
	if res.proxied != nil {
		fields = append(fields, zap.NamedError("error", res.proxied))
	}
	h.logger.Info("upstream reconnect", fields...)
}

// followStandalone keeps the standalone stream fed while the session lives:
// when the upstream's GET ends it reconnects (with its Last-Event-ID if it
// gave IDs; without, while a client reads the stream), so a server that
// closes its GET stream on purpose or a dropped connection loses nothing
// the upstream can resend. It stops on the session's end, a refusal, a
// failure of the stream (its signal is in the log), or maxReconnects
// attempts without progress; the next client GET starts it again.
func (t *upstreamTap) followStandalone(first attemptResult) {
	res := first
	attempts := 0
	for {
		if t.failure != nil {
			t.fail(t.failureReason(t.failure, res.broken))
			return
		}
		if t.ctx.Err() != nil || t.h.sessionGone(t.sess.ID(), res.status) || policy.Classify(res.status).Refused() && !res.tapped {
			return
		}
		if res.tapped && t.lastID == "" && !t.stream.Connected() {
			return // nothing to catch up on and no one waiting: the next client GET reopens it
		}
		// Only events for clients under upstream IDs reset the count, or a
		// clean 200 held open long enough not to be a spin. A GET that ends
		// at once with nothing (a server without GET streams that answers an
		// empty body instead of 405), with a priming event only (one that
		// polls), or with events but no IDs (each reconnect is a fresh GET
		// that sends them again) brought nothing a reconnect could continue,
		// so the backoff applies and the limit ends it: the client's next
		// GET, at its own pace, starts a new round.
		if t.resumable || res.tapped && res.status == http.StatusOK && !res.broken && res.lasted >= reconnectMax {
			attempts = 0
		}
		if attempts >= maxReconnects {
			// The tap lets go of the stream: a connected client's response
			// ends cleanly (as reverse_proxy passes an empty 200 on) and its
			// next GET, at its own pace, asks the upstream again.
			upstreamReconnects.WithLabelValues("exhausted").Inc()
			t.h.logger.Warn("upstream standalone GET brought nothing new: stopped asking",
				zap.String("session", t.sess.ID()), zap.String("upstream_last_event_id", truncate(t.lastID, 80)),
				zap.Int("attempts", attempts), zap.Int("status", res.status))
			return
		}
		if !t.sleep(t.delay(attempts)) {
			return
		}
		attempts++
		res = t.attempt(t.reconnectRequest(), discard(), func(http.Header) bool { return true }, false)
		t.h.reconnected(t, attempts, res, "")
	}
}

// discardWriter is where a reconnect's response goes when it is not
// tapped: nowhere (the client's response is the relay's).
type discardWriter struct{ h http.Header }

func discard() *discardWriter                        { return &discardWriter{h: http.Header{}} }
func (d *discardWriter) Header() http.Header         { return d.h }
func (d *discardWriter) Write(p []byte) (int, error) { return len(p), nil }
func (d *discardWriter) WriteHeader(int)             {}

// failureReason maps why a stream cannot go on to its reason; "" means the
// stream needs no failure of its own (its session ended, the runtime stopped).
func (t *upstreamTap) failureReason(err error, broken bool) policy.Reason {
	var fe *buffer.FailedError
	switch {
	case errors.As(err, &fe):
		return fe.Reason
	case errors.Is(err, errTooLarge), errors.Is(err, sse.ErrEventTooLarge):
		limitsHit.WithLabelValues("max_event_bytes").Inc()
		return policy.ReasonTooLarge
	case t.ctx.Err() != nil, errors.Is(err, buffer.ErrStreamEnded), errors.Is(err, buffer.ErrSessionGone):
		return ""
	case err != nil, broken:
		return policy.ReasonUpstreamFailed
	}
	return policy.ReasonUpstreamClosed
}

// Taking a call's upstream read over when the replica that read it died
// (natsstore/DESIGN.md, "Takeover"): a client reads the request stream on
// this replica, its reader finds no producer (buffer.ErrProducerGone), and
// the stream recorded the upstream's own event ID with what it stored. The
// follower then runs here: GET with Last-Event-ID: that ID, into the same
// stream, with the headers of the client request that reads it (its
// credentials were just authorized for the session: the store keeps
// none), until the call is answered or fails loudly.

// takeOver starts reading the upstream for stream, whose producer is gone,
// if it can be resumed and this replica gets the producer role (exactly
// one does). r is the request of the client reading the stream here; next
// reaches the upstream. It returns at once: the relay reads what the new
// producer stores.
func (h *Engine) takeOver(r *http.Request, next Next, sess buffer.Session, stream buffer.Stream) (over bool) {
	to, ok := stream.(buffer.Takeover)
	if !ok || stream.Kind() != policy.RequestStream || stream.View().State != policy.Live {
		return true
	}
	if stream.UpstreamCursor() == "" {
		return true // nothing to resume the upstream from: the sweeper ends the stream at lease_ttl
	}
	ctx, cancel := context.WithTimeout(h.rt.stopCtx, 10*time.Second) // a producer here asked to stop is waited for
	p, who, err := to.TakeOver(ctx)
	cancel()
	if err != nil {
		h.logger.Debug("takeover not taken", zap.String("session", sess.ID()), zap.Uint32("stream", stream.Num()), zap.Error(err))
		return false
	}
	// The upstream GET carries the freshest credential a client of the
	// session brought here: r may be the first POST of a call this
	// replica takes back, its token expired since.
	t := h.newTap(h.rt.freshest.with(r, sess), next, sess, sess.Meta().Version)
	t.produce(stream, p)
	t.takeover = true
	t.lastID = stream.UpstreamCursor() // the fence is stored: this is exactly what the store holds
	t.takeoverFrom = t.lastID
	for _, q := range stream.View().Requests {
		if q.AnsweredAt == 0 {
			t.pending = append(t.pending, q.ID)
		}
	}
	h.logger.Info("request stream taken over", zap.String("session", sess.ID()), zap.Uint32("stream", stream.Num()),
		zap.String("replica", who.Current), zap.String("previous_replica", who.Previous),
		zap.String("upstream_last_event_id", truncate(t.lastID, 80)), zap.Strings("pending", t.pending))
	h.rt.reads.Add(1) // a stopping process drains it like any call it reads
	go func() {
		defer h.rt.reads.Add(-1)
		defer t.close()
		defer func() {
			// No net/http here to recover a panic of the next handler (an
			// in-process upstream's bug): the process must not go with it.
			// Its stream fails loudly (the tap did already, if tapping).
			if p := recover(); p != nil && t.stream.View().State == policy.Live {
				h.logger.Error("the upstream handler panicked: its stream fails", zap.String("session", sess.ID()),
					zap.Uint32("stream", stream.Num()), zap.Any("panic", p))
				t.fail(policy.ReasonUpstreamFailed)
			}
		}()
		if len(t.pending) == 0 {
			// Its producer stored every answer and died before the end.
			t.stream.Complete()
			takeovers.WithLabelValues("complete").Inc()
			return
		}
		t.seedRecent(stream)
		res := t.attempt(t.reconnectRequest(), discard(), func(http.Header) bool { return true }, true)
		t.h.reconnected(t, 1, res, "")
		t.followRequest(res, 1)
		if !t.takeoverCounted && policy.Classify(t.lastStatus) == policy.UpstreamSessionGone {
			t.takeoverFailed() // a 404 ended the session: its clients got the gap and -32010
		}
	}()
	return true
}

// credentialRefused handles the upstream's 401 to a GET that
// resumes a request stream: a credential that expired while the proxy
// read on (the client refreshes on a 401, which it has not seen). When the
// upstream refuses the same credential a ping on the session too (so it
// is the credential, not the resume, it refuses), and another producer
// can take the stream over (a shared store), the tap lets go of the
// stream, which stays live: the credential is remembered as refused for
// the session, a relay here whose takeover would carry it cuts its client
// (offerTakeover), and a client that comes back with it gets the
// upstream's verdict (policy.Authorize: UpstreamRefused), refreshes, and
// the call is taken over with the new one. Within the orphan's bound
// (takeover_wait): past it the sweeper fails the call explicitly.
func (t *upstreamTap) credentialRefused(status int) bool {
	if status != http.StatusUnauthorized || t.lastID == "" {
		return false // a 403 (no refresh helps, a step-up may not come): today's explicit failure
	}
	if hasBearer(t.sess.Meta().Bind) && t.h.rebindMode() == policy.RebindOff {
		return false // a refreshed token would be another owner: no refresh helps
	}
	if !primes(t.sess.Meta().Version) {
		// The cut of a client at the stream's head must carry its position
		// (relay.cut), which only sessions that prime may be sent.
		return false
	}
	if _, ok := t.stream.(buffer.Takeover); !ok {
		return false // no one could take it over: today's explicit failure
	}
	req := t.reconnectRequest()
	if verdict, _ := t.h.askUpstream(req, t.next, t.sess.ID(), t.sess.Meta(), false); verdict != policy.Refused {
		return false // the upstream accepts the credential and refuses the resume itself
	}
	t.h.rt.freshest.refuse(t.sess, t.h.credentialHash(req))
	if t.takeover {
		t.takeoverCounted = true
		takeovers.WithLabelValues("credential_refused").Inc()
	}
	t.h.logger.Info("upstream refused the credential a resume of its stream carried: the client must refresh it",
		zap.String("session", t.sess.ID()), zap.Uint32("stream", t.stream.Num()), zap.Int("status", status),
		zap.Bool("takeover", t.takeover), zap.String("upstream_last_event_id", truncate(t.lastID, 80)))
	return true
}

// offerTakeover is a relay's takeover of a request stream whose producer
// is gone (takeOver), unless the credential it would carry is one the
// upstream refused for the session: then false, and the relay cuts its
// client, so that it comes back and gets the upstream's verdict.
func (h *Engine) offerTakeover(r *http.Request, next Next, sess buffer.Session, stream buffer.Stream) bool {
	if h.takeoverRefused(r, sess) {
		return false
	}
	h.takeOver(r, next, sess, stream)
	return true
}

// takeoverRefused reports whether the credential a takeover for r would
// carry is one the upstream refused for sess.
func (h *Engine) takeoverRefused(r *http.Request, sess buffer.Session) bool {
	if !h.rt.freshest.hasRefusals(sess.ID()) {
		return false
	}
	return h.rt.freshest.refused(sess.ID(), h.credentialHash(h.rt.freshest.with(r, sess)))
}

// takeBackLimit bounds how long a replica waits to take back a call whose
// producer it stopped for want of the store: by then the sweeper has
// failed the call, or a client's replica has taken it over.
const takeBackLimit = 10 * time.Minute

// takeBack takes a call over on this replica once the store is back, when
// its producer here stopped itself for want of the store (cut off from
// NATS, it let the upstream response go so that another replica could
// take over) and the stream is still live: with its client away, no
// reader would ask for a takeover, and the call would fail although the
// upstream keeps its events. A client's replica that takes it over first
// wins (the lease decides); the stream's end, the session's, or a drain
// ends the wait.
func (h *Engine) takeBack(r *http.Request, next Next, sess buffer.Session, stream buffer.Stream) {
	go func() {
		// Not one of the runtime's reads while it waits: a drain does not
		// wait for it (it ends with the drain's start); the takeover's
		// own read counts once it runs.
		deadline := time.NewTimer(takeBackLimit)
		defer deadline.Stop()
		pause := takeoverPauseMin
		for {
			t := time.NewTimer(pause)
			select {
			case <-h.rt.drainCtx.Done():
			case <-sess.Context().Done():
			case <-deadline.C:
			case <-t.C:
				if stream.View().State != policy.Live {
					return
				}
				if st, ok := h.rt.Store(); ok && buffer.Available(st) == nil && !h.takeoverRefused(r, sess) &&
					h.takeOver(r, next, sess, stream) {
					return
				}
				pause = min(2*pause, takeoverPauseMax)
				continue
			}
			t.Stop()
			return
		}
	}()
}

// takeoverSeed bounds the stored events a takeover reads back for its
// repeat filter: an upstream's replay resends the event at the cursor "or
// a few before it" (policy.UpstreamRepeat); a store keeps buffer.TailKeep
// of them past their eviction, and reading as many (a message each, at
// worst) stays a small, one-off cost of a takeover, never of a call.
const takeoverSeed = buffer.TailKeep

// seedRecent gives a takeover's repeat filter what the stream holds: the
// last stored events' upstream IDs with the sums of their stored fields,
// as if this tap had taken them from an earlier response (conn 0), so
// what the upstream's replay from the cursor resends (same ID, same
// content) is dropped, and an event that reuses an ID with other content
// is not. Notes need none: a replayed priming event has no data, and is
// passed, not stored, either way. A store without the capability, or a
// read that fails, leaves the filter empty: the replay's repeats get
// through.
func (t *upstreamTap) seedRecent(stream buffer.Stream) {
	tl, ok := stream.(buffer.UpstreamTail)
	if !ok {
		return
	}
	ctx, cancel := context.WithTimeout(t.ctx, 10*time.Second)
	defer cancel()
	var seeds []taken
	err := tl.UpstreamTail(ctx, takeoverSeed, func(e buffer.TailEvent) {
		seeds = append(seeds, taken{id: e.ID, sum: e.Sum, conn: 0, stored: true})
	})
	if err != nil {
		t.h.logger.Warn("the stored events before the upstream cursor could not be read; the upstream's replay may repeat some",
			zap.String("session", t.sess.ID()), zap.Uint32("stream", t.stream.Num()), zap.Error(err))
		return
	}
	t.recent = append(seeds[max(0, len(seeds)-recentUpstream):], t.recent...)
}
