package resume

import (
	"context"
	"errors"
	"hash/maphash"
	"io"
	"maps"
	"net/http"
	"strings"
	"sync"
	"time"

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
	recentUpstream = 256 // upstream event IDs remembered, to drop what a replay repeats
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
// from what went wrong to a failure reason. The upstream cursor it keeps
// (lastID) is its own read position, for its own reconnects; the one a
// successor resumes from is the store's (Stream.UpstreamCursor), which
// moves with what is stored: each entry carries its upstream ID, and an ID
// on nothing stored is a note (passed).
type upstreamTap struct {
	h      *Engine
	next   Next
	client *http.Request // the client's request: context values, headers to carry upstream

	ctx       context.Context // detached: outlives the client, not the session or the runtime
	cancelCtx context.CancelFunc
	cancel    func()      // stop, as a func: ends the tap's reads and asks its role to stop
	unlink    func() bool // undoes the tie to the session's end

	sess   buffer.Session
	stream buffer.Stream
	// prod is the tap's role on stream: Done once its upstream response
	// is closed. Set in the tap's goroutine; roleMu orders that with stop.
	prod    buffer.Producer
	unprod  func() bool // undoes the tie of the tap's stop to prod's
	roleMu  sync.Mutex
	version string

	// The upstream's own cursor as this tap read it, never shown to clients.
	lastID string
	retry  time.Duration
	recent []taken // the last upstream IDs taken, oldest first: the repeat filter's
	// conn numbers the upstream responses of the tap (its attempts);
	// resumed says the current one answers a request that carried the
	// upstream's Last-Event-ID: only such a replay can repeat an event.
	conn    int
	resumed bool

	parser sse.Parser
	// The events of one upstream write, appended together when it has been
	// parsed: fields alias the write's bytes (an event that came as it is
	// stored) or framed, which holds the others back to back.
	batch    []buffer.Entry
	batchIDs []upstreamID // the upstream's ids of batch with their sums, taken once the batch is in
	framed   []byte
	pending  []string // request ids (canonical) still without an answer, in request order
	progress bool     // the current attempt brought something new (an event, or a new upstream cursor)
	// resumable: the current attempt stored events for clients under the
	// upstream's IDs, so a reconnect asks for what follows, not for them again.
	resumable bool
	failure   error // why the current attempt's appends stopped
	// dropConflict, if set, says whether an upstream 409 to the current
	// attempt is dropped (asked again) instead of passed on.
	dropConflict func() bool
	// holdCut: a client waits for the answer of the tap's attempts. Once
	// the proxy itself ended the tap (a drain, the process stopping, the
	// session's end, the producer role gone) an answer that is not a
	// stream is not the upstream's but reverse_proxy's account of the
	// cancellation (499): it is held back (attemptResult.cut), for the
	// caller to answer the client as a cut stream is answered.
	holdCut bool

	// takeover: the tap took the stream over from a producer that died
	// (follow.go's takeOver), from upstream cursor takeoverFrom;
	// takeoverCounted once its outcome is counted; lastStatus is the
	// upstream's status on the last attempt.
	takeover, takeoverCounted bool
	takeoverFrom              string
	lastStatus                int

	relay *handOff // the first response's relay, once started
}

func (h *Engine) newTap(r *http.Request, next Next, sess buffer.Session, version string) *upstreamTap {
	t := &upstreamTap{h: h, next: next, client: r, sess: sess, version: version}
	t.ctx, t.cancelCtx = h.detach(r)
	t.cancel = t.stop
	h.rt.taps.Add(1) // the store closes only once every tap has closed
	if sess != nil {
		t.tie(sess)
	}
	return t
}

// detach returns a context for an upstream request that outlives the client
// connection (keeping the request's values, which reverse_proxy needs) but
// not the runtime. Callers also tie it to their session's end.
func (h *Engine) detach(r *http.Request) (context.Context, context.CancelFunc) {
	return context.WithCancel(detached{h.rt.stopCtx, r.Context()})
}

// detached is a request's context without its cancellation: the runtime's
// stop context, with the request's values. context.WithCancel on it joins
// the stop context's children (its Value answers for the stop context's own
// key first), as cheap as a child of the stop context itself.
type detached struct {
	context.Context                 // the runtime's stop: Done, Err, Deadline
	values          context.Context // the request's
}

func (d detached) Value(key any) any {
	if v := d.Context.Value(key); v != nil {
		return v
	}
	return d.values.Value(key)
}

// tie ends the detached upstream reads when the session ends.
func (t *upstreamTap) tie(sess buffer.Session) {
	t.sess = sess
	t.unlink = context.AfterFunc(sess.Context(), t.cancel)
}

// produce makes the tap stream's producer with role p: the tap stops when
// the role must (another replica holds the lease now), and a tap that
// stops for its own reasons (its session's end, a drain) shows its role
// as stopping, so a taker waits for it instead of relaying (stop).
func (t *upstreamTap) produce(stream buffer.Stream, p buffer.Producer) {
	t.roleMu.Lock()
	t.stream, t.prod = stream, p
	stopped := t.ctx.Err() != nil
	t.roleMu.Unlock()
	if t.unprod != nil {
		t.unprod()
	}
	t.unprod = context.AfterFunc(p.Context(), t.cancel)
	if stopped {
		p.Stop()
	}
}

// giveUpRole gives the tap's role up (Done). The tap's stop is untied from
// the role first: Done ends the role's context, which ran the tap's stop in
// a goroutine of its own at the end of every call, and cut what a tap that
// abandoned its stream still passes through.
func (t *upstreamTap) giveUpRole() {
	if t.unprod != nil {
		t.unprod()
		t.unprod = nil
	}
	t.prod.Done()
}

// stop ends the tap's upstream reads and asks its role, if it has one, to
// stop. (The runtime's stop ends the reads without it: the roles go with
// the taps' ends, none is taken meanwhile.) A context.AfterFunc on the
// tap's context did the latter before, at 6 allocations a call.
func (t *upstreamTap) stop() {
	t.cancelCtx()
	t.roleMu.Lock()
	p := t.prod
	t.roleMu.Unlock()
	if p != nil {
		p.Stop()
	}
}

// close releases what the tap holds, then waits for the first response's
// relay. Its upstream response is closed by now (attempt returned), so
// the role goes: that is what ends a caught-up relay of the standalone
// stream (its client reconnects, which opens a new upstream GET) and what
// a successor waits for.
func (t *upstreamTap) close() {
	if t.prod != nil {
		if t.stream.Kind() == policy.StandaloneStream && t.ctx.Err() != nil {
			t.h.rt.closedGETs.closed(t.sess.ID()) // by the proxy: the upstream notices a moment later
		}
		t.giveUpRole()
	}
	if t.relay != nil {
		t.relay.finish()
	}
	if t.unlink != nil {
		t.unlink()
	}
	t.cancelCtx() // its role is Done
	t.h.rt.taps.Done()
}

// attemptResult is what one upstream request of the tap came to.
type attemptResult struct {
	status  int           // the upstream's status, 0 if none came
	dropped bool          // a 409 dropConflict held back from the client
	cut     bool          // the proxy ended the tap before an answer reached the client (holdCut): the client has none
	tapped  bool          // a 200 text/event-stream fed the stream
	broken  bool          // the response ended abnormally (connection error, abort)
	proxied error         // what the next handler returned (e.g. 502: the upstream is unreachable)
	lasted  time.Duration // from the request to the response's end
}

// attempt forwards req and, if start agrees at the response's status, taps
// it into the stream. Otherwise the response goes to out: the client for a
// first request, nowhere for a reconnect. stopWhenAnswered ends the read
// once every request is answered (a replay the upstream keeps open).
func (t *upstreamTap) attempt(req *http.Request, out http.ResponseWriter, start func(http.Header) bool,
	stopWhenAnswered bool) (res attemptResult) {
	// Its own context only where it ends the read early: a first request's
	// ends with the tap's.
	ctx, cancel := t.ctx, context.CancelFunc(nil)
	if stopWhenAnswered {
		ctx, cancel = context.WithCancel(t.ctx)
		defer cancel()
	}
	t.parser = sse.Parser{MaxEventBytes: 2*int(t.h.MaxEventBytes) + 4<<10} // the tap checks the stored size
	t.progress, t.resumable, t.failure = false, false, nil
	t.conn++
	t.resumed = req.Header.Get(hdrLastEventID) != ""
	tw := &tapWriter{writerWrapper: &writerWrapper{ResponseWriter: out}, t: t, start: start}
	if t.dropConflict != nil || t.holdCut {
		tw.header = http.Header{} // the answer's headers reach out only if it is passed on
	}
	stopped := false
	if stopWhenAnswered {
		tw.answered = func() { stopped = true; cancel() }
	}
	began := time.Now()
	defer func() {
		res.status, res.tapped, res.dropped, res.lasted = tw.status, tw.tapping, tw.dropped, time.Since(began)
		// Cut: the status was held back, or none came and the next handler
		// returned (reverse_proxy's 499 or 502 as an error, for Caddy to write).
		res.cut = tw.cut || t.holdCut && tw.status == 0 && !tw.tapping && t.ctx.Err() != nil
		p := recover()
		switch {
		case stopped:
			res.broken, res.proxied = false, nil // ended on purpose, once answered
			return
		case p == http.ErrAbortHandler:
			res.broken = true
		case p != nil:
			// A bug of the next handler (an in-process SDK server): its
			// stream fails loudly, so the relay ends (the client gets the
			// gap and the errors) and the deferred close does not wait for
			// it forever; the panic goes on to net/http's recovery.
			if tw.tapping && t.stream != nil {
				t.h.logger.Error("the upstream handler panicked: its stream fails", zap.String("session", t.sess.ID()),
					zap.Uint32("stream", t.stream.Num()), zap.Any("panic", p))
				t.fail(policy.ReasonUpstreamFailed)
			}
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
	if req.Context() != ctx { // every caller's req is made for this attempt
		req = req.WithContext(ctx)
	}
	res.proxied = t.next.ServeHTTP(tw, req)
	return res
}

// onEvent takes one upstream event into the batch of the write being parsed.
func (t *upstreamTap) onEvent(ev *sse.Event) error {
	var sum uint64
	if ev.HasID {
		sum = eventSum(ev)
		if t.repeat(ev, sum) {
			return nil // a replay repeated an event the stream has
		}
	}
	if ev.HasRetry {
		t.retry = retryDelay(ev.Retry)
	}
	if !ev.HasData || len(ev.Data) == 0 {
		// Priming and close events are the upstream's, not the client's; the
		// cursor moves past one only once what came before it is in.
		if err := t.flush(); err != nil {
			return err
		}
		t.passed(upstreamID{ev.ID, ev.HasID, sum})
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
		// The stream fails with this event reported lost, so the cursor
		// moves past it: asked for again, it would fail every later GET.
		t.passed(upstreamID{ev.ID, ev.HasID, sum})
		return errTooLarge
	}
	t.batch = append(t.batch, buffer.Entry{Fields: fields, Answers: t.answers(ev.Data), Upstream: ev.ID})
	t.batchIDs = append(t.batchIDs, upstreamID{ev.ID, ev.HasID, sum})
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
	last, n, err := buffer.AppendBatch(t.ctx, t.stream, t.batch)
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
		t.resumable = t.resumable || id.has
	}
	for _, e := range t.batch[n:] {
		t.pending = append(t.pending, e.Answers...)
	}
	if n > 0 {
		// Answered here: this batch brought a call's last answer, which
		// goes out with the response's end (handoff.go); anything after
		// it goes out at once, the answer with it.
		answered := false
		for _, e := range t.batch[:n] {
			answered = answered || len(e.Answers) > 0
		}
		t.relay.pump(answered && len(t.pending) == 0 && len(t.batch) == n && t.stream.Kind() == policy.RequestStream)
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

// took records that the stream has an upstream event: its ID becomes the
// cursor the tap's next upstream request resumes from. Only then: an event
// whose append failed (a drain or a session end cut it short) must be
// asked for again. The store moved its own cursor with the append.
func (t *upstreamTap) took(id upstreamID) {
	t.progress = true
	if !id.has {
		return
	}
	t.lastID = id.id
	if len(t.recent) == recentUpstream {
		t.recent = append(t.recent[:0], t.recent[1:]...)
	}
	t.recent = append(t.recent, taken{id: id.id, sum: id.sum, conn: t.conn})
}

// passed moves the cursor past an upstream event that is not stored (a
// priming or close event, one too large to keep), once what came before it
// is in: the store notes it, so a successor does not ask for it again.
func (t *upstreamTap) passed(id upstreamID) {
	if id.has && id.id != "" {
		t.stream.NoteUpstream(id.id)
	}
	t.took(id)
}

// upstreamID is an upstream event's id field, if it had one, and the sum
// of its content (eventSum).
type upstreamID struct {
	id  string
	has bool
	sum uint64
}

// taken is an upstream event ID the stream has, with the sum of its
// content and the upstream response it came in. stored: one a takeover
// found in the store (conn 0), whose sum is buffer.FieldsSum of its
// stored fields, the same on every replica.
type taken struct {
	id     string
	sum    uint64
	conn   int
	stored bool
}

// repeat reports whether the upstream event with id and content sum, in
// the current response, repeats one the stream took from an earlier
// response (policy.UpstreamRepeat has the rule). Events of the write being
// parsed (the batch) are of the current response: never repeats.
func (t *upstreamTap) repeat(ev *sse.Event, sum uint64) bool {
	e := policy.UpstreamEvent{HasID: true, Resumed: t.resumed}
	if !e.Resumed {
		return false
	}
	var stored uint64
	storedDone := false
	for _, s := range t.recent {
		if s.id != ev.ID || s.conn >= t.conn {
			continue
		}
		e.TakenEarlier = true
		same := s.sum == sum
		if s.stored {
			if !storedDone {
				stored, storedDone = storedSum(ev), true
			}
			same = s.sum == stored
		}
		if same {
			e.SameContent = true
			break
		}
	}
	return policy.UpstreamRepeat(e)
}

// storedSum is buffer.FieldsSum of the fields the tap stores for ev (its
// own bytes, or framed anew without id and retry: onEvent), to compare an
// event with one a takeover found in the store.
func storedSum(ev *sse.Event) uint64 {
	if ev.Raw != nil {
		return buffer.FieldsSum(ev.Raw)
	}
	e := *ev
	e.HasRetry = false
	return buffer.FieldsSum(sse.AppendFields(nil, &e))
}

// sumSeed keys eventSum for the process.
var sumSeed = maphash.MakeSeed()

// eventSum is a hash of what an upstream event says (its type and data),
// which tells a replayed event from a new one that reuses its ID.
func eventSum(ev *sse.Event) uint64 {
	var h maphash.Hash
	h.SetSeed(sumSeed)
	h.WriteString(ev.Type)
	h.WriteByte(0)
	if ev.HasData {
		h.WriteByte(1)
		h.Write(ev.Data)
	}
	return h.Sum64()
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

// abandon fails the stream (unless its session ended: err says) and lets
// go of it before anything was tapped into it: the response passes
// through instead.
func (t *upstreamTap) abandon(err error) {
	if !errors.Is(err, buffer.ErrSessionGone) {
		t.fail(policy.ReasonUpstreamFailed)
	}
	if t.prod != nil {
		t.giveUpRole()
	}
	t.roleMu.Lock()
	t.stream, t.prod = nil, nil
	t.roleMu.Unlock()
}

// fail ends the stream loudly: its log gets the gap event and the errors
// for the requests still waiting (a warning on the standalone stream, which
// goes on), so connected and resuming clients alike learn it.
func (t *upstreamTap) fail(reason policy.Reason) {
	if reason == "" {
		return
	}
	if t.takeover && !t.takeoverCounted {
		t.takeoverFailed() // counted before its clients can learn it
	}
	head := eventid.Append(nil, t.sess.Epoch(), t.stream.Num(), t.stream.View().Head)
	gaps.WithLabelValues(string(reason)).Inc()
	t.stream.Fail(reason, FailureSignals(reason, string(head), t.pending)...)
}

// tapWriter is the ResponseWriter handed to the next handler (reverse_proxy)
// for one upstream request of a tap. Once tapping, it never touches the
// client: it parses the SSE body into events and appends them to the log,
// blocking while the log is full, and never reports a client error, so the
// upstream read carries on after the client is gone. The relay writes the
// log to the client.
type tapWriter struct {
	*writerWrapper
	t        *upstreamTap
	start    func(http.Header) bool // at a tappable response: set up the stream (and the client side); false: pass it on
	answered func()                 // if set, called once every request is answered: stop reading
	status   int
	tapping  bool
	// header, with the tap's dropConflict, holds the upstream's headers
	// until its status says whether they reach the client; dropped: they
	// did not (a 409 asked again).
	header  http.Header
	dropped bool
	cut     bool // the status came once the proxy had ended the tap (holdCut): held back
}

func (tw *tapWriter) Header() http.Header {
	if tw.header != nil {
		return tw.header
	}
	return tw.writerWrapper.Header()
}

func (tw *tapWriter) WriteHeader(status int) {
	if status < 200 { // informational (103 Early Hints): pass on
		if !tw.tapping && tw.status == 0 {
			if tw.header == nil {
				tw.writerWrapper.WriteHeader(status)
				return
			}
			// With its own headers only, as reverse_proxy sends it.
			h := tw.writerWrapper.Header()
			own := h.Clone()
			maps.Copy(h, tw.header)
			tw.writerWrapper.WriteHeader(status)
			clear(h)
			maps.Copy(h, own)
		}
		return
	}
	if tw.status != 0 {
		return
	}
	tw.status = status
	if tw.header != nil {
		if tw.t.holdCut && tw.t.ctx.Err() != nil && !tappable(status, tw.header) {
			tw.cut = true
			tw.writerWrapper.ResponseWriter = discard()
			return
		}
		if status == http.StatusConflict && tw.t.dropConflict != nil && tw.t.dropConflict() {
			tw.dropped = true
			tw.writerWrapper.ResponseWriter = discard()
			return
		}
		maps.Copy(tw.writerWrapper.Header(), tw.header)
		tw.header = nil
	}
	if tappable(status, tw.Header()) && tw.start(tw.Header()) {
		tw.tapping = true
		return
	}
	if status == http.StatusOK && tw.Header().Get("Content-Encoding") != "" && isEventStreamType(tw.Header()) {
		tw.t.h.logger.Warn("upstream compressed its SSE response although asked not to; passed through untapped",
			zap.String("content_encoding", tw.Header().Get("Content-Encoding")))
		untapped.WithLabelValues("compressed").Inc()
	}
	tw.writerWrapper.WriteHeader(status)
}

func (tw *tapWriter) Write(p []byte) (int, error) {
	if tw.status == 0 {
		tw.WriteHeader(http.StatusOK)
	}
	if !tw.tapping {
		return tw.writerWrapper.Write(p)
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
	return http.NewResponseController(tw.writerWrapper.ResponseWriter).Flush()
}

// ReadFrom hides ResponseWriterWrapper.ReadFrom, which would bypass Write.
func (tw *tapWriter) ReadFrom(r io.Reader) (int64, error) {
	return io.Copy(struct{ io.Writer }{tw}, r)
}

func isEventStreamType(h http.Header) bool {
	return strings.HasPrefix(h.Get("Content-Type"), "text/event-stream")
}

// upstreamRequest is the client's request as the tap forwards it: detached,
// and asking for an uncompressed response, which the tap must read.
func (t *upstreamTap) upstreamRequest(r *http.Request) *http.Request {
	// A deep copy: the handlers after this one in a route may change the
	// request in place (Caddy's header replacements edit the values, a
	// rewrite the URL), and the tap builds its later upstream requests
	// from the client's (review 36).
	req := r.Clone(t.ctx)
	req.Header.Del("Accept-Encoding")
	return req
}

// serveCall forwards a POST carrying requests and, if the upstream answers
// with an SSE stream, taps it: the upstream is followed to the last answer
// whatever the client does, and a relay feeds the client from the log. sess
// is nil when the session is to be adopted once the upstream answers.
func (h *Engine) serveCall(w http.ResponseWriter, r *http.Request, next Next,
	sess buffer.Session, version string, ids []string, key [32]byte) error {
	t := h.newTap(r, next, sess, version)
	h.rt.reads.Add(1) // a stopping process drains until the calls it reads end
	defer h.rt.reads.Add(-1)
	defer t.close()
	sid := r.Header.Get(hdrSessionID)
	start := func(http.Header) bool {
		if t.sess == nil {
			s, err := h.rt.store.CreateSession(sid, h.sessionMeta(r, version, policy.Adopted))
			switch {
			case errors.Is(err, buffer.ErrSessionExists):
				// Made meanwhile (another request's adoption, an
				// initialize elsewhere), bound to whoever made it; this
				// request was passed as one of an unknown session,
				// unchecked. Tapped into it only if it may act on it,
				// else its answer passes through untouched.
				if s, _ = h.rt.store.Session(sid); s == nil {
					return false
				}
				if !h.allowed(r, sid) {
					h.logger.Warn("stream not retained: the session was made meanwhile, bound to other credentials; passed through",
						zap.String("session", sid))
					untapped.WithLabelValues("not_authorized").Inc()
					return false
				}
			case err != nil:
				h.logger.Warn("session not adopted", zap.String("session", sid), zap.Error(err))
				return false
			default:
				h.logger.Info("session adopted", zap.String("session", sid), zap.String("protocol_version", version))
			}
			t.tie(s)
		}
		stream, p, rd, err := openCall(t.ctx, t.sess, ids, key)
		if stream == nil {
			h.logger.Warn("stream not retained", zap.String("session", sid), zap.Error(err))
			untapped.WithLabelValues("stream_refused").Inc()
			return false
		}
		t.stream, t.pending = stream, append([]string(nil), ids...)
		if p != nil {
			t.produce(stream, p)
		}
		if err != nil {
			// The upstream runs the call now: its answer goes to the
			// client as it comes, never nowhere. A repeat of the request
			// finds the stream failed.
			h.logger.Warn("stream not retained: its client could not be attached; passed through",
				zap.String("session", sid), zap.Uint32("stream", stream.Num()), zap.Error(err))
			untapped.WithLabelValues("attach_failed").Inc()
			t.abandon(err)
			return false
		}
		if c := h.logger.Check(zap.DebugLevel, "tapping request stream"); c != nil {
			c.Write(zap.String("session", sid), zap.Uint32("stream", stream.Num()), zap.Strings("request_ids", ids))
		}
		t.startRelay(w, rd, priming(t.sess.Meta().Version, t.sess.Epoch(), stream.Num(), 1), 0)
		return true
	}
	out := w
	if sess != nil {
		out = h.sessionWatch(w, sid) // an upstream 404 ends the session
	}
	res := t.attempt(t.upstreamRequest(r), out, start, false)
	if !res.tapped {
		return res.proxied
	}
	t.followRequest(res, 0)
	if t.prod != nil && t.prod.Context().Err() != nil && h.rt.stopCtx.Err() == nil && t.sess.Context().Err() == nil &&
		t.stream.View().State == policy.Live {
		// Its producer stopped, the tap did not: the store let go of the
		// stream (this replica cut off from it). Once back, take it back.
		h.takeBack(t.client, next, t.sess, t.stream)
	}
	return nil // the client already has its response headers
}

// takeoverFailed counts and logs a takeover whose upstream never resumed
// the stream: it is failing, explicitly.
func (t *upstreamTap) takeoverFailed() {
	t.takeoverCounted = true
	outcome := "failed"
	if policy.Classify(t.lastStatus).Refused() {
		outcome = "refused"
	}
	takeovers.WithLabelValues(outcome).Inc()
	t.h.logger.Warn("takeover: the upstream did not resume the stream; it failed",
		zap.String("session", t.sess.ID()), zap.Uint32("stream", t.stream.Num()),
		zap.String("upstream_last_event_id", truncate(t.takeoverFrom, 80)), zap.String("outcome", outcome),
		zap.Int("status", t.lastStatus))
}

// openCall opens a call's request stream, takes its producer role (a new
// stream: the role is this request's) and attaches its client from the
// first event: in one step where the session can (buffer.CallOpener: the
// JetStream store writes the stream's record once), else NewStream,
// TakeProducer and Attach(1) in turn. The stream is nil if none was made;
// an error with a stream is TakeProducer's or Attach's, with the producer
// returned if it was taken.
func openCall(ctx context.Context, sess buffer.Session, ids []string, key [32]byte) (buffer.Stream, buffer.Producer, buffer.Reader, error) {
	if o, ok := sess.(buffer.CallOpener); ok {
		return o.OpenCall(ctx, ids, key)
	}
	stream, err := sess.NewStream(ids, key)
	if err != nil {
		return nil, nil, nil, err
	}
	p, err := stream.TakeProducer(ctx)
	if err != nil {
		return stream, nil, nil, err
	}
	rd, err := stream.Attach(1)
	if err != nil {
		return stream, p, nil, err
	}
	return stream, p, rd, nil
}
