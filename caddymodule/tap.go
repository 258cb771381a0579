package caddymodule

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"time"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/mcpresume/caddy-mcp-resume/buffer"
	"github.com/mcpresume/caddy-mcp-resume/internal/eventid"
	"github.com/mcpresume/caddy-mcp-resume/internal/jsonrpc"
	"github.com/mcpresume/caddy-mcp-resume/internal/sse"
	"github.com/mcpresume/caddy-mcp-resume/policy"
)

// Bounds on following an upstream that closes or drops a stream early.
const (
	maxReconnects  = 5                      // upstream GETs in a row that bring nothing new
	reconnectFirst = 250 * time.Millisecond // first delay when the upstream sent no retry:
	reconnectMax   = 10 * time.Second
	recentUpstream = 256 // upstream event IDs remembered, to drop repeats in a replay
)

// errTooLarge is the tap's own refusal of an event over max_event_bytes.
var errTooLarge = errors.New("upstream event exceeds max_event_bytes")

// upstreamTap feeds one proxy stream from the upstream for as long as the
// stream owes its client something: the first response (the POST's, or the
// standalone GET's), then, when the upstream closes the stream early
// (2025-11-25 SSE polling) or the connection drops, GETs with the upstream's
// own Last-Event-ID, whose events fill the same proxy stream. It is the one
// routine that taps: it owns the producer role, the detached context tied to
// the session's end, the relay goroutine of the first response, recovery
// from reverse_proxy's aborts, the upstream's cursor, and the one mapping
// from what went wrong to a failure reason.
type upstreamTap struct {
	h      *Handler
	next   caddyhttp.Handler
	client *http.Request // the client's request: context values, headers to carry upstream

	ctx    context.Context // detached: outlives the client, not the session or Caddy
	cancel context.CancelFunc
	unlink func() bool // undoes the tie to the session's end

	sess    buffer.Session
	stream  buffer.Stream
	version string

	// The upstream's own cursor on this stream, never shown to clients.
	lastID string
	retry  time.Duration
	recent []string // the last upstream IDs taken, oldest first

	parser sse.Parser
	// The events of one upstream write, appended together when it has been
	// parsed: fields alias the write's bytes (an event that came as it is
	// stored) or framed, which holds the others back to back.
	batch    []buffer.Entry
	batchIDs []upstreamID // the upstream's ids of batch, taken once the batch is in
	framed   []byte
	pending  []string // request ids (canonical) still without an answer, in request order
	progress bool     // the current attempt brought something new
	failure  error    // why the current attempt's appends stopped

	relayDone chan struct{}
}

func (h *Handler) newTap(r *http.Request, next caddyhttp.Handler, sess buffer.Session, version string) *upstreamTap {
	t := &upstreamTap{h: h, next: next, client: r, sess: sess, version: version}
	t.ctx, t.cancel = h.detach(r)
	h.zone.taps.Add(1) // the store closes only once every tap has closed
	if sess != nil {
		t.tie(sess)
	}
	return t
}

// tie ends the detached upstream reads when the session ends.
func (t *upstreamTap) tie(sess buffer.Session) {
	t.sess = sess
	t.unlink = context.AfterFunc(sess.Context(), t.cancel)
}

// close releases what the tap holds, then waits for the first response's
// relay: releasing the producer role is what ends a caught-up relay of the
// standalone stream (its client reconnects, which opens a new upstream GET).
func (t *upstreamTap) close() {
	if t.stream != nil {
		t.stream.SetUpstreamCursor(t.lastID) // before the role goes: the next producer resumes from it
		t.stream.ReleaseProducer()
	}
	if t.relayDone != nil {
		<-t.relayDone
	}
	if t.unlink != nil {
		t.unlink()
	}
	t.cancel()
	t.h.zone.taps.Done()
}

// startRelay writes the client's response headers and pre, and relays the
// stream from rd in a goroutine; close waits for it.
func (t *upstreamTap) startRelay(w http.ResponseWriter, rd buffer.Reader, pre []byte, replayUpTo uint64) {
	prepareSSEHeaders(w.Header())
	w.WriteHeader(http.StatusOK)
	rl := t.h.newRelay(w, t.sess, t.stream, rd)
	rl.replayUpTo = replayUpTo
	t.relayDone = make(chan struct{})
	go func() {
		defer close(t.relayDone)
		if rl.write(pre) {
			rl.run(t.client.Context())
		} else {
			rd.Close()
		}
	}()
}

// attemptResult is what one upstream request of the tap came to.
type attemptResult struct {
	status  int   // the upstream's status, 0 if none came
	tapped  bool  // a 200 text/event-stream fed the stream
	broken  bool  // the response ended abnormally (connection error, abort)
	proxied error // what the next handler returned (e.g. 502: the upstream is unreachable)
}

// attempt forwards req and, if start agrees at the response's status, taps
// it into the stream. Otherwise the response goes to out: the client for a
// first request, nowhere for a reconnect. stopWhenAnswered ends the read
// once every request is answered (a replay the upstream keeps open).
func (t *upstreamTap) attempt(req *http.Request, out http.ResponseWriter, start func(http.Header) bool,
	stopWhenAnswered bool) (res attemptResult) {
	ctx, cancel := context.WithCancel(t.ctx)
	defer cancel()
	t.parser = sse.Parser{MaxEventBytes: 2*int(t.h.MaxEventBytes) + 4<<10} // the tap checks the stored size
	t.progress, t.failure = false, nil
	tw := &tapWriter{ResponseWriterWrapper: &caddyhttp.ResponseWriterWrapper{ResponseWriter: out}, t: t, start: start}
	stopped := false
	if stopWhenAnswered {
		tw.answered = func() { stopped = true; cancel() }
	}
	defer func() {
		res.status, res.tapped = tw.status, tw.tapping
		p := recover()
		switch {
		case stopped:
			res.broken, res.proxied = false, nil // ended on purpose, once answered
			return
		case p == http.ErrAbortHandler:
			res.broken = true
		case p != nil:
			panic(p)
		}
		if res.tapped && !res.broken && t.failure == nil && res.proxied == nil {
			// An event the upstream ended without its blank line is
			// complete as far as clients go (the SDK clients dispatch it).
			t.failure = t.parser.Finish(t.onEvent)
			if err := t.flush(); t.failure == nil {
				t.failure = err
			}
		}
	}()
	res.proxied = t.next.ServeHTTP(tw, req.WithContext(ctx))
	return res
}

// onEvent takes one upstream event into the batch of the write being parsed.
func (t *upstreamTap) onEvent(ev *sse.Event) error {
	if ev.HasID && t.seenID(ev.ID) {
		return nil // a replay repeated an event the stream has
	}
	if ev.HasRetry {
		t.retry = time.Duration(ev.Retry) * time.Millisecond
	}
	if !ev.HasData || len(ev.Data) == 0 {
		// Priming and close events are the upstream's, not the client's; the
		// cursor moves past one only once what came before it is in.
		if err := t.flush(); err != nil {
			return err
		}
		t.took(upstreamID{ev.ID, ev.HasID})
		return nil
	}
	// Stored without the upstream's id and retry (the proxy follows the
	// upstream itself; clients keep their own pace): the upstream's bytes as
	// they came when that is already the stored form, else framed anew.
	fields := ev.Raw
	if fields == nil {
		e := *ev
		e.HasRetry = false
		if len(t.batch) > 0 && cap(t.framed)-len(t.framed) < sse.FieldsLen(&e) {
			// Framing would move the buffer the batch's fields point into.
			if err := t.flush(); err != nil {
				return err
			}
		}
		start := len(t.framed)
		t.framed = sse.AppendFields(t.framed, &e)
		fields = t.framed[start:len(t.framed):len(t.framed)]
	}
	if int64(len(fields)) > t.h.MaxEventBytes {
		if err := t.flush(); err != nil { // what came before it goes in
			return err
		}
		return errTooLarge
	}
	t.batch = append(t.batch, buffer.Entry{Fields: fields, Answers: t.answers(ev.Data)})
	t.batchIDs = append(t.batchIDs, upstreamID{ev.ID, ev.HasID})
	if len(t.batch) == maxBatch {
		return t.flush()
	}
	return nil
}

// maxBatch bounds the events appended in one step.
const maxBatch = 64

// flush appends the batch to the stream. Requests whose answers did not go
// in are pending again, so a failure still answers them.
func (t *upstreamTap) flush() error {
	if len(t.batch) == 0 {
		return nil
	}
	var last uint64
	var n int
	var err error
	if ba, ok := t.stream.(buffer.BatchAppender); ok {
		last, n, err = ba.AppendBatch(t.ctx, t.batch)
	} else {
		for n < len(t.batch) {
			var seq uint64
			if seq, err = t.stream.Append(t.ctx, t.batch[n].Fields, t.batch[n].Answers); err != nil {
				break
			}
			last = seq
			n++
		}
	}
	if c := t.h.logger.Check(zap.DebugLevel, "event appended"); c != nil {
		for i, e := range t.batch[:min(n+1, len(t.batch))] {
			seq, ierr := last-uint64(n-1-i), error(nil)
			if i == n {
				seq, ierr = 0, err
			}
			t.h.logger.Debug("event appended", zap.String("session", t.sess.ID()), zap.Uint32("stream", t.stream.Num()),
				zap.Uint64("seq", seq), zap.Int("bytes", len(e.Fields)), zap.Strings("answers", e.Answers), zap.Error(ierr))
		}
	}
	for _, id := range t.batchIDs[:n] {
		t.took(id)
	}
	for _, e := range t.batch[n:] {
		t.pending = append(t.pending, e.Answers...)
	}
	clear(t.batch) // keep no reference to the upstream's bytes
	t.batch = t.batch[:0]
	clear(t.batchIDs)
	t.batchIDs = t.batchIDs[:0]
	t.framed = t.framed[:0]
	if cap(t.framed) > 64<<10 {
		t.framed = nil // do not keep an event-sized buffer for the stream's life
	}
	return err
}

// took records that the stream has an upstream event: its ID becomes the cursor
// the next upstream request resumes from. Only then: an event whose append
// failed (a drain or a session end cut it short) must be asked for again.
func (t *upstreamTap) took(id upstreamID) {
	t.progress = true
	if !id.has {
		return
	}
	t.lastID = id.id
	if len(t.recent) == recentUpstream {
		t.recent = append(t.recent[:0], t.recent[1:]...)
	}
	t.recent = append(t.recent, id.id)
}

// upstreamID is an upstream event's id field, if it had one.
type upstreamID struct {
	id  string
	has bool
}

// seenID reports whether the stream has the upstream's event id already.
func (t *upstreamTap) seenID(id string) bool {
	for _, s := range t.recent {
		if s == id {
			return true
		}
	}
	for _, b := range t.batchIDs {
		if b.has && b.id == id {
			return true
		}
	}
	return false
}

// answers returns the pending request ids that data answers, and forgets
// them. A response whose id matches no pending request still answers one:
// a POST's stream carries answers to its own requests only, and upstreams
// re-encode ids (the Go SDK answers request 3.5 as 3, 1e2 as 100), so it
// takes the oldest pending request rather than leave one pending forever.
func (t *upstreamTap) answers(data []byte) []string {
	if len(t.pending) == 0 {
		return nil
	}
	var out []string
	answer := func(raw []byte) {
		if len(t.pending) == 0 {
			return
		}
		id, k := jsonrpc.CanonicalID(raw), 0
		for i, p := range t.pending {
			if p == id {
				k = i
				break
			}
		}
		out = append(out, t.pending[k])
		t.pending = append(t.pending[:k], t.pending[k+1:]...)
	}
	d := data
	for len(d) > 0 && (d[0] == ' ' || d[0] == '\t' || d[0] == '\r' || d[0] == '\n') {
		d = d[1:]
	}
	if len(d) > 0 && d[0] == '[' {
		jsonrpc.PeekAll(d, func(m jsonrpc.Message) { // a batch (2025-03-26)
			if m.Kind == jsonrpc.Response {
				answer(m.ID)
			}
		})
	} else if id, ok := jsonrpc.PeekResponse(data); ok {
		answer(id)
	}
	return out
}

// failureReason maps why a stream cannot go on to its reason; "" means the
// stream needs no failure of its own (its session ended, Caddy is exiting).
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

// fail ends the stream loudly: its log gets the gap event and the errors
// for the requests still waiting (a warning on the standalone stream, which
// goes on), so connected and resuming clients alike learn it.
func (t *upstreamTap) fail(reason policy.Reason) {
	if reason == "" {
		return
	}
	head := eventid.Append(nil, t.sess.Epoch(), t.stream.Num(), t.stream.View().Head)
	gaps.WithLabelValues(string(reason)).Inc()
	t.stream.Fail(reason, failureSignals(reason, string(head), t.pending)...)
}

// reconnectRequest is the GET that resumes the upstream's stream: the
// client's headers (session, version, credentials), the upstream's own
// Last-Event-ID when it gave one.
func (t *upstreamTap) reconnectRequest() *http.Request {
	req := t.client.Clone(t.ctx)
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

// upstreamRequest is the client's request as the tap forwards it: detached,
// and asking for an uncompressed response, which the tap must read.
func (t *upstreamTap) upstreamRequest(r *http.Request) *http.Request {
	req := r.Clone(t.ctx)
	req.Header.Del("Accept-Encoding")
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

// sessionGone handles an upstream 404 for the session: it no longer exists
// there, so it ends here too.
func (h *Handler) sessionGone(sid string, status int) bool {
	if status != http.StatusNotFound {
		return false
	}
	h.zone.store.Delete(sid, policy.ReasonDeleted)
	return true
}

// followRequest keeps a request stream fed until each of its requests is
// answered: after the first response ends early, it resumes the upstream's
// stream with GETs, within maxReconnects attempts without progress and
// never past stall_timeout without progress; else the stream fails loudly.
func (t *upstreamTap) followRequest(first attemptResult) {
	res := first
	attempts := 0
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
			return // the session ended, or Caddy is exiting
		case t.h.sessionGone(t.sess.ID(), res.status):
			return
		case res.tapped && t.lastID == "":
			// Ended early with no way to ask for the rest.
			t.fail(t.failureReason(nil, res.broken))
			return
		case !res.tapped && attempts > 0 && refused(res.status):
			t.h.reconnected(t, attempts, res, "refused")
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

// refused reports a status that a reconnect must not retry: the upstream
// does not know the stream or will not serve it. 409 (the upstream still
// holds the old connection) and 429 pass with time; 5xx may too.
func refused(status int) bool {
	return status >= 400 && status < 500 && status != http.StatusConflict && status != http.StatusTooManyRequests
}

// reconnected logs and counts one reconnect attempt.
func (h *Handler) reconnected(t *upstreamTap, attempt int, res attemptResult, outcome string) {
	if outcome == "" {
		switch {
		case res.tapped:
			outcome = "resumed"
		case refused(res.status):
			outcome = "refused"
		default:
			outcome = "failed"
		}
	}
	upstreamReconnects.WithLabelValues(outcome).Inc()
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
		if t.ctx.Err() != nil || t.h.sessionGone(t.sess.ID(), res.status) || refused(res.status) && !res.tapped {
			return
		}
		if res.tapped && t.lastID == "" && !t.stream.Connected() {
			return // nothing to catch up on and no one waiting: the next client GET reopens it
		}
		if t.progress || res.tapped && res.status == http.StatusOK && !res.broken {
			attempts = 0
		}
		if attempts >= maxReconnects {
			upstreamReconnects.WithLabelValues("exhausted").Inc()
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

// tapWriter is the ResponseWriter handed to the next handler (reverse_proxy)
// for one upstream request of a tap. Once tapping, it never touches the
// client: it parses the SSE body into events and appends them to the log,
// blocking while the log is full, and never reports a client error, so the
// upstream read carries on after the client is gone. The relay writes the
// log to the client.
type tapWriter struct {
	*caddyhttp.ResponseWriterWrapper
	t        *upstreamTap
	start    func(http.Header) bool // at a tappable response: set up the stream (and the client side); false: pass it on
	answered func()                 // if set, called once every request is answered: stop reading
	status   int
	tapping  bool
}

func (tw *tapWriter) WriteHeader(status int) {
	if status < 200 { // informational (103 Early Hints): pass on
		if !tw.tapping && tw.status == 0 {
			tw.ResponseWriterWrapper.WriteHeader(status)
		}
		return
	}
	if tw.status != 0 {
		return
	}
	tw.status = status
	if tappable(status, tw.Header()) && tw.start(tw.Header()) {
		tw.tapping = true
		return
	}
	if status == http.StatusOK && tw.Header().Get("Content-Encoding") != "" && isEventStreamType(tw.Header()) {
		tw.t.h.logger.Warn("upstream compressed its SSE response although asked not to; passed through untapped",
			zap.String("content_encoding", tw.Header().Get("Content-Encoding")))
		untapped.WithLabelValues("compressed").Inc()
	}
	tw.ResponseWriterWrapper.WriteHeader(status)
}

func (tw *tapWriter) Write(p []byte) (int, error) {
	if tw.status == 0 {
		tw.WriteHeader(http.StatusOK)
	}
	if !tw.tapping {
		return tw.ResponseWriterWrapper.Write(p)
	}
	t := tw.t
	if t.failure != nil {
		return 0, t.failure
	}
	err := t.parser.Feed(p, t.onEvent)
	if err == nil {
		err = t.flush() // before p goes back to reverse_proxy
	} else {
		t.flush() // what came before the error goes in; the error is the one to report
	}
	if err != nil {
		// reverse_proxy stops reading the upstream and aborts: the stream
		// cannot go on (a stall, an oversized event, the session's end).
		t.failure = err
		return 0, err
	}
	if tw.answered != nil && len(t.pending) == 0 {
		tw.answered()
	}
	return len(p), nil
}

// FlushError implements the flusher that http.ResponseController looks for
// first. While tapping, the relay flushes the client; here there is nothing to do.
func (tw *tapWriter) FlushError() error {
	if tw.tapping {
		return nil
	}
	return http.NewResponseController(tw.ResponseWriterWrapper.ResponseWriter).Flush()
}

// ReadFrom hides ResponseWriterWrapper.ReadFrom, which would bypass Write.
func (tw *tapWriter) ReadFrom(r io.Reader) (int64, error) {
	return io.Copy(struct{ io.Writer }{tw}, r)
}

func isEventStreamType(h http.Header) bool {
	return bytes.HasPrefix([]byte(h.Get("Content-Type")), []byte("text/event-stream"))
}

// discardWriter is where a reconnect's response goes when it is not
// tapped: nowhere (the client's response is the relay's).
type discardWriter struct{ h http.Header }

func discard() *discardWriter                        { return &discardWriter{h: http.Header{}} }
func (d *discardWriter) Header() http.Header         { return d.h }
func (d *discardWriter) Write(p []byte) (int, error) { return len(p), nil }
func (d *discardWriter) WriteHeader(int)             {}

// statusWriter passes a response through and reports its status.
type statusWriter struct {
	*caddyhttp.ResponseWriterWrapper
	onStatus func(int)
	done     bool
}

func (s *statusWriter) WriteHeader(status int) {
	if !s.done && status >= 200 {
		s.done = true
		s.onStatus(status)
	}
	s.ResponseWriterWrapper.WriteHeader(status)
}

func (s *statusWriter) Write(p []byte) (int, error) {
	if !s.done {
		s.WriteHeader(http.StatusOK)
	}
	return s.ResponseWriterWrapper.Write(p)
}
