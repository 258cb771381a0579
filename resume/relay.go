package resume

import (
	"context"
	"errors"
	"io"
	"net/http"
	"slices"
	"time"

	"go.uber.org/zap"

	"github.com/mcpresume/caddy-mcp-resume/buffer"
	"github.com/mcpresume/caddy-mcp-resume/internal/eventid"
	"github.com/mcpresume/caddy-mcp-resume/internal/sse"
	"github.com/mcpresume/caddy-mcp-resume/policy"
)

// The way from a log to a client, and all a client is written: the SSE
// response headers, the preamble (priming, or a gap's signals), the relay
// that follows the log (in the request's goroutine, relayTo, or beside a
// tap, startRelay), keep-alives, the hold of a response with nothing to
// send, and the cut of a connection another one took over.

// relayBatch bounds the bytes a relay takes from the log per write: a
// blocked client pins at most this outside the log's byte bounds (a single
// larger event is written alone).
const relayBatch = 256 << 10

// relay writes a stream's log to one client, from the reader's position,
// until the stream ends, the client goes, or another connection takes over.
// It is the only path from the log to a client.
type relay struct {
	h      *Engine
	w      http.ResponseWriter
	rc     *http.ResponseController
	sess   buffer.Session
	stream buffer.Stream
	rd     buffer.Reader
	// replayUpTo is the stream's head when a resume arrived: events up to
	// it are replays (counted), later ones are live.
	replayUpTo uint64
	dst        [][]byte
	delivered  uint64 // the last seq written to the client
	// wroteEvents: events went to the client on this connection (each
	// with its ID).
	wroteEvents bool
	// takeover, if set, is called when the reader of a request stream finds
	// its producer gone (a shared store's producer replica died): this
	// replica may take the upstream read over (takeover.go).
	// false means the client must come back with another credential: the
	// relay cuts it.
	takeover func() bool
	// tookOverAt and takeoverPause pace repeated attempts: a reader that
	// finds the producer still gone right after one (NATS still out of
	// reach, another replica in the middle of its own) is not a reason to
	// try again at once.
	tookOverAt    time.Time
	takeoverPause time.Duration
	// headersHeld: the response's headers wait for its first bytes (an
	// older version's resume of a request stream, see relayWith): no
	// keep-alive goes meanwhile, and a cut then sends none.
	headersHeld bool
}

// Bounds of the pause between two takeover attempts of one relay.
const (
	takeoverPauseMin = 100 * time.Millisecond
	takeoverPauseMax = 2 * time.Second
)

// paceTakeover waits, if the last attempt was recent, until the next may
// run; false means the client went meanwhile.
func (rl *relay) paceTakeover(ctx context.Context) bool {
	if !rl.tookOverAt.IsZero() {
		if wait := rl.takeoverPause - time.Since(rl.tookOverAt); wait > 0 {
			t := time.NewTimer(wait)
			defer t.Stop()
			select {
			case <-ctx.Done():
				return false
			case <-t.C:
			}
		}
		rl.takeoverPause = min(2*rl.takeoverPause, takeoverPauseMax)
	} else {
		rl.takeoverPause = takeoverPauseMin
	}
	rl.tookOverAt = time.Now()
	return true
}

func (h *Engine) newRelay(w http.ResponseWriter, sess buffer.Session, stream buffer.Stream, rd buffer.Reader) *relay {
	return &relay{h: h, w: w, rc: http.NewResponseController(w), sess: sess, stream: stream, rd: rd,
		dst: make([][]byte, 0, 8)}
}

// write sends b and flushes; false means the client is gone.
func (rl *relay) write(b ...[]byte) bool {
	return rl.put(b...) && rl.rc.Flush() == nil
}

// put sends b without flushing (the response's end flushes it, with
// the end of its body); false means the client is gone.
func (rl *relay) put(b ...[]byte) bool {
	for _, p := range b {
		if _, err := rl.w.Write(p); err != nil {
			return false
		}
		rl.headersHeld = false // they went with it
	}
	return true
}

// run relays until the end; ctx is the client's.
func (rl *relay) run(ctx context.Context) {
	defer rl.rd.Close()
	rl.delivered = rl.rd.Next() - 1
	if rl.finishReady() {
		return
	}
	// The process stopping ends the relay too: cut, so the client resumes
	// (on another replica, when the store is shared).
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(rl.h.rt.stopCtx, cancel)()
	idle := time.Duration(rl.h.Keepalive)
	for {
		b, err := rl.rd.Read(ctx, rl.dst, relayBatch, idle)
		if len(b.Data) > 0 && !rl.deliver(b, true) {
			return
		}
		if err != nil && !rl.handle(ctx, err) {
			return
		}
	}
}

// finishReady writes what is ready, where the reader can tell without
// waiting, and reports whether the relay is over (the stream complete, or
// the client gone): a short call's relay, finished in the tap's goroutine
// once the tap is done (handoff.go), ends there without the contexts a wait
// needs. Anything else is run's to handle.
func (rl *relay) finishReady() bool {
	ready, ok := rl.rd.(buffer.ReadyReader)
	if !ok {
		return false
	}
	for {
		b, _, err := ready.ReadReady(rl.dst, relayBatch)
		if len(b.Data) > 0 && !rl.deliver(b, true) {
			return true
		}
		if err != nil {
			return err == io.EOF
		}
	}
}

// deliver writes a batch read from the log to the client and acknowledges
// it, flushed unless it is to go out with the response's end; false means
// the client is gone.
func (rl *relay) deliver(b buffer.Batch, flush bool) bool {
	ok := rl.put(b.Data...) && (!flush || rl.rc.Flush() == nil)
	clear(b.Data) // keep no event alive past its eviction
	if !ok {
		return false
	}
	rl.rd.Delivered(b.Last)
	rl.delivered, rl.wroteEvents = b.Last, true
	rl.tookOverAt = time.Time{} // events flow: a later death is paced afresh
	if rl.replayUpTo > 0 && b.First <= rl.replayUpTo {
		replayed.Add(float64(min(b.Last, rl.replayUpTo) - b.First + 1))
	}
	return true
}

// handle answers what a Read of the log ended with; false ends the relay.
func (rl *relay) handle(ctx context.Context, err error) bool {
	switch {
	case rl.h.rt.stopCtx.Err() != nil:
		rl.cut()
		return false
	case ctx.Err() != nil:
		// The client is gone, or it shut its side of the connection and
		// still reads (net/http cancels the request either way): cut, as
		// plain reverse_proxy aborts, never a clean end, which such a
		// client would take for the call answered with nothing. The log
		// keeps what it missed.
		rl.cut()
		return false
	case errors.Is(err, buffer.ErrIdle):
		return rl.headersHeld || rl.write(sse.AppendComment(nil, "keepalive"))
	case errors.Is(err, buffer.ErrTakenOver):
		abortClient(rl.w)
		return false
	case rl.sess.Context().Err() != nil || errors.Is(err, buffer.ErrSessionGone):
		// The session ended under the client (its DELETE, the upstream's
		// 404, a purge): its events went with it. A shared store's reader
		// may learn it before the session's context ends (the record's
		// deletion reaches the stream first).
		rl.sessionEnded()
		return false
	case errors.Is(err, buffer.ErrProducerGone) && rl.stream.Kind() == policy.RequestStream:
		// The replica reading its upstream died. Read on: what a takeover
		// (here or on another replica) stores, or the sweeper's explicit
		// failure.
		if rl.takeover != nil {
			if !rl.paceTakeover(ctx) {
				rl.cut() // the client went (or the process stops) meanwhile: as above
				return false
			}
			if !rl.takeover() {
				rl.cut()
				return false
			}
		}
		return true
	case errors.Is(err, buffer.ErrBelowFloor):
		return rl.recoverBelowFloor()
	default:
		// io.EOF (complete), *FailedError (the failure's signals are in the
		// log, already written), ErrProducerGone (the client should
		// reconnect, which opens a new upstream GET), ErrSessionGone.
		var fe *buffer.FailedError
		if err != io.EOF && !errors.As(err, &fe) && !errors.Is(err, buffer.ErrProducerGone) &&
			!errors.Is(err, buffer.ErrSessionGone) {
			rl.h.logger.Error("relay: unexpected reader error", zap.String("session", rl.sess.ID()),
				zap.Uint32("stream", rl.stream.Num()), zap.Error(err))
		}
		return false
	}
}

// cut ends the client's connection so that it resumes: a stopping
// process, a takeover the client's credential cannot make. Cut before any
// event with an ID on this connection (a resume at head, or one that came
// as a drain began), the client's own position first, an ID with no data,
// which no SSE client dispatches. The Go SDK takes a stream cut with no ID
// in it for the call lost; with it, it resumes again. Only for versions
// whose streams start with a priming event: older clients get no event
// without data anywhere (some parsers dispatch one, and their clients fail
// on its empty data).
func (rl *relay) cut() {
	if rl.headersHeld {
		abortClient(rl.w) // no headers: a request failed, made again
		return
	}
	rl.rc.Flush() // what the tap wrote to go out with the response's end (handoff.go)
	if !rl.wroteEvents && primes(rl.sess.Meta().Version) {
		rl.write(sse.AppendID(nil, string(eventid.Append(nil, rl.sess.Epoch(), rl.stream.Num(), rl.delivered))), []byte("\n"))
	}
	abortClient(rl.w)
}

// recoverBelowFloor handles a reader whose next events were evicted under
// it. That must never happen (the store counts it as events evicted before
// ack); if it does, the client still gets the gap signal, never silence, and
// the relay goes on from the floor.
func (rl *relay) recoverBelowFloor() bool {
	v := rl.stream.View()
	epoch, num := rl.sess.Epoch(), rl.stream.Num()
	rl.h.logger.Error("BUG: a relay found its next events evicted: gap signalled",
		zap.String("session", rl.sess.ID()), zap.Uint32("stream", num), zap.Uint64("floor", v.Floor))
	gaps.WithLabelValues(string(policy.ReasonEvicted)).Inc()
	moved := eventid.Append(nil, epoch, num, v.Floor-1)
	g := gapInfo{LastEventID: string(moved), Lost: -1, Reason: policy.ReasonEvicted}
	var lost []string
	for _, r := range v.Requests {
		if r.AnsweredAt != 0 && r.AnsweredAt < v.Floor {
			lost = append(lost, r.ID)
		}
	}
	if !rl.write(gapPreamble(moved, g, lost, rl.stream.Kind() == policy.StandaloneStream)) {
		return false
	}
	rd, err := rl.stream.Attach(v.Floor)
	if err != nil {
		return false
	}
	rl.rd.Close()
	rl.rd = rd
	return true
}

// sessionEnded tells a client reading a request stream whose session
// ended that the answers it was still owed are gone, never a clean end
// with nothing: the gap event with the session's reason (deleted, purged),
// then a JSON-RPC error (-32010) for each request whose answer it has not
// been sent, so the call fails now. A client that was sent every answer,
// or reads the standalone stream, just sees the end: its next request gets
// the upstream's 404 and re-initializes.
func (rl *relay) sessionEnded() {
	if rl.stream.Kind() != policy.RequestStream {
		return
	}
	var lost []string
	for _, r := range rl.stream.View().Requests {
		if r.AnsweredAt == 0 || r.AnsweredAt > rl.delivered {
			lost = append(lost, r.ID)
		}
	}
	if len(lost) == 0 {
		return
	}
	reason := policy.ReasonDeleted
	if tomb, ok := rl.h.rt.store.Tombstone(rl.sess.ID()); ok && tomb.Reason != "" {
		reason = tomb.Reason
	}
	gaps.WithLabelValues(string(reason)).Inc()
	at := eventid.Append(nil, rl.sess.Epoch(), rl.stream.Num(), rl.delivered)
	rl.h.logger.Info("session ended under a running call: its requests failed",
		zap.String("session", rl.sess.ID()), zap.Uint32("stream", rl.stream.Num()),
		zap.String("reason", string(reason)), zap.Strings("requests", lost))
	rl.write(gapPreamble(at, gapInfo{LastEventID: string(at), Lost: -1, Reason: reason}, lost, false))
}

// hold keeps a response open with keep-alives and sends nothing else, until
// the client leaves, done closes or d passes: for a resume whose stream the
// proxy knows nothing of, where ending the response would only make the
// client reconnect and ask again.
func (h *Engine) hold(ctx context.Context, w http.ResponseWriter, done <-chan struct{}, d time.Duration) {
	rc := http.NewResponseController(w)
	tick := time.NewTicker(time.Duration(h.Keepalive))
	defer tick.Stop()
	limit := time.NewTimer(d)
	defer limit.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-done:
			return
		case <-limit.C:
			return
		case <-h.rt.stopCtx.Done():
			return
		case <-tick.C:
			if _, err := w.Write(sse.AppendComment(nil, "keepalive")); err != nil || rc.Flush() != nil {
				return
			}
		}
	}
}

// abortClient cuts a connection that another one took over, so its client
// notices: an abort, not a clean end, since older clients reconnect only on
// errors. HTTP/1 closes the connection; HTTP/2 (which cannot be hijacked)
// gets its stream reset by a write deadline in the past.
func abortClient(w http.ResponseWriter) {
	rc := http.NewResponseController(w)
	if conn, _, err := rc.Hijack(); err == nil {
		conn.Close()
		return
	}
	rc.SetWriteDeadline(time.Unix(1, 0))
	rc.Flush()
}

// prepareSSEHeaders sets what every SSE response from the proxy carries. The
// body length is the proxy's business now, and intermediaries must not
// buffer or transform it.
func prepareSSEHeaders(h http.Header) {
	v := [...]string{"text/event-stream", "no-cache, no-transform", "no"} // one allocation for the three
	h["Content-Type"], h["Cache-Control"], h["X-Accel-Buffering"] = v[0:1:1], v[1:2:2], v[2:3:3]
	h.Del("Content-Length")
	h.Del("Content-Encoding")
}

// gapPreamble is what a resume that met a gap writes before anything else:
// the gap event under id (moving the client's cursor), then an error for
// each lost request, or a warning when the stream goes on.
func gapPreamble(id []byte, g gapInfo, lostIDs []string, goesOn bool) []byte {
	out := sse.AppendID(nil, string(id))
	out = append(gapFields(out, g), '\n')
	for _, rid := range lostIDs {
		out = append(lostFields(out, rid, g.Reason, g.LastEventID, g.Lost), '\n')
	}
	if goesOn && len(lostIDs) == 0 {
		out = append(warningFields(out, g.Reason, g.LastEventID, g.Lost), '\n')
	}
	return out
}

// priming is the preamble of a stream a client starts reading at from: for
// sessions that prime (2025-11-25), an event with the ID of the position
// before from and empty data, so a client that drops before the next event
// can still resume; else a comment. Either way bytes go out at once, so
// intermediaries release the headers.
func priming(version, epoch string, num uint32, from uint64) []byte {
	if primes(version) {
		out := make([]byte, 0, len("id: \ndata: \n\n")+eventid.MaxLen)
		out = eventid.Append(append(out, "id: "...), epoch, num, from-1)
		return append(out, "\ndata: \n\n"...)
	}
	return commentPreamble
}

// commentPreamble is the preamble of versions that do not prime; shared,
// so nothing may write into it (its capacity is its length).
var commentPreamble = slices.Clip(sse.AppendComment(nil, "mcp-resume"))

// relayTo starts an SSE response with pre and relays the stream from the
// reader's position in this request's goroutine.
func (h *Engine) relayTo(w http.ResponseWriter, r *http.Request, sess buffer.Session, stream buffer.Stream,
	rd buffer.Reader, pre []byte, replayUpTo uint64) error {
	return h.relayWith(w, r, sess, stream, rd, pre, replayUpTo, nil)
}

// relayWith is relayTo with a takeover for the relay (see relay.takeover).
func (h *Engine) relayWith(w http.ResponseWriter, r *http.Request, sess buffer.Session, stream buffer.Stream,
	rd buffer.Reader, pre []byte, replayUpTo uint64, takeover func() bool) error {
	prepareSSEHeaders(w.Header())
	rl := h.newRelay(w, sess, stream, rd)
	rl.replayUpTo = replayUpTo
	rl.takeover = takeover
	switch {
	case len(pre) > 0:
	case primes(sess.Meta().Version):
		// Bytes at once, so intermediaries release the headers: the
		// client's own position as an event ID (a priming event, as cut
		// writes), so that a connection cut before the first event with
		// an ID (a resume at head, or a replay still on its way from the
		// store) leaves the client something to resume from. The Go SDK
		// takes a stream that ends with no ID in it for the call lost
		// ("request terminated without response").
		pre = priming(sess.Meta().Version, sess.Epoch(), stream.Num(), rd.Next())
	case stream.Kind() == policy.RequestStream:
		// Older versions get no event without data: the headers wait for
		// the first events (a replay is ready in a moment; at head, the
		// call's next event), and no keep-alive goes before them, so a
		// cut until then (the network's, or the proxy's own) is a
		// request failed, which the client makes again, not a stream
		// ended with no ID in it. An idle connection an intermediary
		// drops is such a cut.
		rl.headersHeld = true
	default:
		// The standalone stream may be quiet for long: its headers go at
		// once, and keep-alives keep its connection.
		pre = commentPreamble
	}
	if !rl.headersHeld {
		w.WriteHeader(http.StatusOK)
		if !rl.write(pre) {
			rd.Close()
			return nil
		}
	}
	rl.run(r.Context())
	return nil
}

// primes reports whether a session's streams start with a priming event:
// only from 2025-11-25 on, since older clients may choke on empty data.
func primes(version string) bool { return version >= "2025-11-25" }
