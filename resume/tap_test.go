package resume

// Unit tests of the upstream tap on httptest servers, one per upstream
// behaviour (early close, connection error, no ids, 404, retry delay,
// repeats, batches, oversized events): longer than most files, as its
// subject is the tap as a whole.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/mcpresume/caddy-mcp-resume/buffer"
	"github.com/mcpresume/caddy-mcp-resume/internal/eventid"
	"github.com/mcpresume/caddy-mcp-resume/policy"
)

// These tests drive the tap the way reverse_proxy does, in the style of
// Caddy's reverseproxy/streaming_test.go: the next handler is a scripted
// upstream that writes headers and SSE bytes to the writer it is given,
// aborts like reverse_proxy on a broken connection (panic
// http.ErrAbortHandler), or fails like it on an unreachable upstream (an
// error). The end-to-end tests run the real reverse_proxy.

// upstream is a scripted next handler: each request runs the next step.
type upstream struct {
	mu    sync.Mutex
	steps []func(w http.ResponseWriter, r *http.Request) error
	reqs  []*http.Request
	at    []time.Time
}

func (u *upstream) ServeHTTP(w http.ResponseWriter, r *http.Request) error {
	u.mu.Lock()
	u.reqs = append(u.reqs, r)
	u.at = append(u.at, time.Now())
	if len(u.steps) == 0 {
		u.mu.Unlock()
		return fmt.Errorf("unexpected request %d", len(u.reqs))
	}
	step := u.steps[0]
	u.steps = u.steps[1:]
	u.mu.Unlock()
	return step(w, r)
}

// waitFor polls cond until it holds, and fails the test, saying what it
// waited for, if it does not within timeout. (tests/harness has one too,
// but it imports this package.)
func waitFor(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(timeout); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
	}
}

func (u *upstream) requests() []*http.Request {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]*http.Request(nil), u.reqs...)
}

// sseStep answers with an SSE stream made of events, then ends as end says:
// "eof" (a clean close), "abort" (a broken connection), or "hang" (stays
// open until the request is cancelled).
func sseStep(end string, events ...string) func(http.ResponseWriter, *http.Request) error {
	return func(w http.ResponseWriter, r *http.Request) error {
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		for _, ev := range events {
			if _, err := io.WriteString(w, ev); err != nil {
				panic(http.ErrAbortHandler) // what reverse_proxy does when its writer fails
			}
		}
		switch end {
		case "abort":
			panic(http.ErrAbortHandler)
		case "hang":
			<-r.Context().Done()
			panic(http.ErrAbortHandler)
		}
		return nil
	}
}

func statusStep(status int) func(http.ResponseWriter, *http.Request) error {
	return func(w http.ResponseWriter, r *http.Request) error {
		w.Header().Set("Content-Type", "text/plain")
		w.WriteHeader(status)
		io.WriteString(w, http.StatusText(status))
		return nil
	}
}

func unreachableStep(w http.ResponseWriter, r *http.Request) error {
	return fmt.Errorf("dial tcp: connection refused") // reverse_proxy's 502
}

func progress(id string, n int) string {
	idLine := ""
	if id != "" {
		idLine = "id: " + id + "\n"
	}
	return fmt.Sprintf("%sevent: message\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\",\"params\":{\"progress\":%d}}\n\n", idLine, n)
}

func result(id string, reqID string) string {
	idLine := ""
	if id != "" {
		idLine = "id: " + id + "\n"
	}
	return fmt.Sprintf("%sevent: message\ndata: {\"jsonrpc\":\"2.0\",\"id\":%s,\"result\":{}}\n\n", idLine, reqID)
}

// testHandler is an engine on a private memory store.
func testHandler(t testing.TB) *Engine {
	t.Helper()
	return testHandlerWith(t, Config{})
}

// testHandlerWith is testHandler with cfg (its stall and keep-alive
// bounds set), e.g. a binding.
func testHandlerWith(t testing.TB, cfg Config) *Engine {
	t.Helper()
	cfg.StallTimeout, cfg.Keepalive = 5*time.Second, time.Second
	cfg.SetDefaults()
	st := buffer.NewMemoryStore(buffer.Options{Limits: cfg.Limits(), Key: []byte("k")})
	t.Cleanup(st.Close)
	rt := NewRuntime(st)
	h, err := New(cfg, rt)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rt.Stop)
	return h
}

func newSession(t testing.TB, h *Engine, version string) buffer.Session {
	t.Helper()
	s, err := h.rt.store.CreateSession("sess-1", h.sessionMeta(post("0"), version, policy.Initialized))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// post is a tools/call POST of the session, as the client sends it.
func post(ids ...string) *http.Request {
	body := fmt.Sprintf(`{"jsonrpc":"2.0","id":%s,"method":"tools/call","params":{"name":"count"}}`, ids[0])
	if len(ids) > 1 {
		var parts []string
		for _, id := range ids {
			parts = append(parts, fmt.Sprintf(`{"jsonrpc":"2.0","id":%s,"method":"tools/call","params":{"name":"count"}}`, id))
		}
		body = "[" + strings.Join(parts, ",") + "]"
	}
	r := httptest.NewRequest("POST", "/mcp", strings.NewReader(body))
	r.Header.Set("Content-Type", "application/json")
	r.Header.Set("Accept", "application/json, text/event-stream")
	r.Header.Set("Accept-Encoding", "gzip")
	r.Header.Set(hdrSessionID, "sess-1")
	r.Header.Set(hdrVersion, "2025-11-25")
	r.Header.Set("Authorization", "Bearer x")
	return r
}

type sseEvent struct{ ID, Type, Data string }

// events parses what the client received.
func events(t *testing.T, body string) []sseEvent {
	t.Helper()
	var out []sseEvent
	for _, block := range strings.Split(body, "\n\n") {
		var ev sseEvent
		has := false
		for _, line := range strings.Split(block, "\n") {
			switch {
			case strings.HasPrefix(line, "id: "):
				ev.ID, has = line[4:], true
			case strings.HasPrefix(line, "event: "):
				ev.Type, has = line[7:], true
			case strings.HasPrefix(line, "data: "):
				ev.Data, has = ev.Data+line[6:], true
			}
		}
		if has && !(ev.Data == "" && ev.Type == "") {
			out = append(out, ev)
		}
	}
	return out
}

// checkContiguous checks the client got proxy IDs 1..n on one stream.
func checkContiguous(t *testing.T, evs []sseEvent) {
	t.Helper()
	for i, ev := range evs {
		id, err := eventid.Parse(ev.ID)
		if err != nil || id.Seq != uint64(i+1) {
			t.Fatalf("event %d has id %q: %+v", i, ev.ID, evs)
		}
	}
}

func serve(t *testing.T, h *Engine, next *upstream, r *http.Request) *httptest.ResponseRecorder {
	t.Helper()
	w := httptest.NewRecorder()
	done := make(chan error, 1)
	go func() { done <- h.ServeHTTP(w, r, next) }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("ServeHTTP: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("ServeHTTP did not return")
	}
	return w
}

// An upstream that closes the POST's stream early (2025-11-25 SSE polling)
// is resumed with GET and its own Last-Event-ID, after its retry delay; what
// comes back fills the same proxy stream, and an event the upstream repeats
// in its replay is taken once.
func TestTapFollowsAnUpstreamThatClosesEarly(t *testing.T) {
	h := testHandler(t)
	newSession(t, h, "2025-11-25")
	up := &upstream{steps: []func(http.ResponseWriter, *http.Request) error{
		sseStep("eof", "id: u_0\ndata: \n\n", progress("u_1", 1), progress("u_2", 2), "event: close\nretry: 150\ndata: \n\n"),
		sseStep("hang", progress("u_2", 2), progress("u_3", 3), result("u_4", "7"), ": keepalive\n\n"),
	}}
	w := serve(t, h, up, post("7"))
	reqs := up.requests()
	if len(reqs) != 2 {
		t.Fatalf("%d upstream requests, want the POST and one GET", len(reqs))
	}
	g := reqs[1]
	if g.Method != "GET" || g.Header.Get(hdrLastEventID) != "u_2" || g.Header.Get(hdrSessionID) != "sess-1" ||
		g.Header.Get(hdrVersion) != "2025-11-25" || g.Header.Get("Authorization") != "Bearer x" ||
		g.Header.Get("Accept") != "text/event-stream" || g.Header.Get("Content-Type") != "" || g.Header.Get("Accept-Encoding") != "" {
		t.Fatalf("reconnect request %s %v", g.Method, g.Header)
	}
	if reqs[0].Header.Get("Accept-Encoding") != "" {
		t.Fatal("the tapped POST asked the upstream for a compressed response")
	}
	if d := up.at[1].Sub(up.at[0]); d < 150*time.Millisecond {
		t.Fatalf("reconnected after %v, before the upstream's retry of 150ms", d)
	}
	if !strings.HasPrefix(w.Body.String(), "id: ") || !strings.Contains(w.Body.String(), "-1-0\ndata: \n\n") {
		t.Fatalf("no priming event first: %q", w.Body.String())
	}
	evs := events(t, w.Body.String()) // progress 1..3, result; priming left out
	if len(evs) != 4 {
		t.Fatalf("client got %+v", evs)
	}
	checkContiguous(t, evs)
	for i := 0; i < 3; i++ {
		if !strings.Contains(evs[i].Data, fmt.Sprintf(`"progress":%d`, i+1)) {
			t.Fatalf("event %d: %+v", i, evs[i])
		}
	}
	if !strings.Contains(evs[3].Data, `"result"`) {
		t.Fatalf("no result: %+v", evs)
	}
	sess, _ := h.rt.store.Session("sess-1")
	st, _ := sess.Stream(1)
	if v := st.View(); v.State != policy.Complete || v.Requests[0].AnsweredAt != 4 {
		t.Fatalf("stream %+v", v)
	}
}

// A connection that drops mid-stream is resumed the same way, with a
// backoff when the upstream gave no retry.
func TestTapFollowsADroppedConnection(t *testing.T) {
	h := testHandler(t)
	newSession(t, h, "2025-06-18")
	up := &upstream{steps: []func(http.ResponseWriter, *http.Request) error{
		sseStep("abort", progress("a1", 1)),
		unreachableStep, // the upstream is briefly away
		sseStep("eof", progress("a2", 2), result("a3", "1")),
	}}
	w := serve(t, h, up, post("1"))
	reqs := up.requests()
	if len(reqs) != 3 || reqs[1].Header.Get(hdrLastEventID) != "a1" || reqs[2].Header.Get(hdrLastEventID) != "a1" {
		t.Fatalf("requests: %d", len(reqs))
	}
	if d := up.at[2].Sub(up.at[1]); d < reconnectFirst {
		t.Fatalf("second reconnect after %v: no backoff", d)
	}
	evs := events(t, w.Body.String())
	checkContiguous(t, evs)
	if len(evs) != 3 || !strings.Contains(evs[2].Data, `"result"`) {
		t.Fatalf("client got %+v", evs)
	}
}

// An upstream that gave no event IDs cannot be asked for the rest: the
// stream fails at once, loudly (a gap event, then an error for the request),
// and no reconnect is tried.
func TestTapFailsWithoutUpstreamIDs(t *testing.T) {
	for _, end := range []string{"eof", "abort"} {
		t.Run(end, func(t *testing.T) {
			h := testHandler(t)
			newSession(t, h, "2025-06-18")
			up := &upstream{steps: []func(http.ResponseWriter, *http.Request) error{sseStep(end, progress("", 1))}}
			w := serve(t, h, up, post(`"r1"`))
			if n := len(up.requests()); n != 1 {
				t.Fatalf("%d upstream requests: reconnected without a way to resume", n)
			}
			evs := events(t, w.Body.String())
			checkContiguous(t, evs)
			want := map[string]policy.Reason{"eof": policy.ReasonUpstreamClosed, "abort": policy.ReasonUpstreamFailed}[end]
			if len(evs) != 3 || evs[1].Type != "gap" || !strings.Contains(evs[1].Data, string(want)) ||
				!strings.Contains(evs[2].Data, `"id":"r1","error":{"code":-32010`) {
				t.Fatalf("client got %+v", evs)
			}
		})
	}
}

// A batch answered in part before the upstream broke gets errors only for
// the requests still waiting.
func TestTapFailsOnlyPendingRequests(t *testing.T) {
	h := testHandler(t)
	newSession(t, h, "2025-03-26")
	up := &upstream{steps: []func(http.ResponseWriter, *http.Request) error{sseStep("abort", result("", "1"))}}
	w := serve(t, h, up, post("1", "2"))
	evs := events(t, w.Body.String())
	var errs []string
	for _, ev := range evs {
		if strings.Contains(ev.Data, "-32010") {
			errs = append(errs, ev.Data)
		}
	}
	if len(errs) != 1 || !strings.Contains(errs[0], `"id":2`) {
		t.Fatalf("errors %v in %+v", errs, evs)
	}
}

// The reconnect's answer decides: 404 ends the session, another 4xx fails
// the stream, and a run of failures without progress gives up.
func TestTapReconnectAnswers(t *testing.T) {
	t.Run("404 ends the session", func(t *testing.T) {
		h := testHandler(t)
		newSession(t, h, "2025-11-25")
		up := &upstream{steps: []func(http.ResponseWriter, *http.Request) error{
			sseStep("eof", progress("x1", 1), "retry: 10\n\n"), statusStep(http.StatusNotFound)}}
		serve(t, h, up, post("1"))
		if _, ok := h.rt.store.Session("sess-1"); ok {
			t.Fatal("the session outlived the upstream's 404")
		}
		if tomb, ok := h.rt.store.Tombstone("sess-1"); !ok || tomb.Reason != policy.ReasonDeleted || len(tomb.Streams) != 1 {
			t.Fatalf("tombstone %+v %v", tomb, ok)
		}
	})
	t.Run("400 fails the stream", func(t *testing.T) {
		h := testHandler(t)
		newSession(t, h, "2025-11-25")
		up := &upstream{steps: []func(http.ResponseWriter, *http.Request) error{
			sseStep("eof", progress("x1", 1), "retry: 10\n\n"), statusStep(http.StatusBadRequest)}}
		w := serve(t, h, up, post("1"))
		evs := events(t, w.Body.String())
		if last := evs[len(evs)-1]; !strings.Contains(last.Data, "upstream_failed") || !strings.Contains(last.Data, "-32010") {
			t.Fatalf("client got %+v", evs)
		}
	})
	t.Run("exhausted", func(t *testing.T) {
		h := testHandler(t)
		newSession(t, h, "2025-11-25")
		steps := []func(http.ResponseWriter, *http.Request) error{sseStep("eof", progress("x1", 1), "retry: 10\n\n")}
		for i := 0; i < maxReconnects; i++ {
			steps = append(steps, statusStep(http.StatusServiceUnavailable))
		}
		up := &upstream{steps: steps}
		w := serve(t, h, up, post("1"))
		if n := len(up.requests()); n != 1+maxReconnects {
			t.Fatalf("%d requests, want 1 + %d reconnects", n, maxReconnects)
		}
		evs := events(t, w.Body.String())
		if last := evs[len(evs)-1]; !strings.Contains(last.Data, "upstream_failed") {
			t.Fatalf("client got %+v", evs)
		}
	})
}

// A client that drops before the upstream closes early, and comes back
// after the upstream's events were followed, gets the rest from the log.
func TestTapFollowsWhileTheClientIsAway(t *testing.T) {
	h := testHandler(t)
	newSession(t, h, "2025-11-25")
	gate := make(chan struct{})
	up := &upstream{steps: []func(http.ResponseWriter, *http.Request) error{
		func(w http.ResponseWriter, r *http.Request) error {
			w.Header().Set("Content-Type", "text/event-stream")
			w.WriteHeader(200)
			io.WriteString(w, progress("u1", 1))
			<-gate // the client leaves meanwhile
			io.WriteString(w, "retry: 20\n\n")
			return nil
		},
		sseStep("eof", progress("u2", 2), result("u3", "5")),
	}}
	ctx, leave := context.WithCancel(context.Background())
	r := post("5").WithContext(ctx)
	w := httptest.NewRecorder()
	done := make(chan error, 1)
	go func() { done <- h.ServeHTTP(w, r, up) }()
	sess, _ := h.rt.store.Session("sess-1")
	waitFor(t, 10*time.Second, "the tap to take u1 before the client leaves", func() bool {
		st, ok := sess.Stream(1)
		return ok && st.View().Head >= 1
	})
	leave()
	close(gate)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	st, _ := sess.Stream(1)
	if v := st.View(); v.State != policy.Complete || v.Head != 3 {
		t.Fatalf("the upstream was not followed after the client left: %+v", v)
	}
	// The client comes back from event 1.
	g := httptest.NewRequest("GET", "/mcp", nil)
	g.Header.Set("Accept", "text/event-stream")
	g.Header.Set(hdrSessionID, "sess-1")
	g.Header.Set("Authorization", "Bearer x")
	g.Header.Set(hdrLastEventID, string(eventid.Append(nil, sess.Epoch(), 1, 1)))
	w2 := serve(t, h, &upstream{}, g)
	evs := events(t, w2.Body.String())
	if len(evs) != 2 || !strings.Contains(evs[0].Data, `"progress":2`) || !strings.Contains(evs[1].Data, `"result"`) {
		t.Fatalf("resume got %+v", evs)
	}
	// And at its end, 204: nothing more will come.
	g.Header.Set(hdrLastEventID, evs[1].ID)
	if w3 := serve(t, h, &upstream{}, g); w3.Code != http.StatusNoContent {
		t.Fatalf("resume at the end: %d", w3.Code)
	}
}

// An upstream that compresses its SSE although asked not to is passed
// through untouched (the proxy cannot read it), never parsed as SSE.
func TestTapPassesCompressedThrough(t *testing.T) {
	h := testHandler(t)
	newSession(t, h, "2025-06-18")
	up := &upstream{steps: []func(http.ResponseWriter, *http.Request) error{
		func(w http.ResponseWriter, r *http.Request) error {
			w.Header().Set("Content-Type", "text/event-stream")
			w.Header().Set("Content-Encoding", "gzip")
			w.WriteHeader(200)
			w.Write([]byte("\x1f\x8b binary"))
			return nil
		}}}
	w := serve(t, h, up, post("1"))
	if w.Body.String() != "\x1f\x8b binary" || w.Header().Get("Content-Encoding") != "gzip" {
		t.Fatalf("client got %q %v", w.Body.String(), w.Header())
	}
	sess, _ := h.rt.store.Session("sess-1")
	if _, ok := sess.Stream(1); ok {
		t.Fatal("a stream was created for an untapped response")
	}
}

// The standalone stream's upstream GET that ends is reopened with the
// upstream's Last-Event-ID while the session lives; events come once.
func TestTapFollowsTheStandaloneStream(t *testing.T) {
	h := testHandler(t)
	sess := newSession(t, h, "2025-11-25")
	notice := func(id string, n int) string {
		return fmt.Sprintf("id: %s\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/message\",\"params\":{\"data\":%d}}\n\n", id, n)
	}
	up := &upstream{steps: []func(http.ResponseWriter, *http.Request) error{
		sseStep("eof", notice("_1", 1), "retry: 20\n\n"),
		sseStep("eof", notice("_1", 1), notice("_2", 2)), // a replay that repeats one
		sseStep("hang", notice("_3", 3)),
	}}
	ctx, leave := context.WithCancel(context.Background())
	g := httptest.NewRequest("GET", "/mcp", nil).WithContext(ctx)
	g.Header.Set("Accept", "text/event-stream")
	g.Header.Set(hdrSessionID, "sess-1")
	g.Header.Set("Authorization", "Bearer x")
	w := &lockedRecorder{ResponseRecorder: httptest.NewRecorder()}
	done := make(chan error, 1)
	go func() { done <- h.ServeHTTP(w, g, up) }()
	notices := func() []string {
		var got []string
		for _, ev := range events(t, w.String()) {
			if ev.Data != "" {
				got = append(got, ev.Data)
			}
		}
		return got
	}
	st := sess.Standalone()
	// The relay writes to the client beside the tap, so the log holding
	// notice 3 does not mean the client has it: wait for the client's copy.
	// Notices are relayed in log order, so a repeat of _1 taken twice would
	// be in the client's body before notice 3.
	waitFor(t, 10*time.Second, "the client to get notice 3", func() bool {
		return strings.Contains(w.String(), `"params":{"data":3}`)
	})
	if v := st.View(); v.Head != 3 {
		t.Fatalf("the standalone log holds %d events, want the 3 notices once", v.Head)
	}
	leave()
	h.rt.store.Delete("sess-1", policy.ReasonDeleted) // ends the producer
	<-done
	reqs := up.requests()
	if len(reqs) != 3 || reqs[0].Header.Get(hdrLastEventID) != "" || reqs[1].Header.Get(hdrLastEventID) != "_1" ||
		reqs[2].Header.Get(hdrLastEventID) != "_2" {
		t.Fatalf("%d requests", len(reqs))
	}
	if got := notices(); len(got) != 3 {
		t.Fatalf("client got %d notices: %v", len(got), got)
	}
}

// lockedRecorder is a ResponseRecorder a relay may write to in its own
// goroutine while the test reads what the client got so far.
type lockedRecorder struct {
	mu sync.Mutex
	*httptest.ResponseRecorder
}

func (w *lockedRecorder) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.ResponseRecorder.Write(p)
}

func (w *lockedRecorder) WriteHeader(code int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.ResponseRecorder.WriteHeader(code)
}

func (w *lockedRecorder) Flush() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.ResponseRecorder.Flush()
}

// String is the body written so far.
func (w *lockedRecorder) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.Body.String()
}

// A standalone tap that ends leaves its upstream cursor in the store, an
// ID on nothing stored (a close event) included, and the next upstream GET,
// a new tap's, resumes from it.
func TestStandaloneHandsTheStoredCursorOn(t *testing.T) {
	h := testHandler(t)
	sess := newSession(t, h, "2025-11-25")
	notice := func(id string, n int) string {
		return fmt.Sprintf("id: %s\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/message\",\"params\":{\"data\":%d}}\n\n", id, n)
	}
	up := &upstream{steps: []func(http.ResponseWriter, *http.Request) error{
		sseStep("eof", notice("_1", 1), "id: _2\ndata: \n\n"),
		statusStep(http.StatusMethodNotAllowed), // the tap's reconnect is refused: it ends
		sseStep("hang", notice("_3", 3)),
	}}
	get := func(ctx context.Context) (*httptest.ResponseRecorder, chan error) {
		g := httptest.NewRequest("GET", "/mcp", nil).WithContext(ctx)
		g.Header.Set("Accept", "text/event-stream")
		g.Header.Set(hdrSessionID, "sess-1")
		g.Header.Set("Authorization", "Bearer x")
		w := httptest.NewRecorder()
		done := make(chan error, 1)
		go func() { done <- h.ServeHTTP(w, g, up) }()
		return w, done
	}
	_, done := get(context.Background())
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the first standalone GET did not end when its tap did")
	}
	st := sess.Standalone()
	if c, head := st.UpstreamCursor(), st.View().Head; c != "_2" || head != 1 {
		t.Fatalf("after the tap: cursor %q, head %d; want _2, 1", c, head)
	}
	ctx, leave := context.WithCancel(context.Background())
	_, done = get(ctx)
	waitFor(t, 10*time.Second, "the second tap to take notice _3", func() bool { return st.View().Head >= 2 })
	leave()
	h.rt.store.Delete("sess-1", policy.ReasonDeleted) // ends the producer
	<-done
	reqs := up.requests()
	if len(reqs) != 3 || reqs[1].Header.Get(hdrLastEventID) != "_2" || reqs[2].Header.Get(hdrLastEventID) != "_2" {
		var ids []string
		for _, r := range reqs {
			ids = append(ids, r.Header.Get(hdrLastEventID))
		}
		t.Fatalf("%d upstream requests, Last-Event-IDs %q; want 3, the last two _2", len(reqs), ids)
	}
}

// The failure signal is in the log: a client that resumes after the
// failure gets it like any event, and then 204.
func TestFailureSignalIsResumable(t *testing.T) {
	h := testHandler(t)
	sess := newSession(t, h, "2025-06-18")
	up := &upstream{steps: []func(http.ResponseWriter, *http.Request) error{sseStep("eof", progress("", 1))}}
	serve(t, h, up, post("9"))
	g := httptest.NewRequest("GET", "/mcp", nil)
	g.Header.Set("Accept", "text/event-stream")
	g.Header.Set(hdrSessionID, "sess-1")
	g.Header.Set("Authorization", "Bearer x")
	g.Header.Set(hdrLastEventID, string(eventid.Append(nil, sess.Epoch(), 1, 1)))
	evs := events(t, serve(t, h, &upstream{}, g).Body.String())
	if len(evs) != 2 || evs[0].Type != "gap" || !strings.Contains(evs[1].Data, `"id":9`) {
		t.Fatalf("resume after the failure: %+v", evs)
	}
	var gap gapInfo
	if err := json.Unmarshal([]byte(evs[0].Data), &gap); err != nil || gap.Reason != policy.ReasonUpstreamClosed {
		t.Fatalf("gap %q", evs[0].Data)
	}
	g.Header.Set(hdrLastEventID, evs[1].ID)
	if w := serve(t, h, &upstream{}, g); w.Code != http.StatusNoContent {
		t.Fatalf("resume at the end: %d", w.Code)
	}
}

// Events of one upstream write are appended together, in order, whatever
// their form: as stored already (taken as they came), with ids or CR LF
// line ends or several data lines (framed anew); the client gets each once,
// framed as the proxy frames every event, and the answer completes the call.
func TestTapOneWriteManyEvents(t *testing.T) {
	h := testHandler(t)
	newSession(t, h, "2025-06-18")
	body := progress("", 1) + "id: u2\nevent: message\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\",\"params\":{\"progress\":2}}\n\n" +
		"data: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\",\r\ndata: \"params\":{\"progress\":3}}\r\n\r\n" +
		": keep-alive\n\n" + progress("", 4) + result("", `"r1"`)
	up := &upstream{steps: []func(http.ResponseWriter, *http.Request) error{sseStep("eof", body)}}
	w := serve(t, h, up, post(`"r1"`))
	raw := w.Body.String()
	evs := events(t, raw)
	checkContiguous(t, evs)
	if len(evs) != 5 || !strings.Contains(evs[4].Data, `"id":"r1","result"`) {
		t.Fatalf("client got %+v", evs)
	}
	for i, want := range []string{`"progress":1}`, `"progress":2}`, `"params":{"progress":3}}`, `"progress":4}`} {
		if !strings.Contains(evs[i].Data, want) {
			t.Fatalf("event %d is %+v, want %s", i+1, evs[i], want)
		}
	}
	// The upstream's own ID, as an id line: the proxy's IDs (a random
	// epoch, e.g. "c6p5npu2-1-1") may contain "u2".
	if strings.Contains(raw, "\r") || strings.Contains(raw, "id: u2\n") {
		t.Fatalf("the client got the upstream's framing: %q", raw)
	}
	if !strings.Contains(raw, "\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\",\ndata: \"params\"") {
		t.Fatalf("multi-line data not kept as lines: %q", raw)
	}
	s, _ := h.rt.store.Session("sess-1")
	str, _ := s.Stream(1)
	if v := str.View(); v.State != policy.Complete || v.Requests[0].AnsweredAt != 5 {
		t.Fatalf("stream %+v", v)
	}
}

// An event over max_event_bytes fails the stream, and the events the same
// write carried before it are kept and delivered first.
func TestTapTooLargeAfterSmallEvents(t *testing.T) {
	h := testHandler(t)
	h.MaxEventBytes = 512
	newSession(t, h, "2025-06-18")
	big := "data: " + strings.Repeat("x", 600) + "\n\n"
	up := &upstream{steps: []func(http.ResponseWriter, *http.Request) error{sseStep("eof", progress("", 1)+progress("", 2)+big)}}
	w := serve(t, h, up, post(`"r1"`))
	evs := events(t, w.Body.String())
	checkContiguous(t, evs)
	if len(evs) != 4 || !strings.Contains(evs[1].Data, `"progress":2`) || evs[2].Type != "gap" ||
		!strings.Contains(evs[2].Data, string(policy.ReasonTooLarge)) || !strings.Contains(evs[3].Data, `"id":"r1","error"`) {
		t.Fatalf("client got %+v", evs)
	}
}

// onlyAppend hides a stream's AppendBatch: a store without it.
type onlyAppend struct{ buffer.Stream }

// flush works the same with a stream that appends one event at a time, and
// a request whose answer did not go in is pending again.
func TestTapFlushWithoutBatchAppender(t *testing.T) {
	h := testHandler(t)
	s := newSession(t, h, "2025-06-18")
	str, err := s.NewStream([]string{`"a"`, `"b"`}, [32]byte{})
	if err != nil {
		t.Fatal(err)
	}
	tap := &upstreamTap{h: h, sess: s, stream: onlyAppend{str}, ctx: context.Background()}
	tap.batch = []buffer.Entry{{Fields: []byte("data: 1\n"), Upstream: "u1"}, {Fields: []byte("data: 2\n"), Answers: []string{`"a"`}, Upstream: "u2"}}
	tap.batchIDs = []upstreamID{{"u1", true, 0}, {"u2", true, 0}}
	if err := tap.flush(); err != nil || str.View().Head != 2 || len(tap.batch) != 0 || !tap.progress || tap.lastID != "u2" ||
		str.UpstreamCursor() != "u2" {
		t.Fatalf("flush: %v, view %+v, batch %d, upstream cursor %q, stored %q", err, str.View(), len(tap.batch), tap.lastID, str.UpstreamCursor())
	}
	str.Complete()
	tap.batch = []buffer.Entry{{Fields: []byte("data: 3\n"), Answers: []string{`"b"`}, Upstream: "u3"}}
	tap.batchIDs = []upstreamID{{"u3", true, 0}}
	// The upstream cursor stays before an event the stream did not take:
	// the next upstream request must ask for it again.
	if err := tap.flush(); err != buffer.ErrStreamEnded || len(tap.pending) != 1 || tap.pending[0] != `"b"` || tap.lastID != "u2" ||
		str.UpstreamCursor() != "u2" {
		t.Fatalf("flush on an ended stream: %v, pending %q, upstream cursor %q, stored %q", err, tap.pending, tap.lastID, str.UpstreamCursor())
	}
}

// A stream whose client cannot be attached (a shared store failing at that
// moment) does not leave the client waiting on nothing: the upstream's
// answer passes through, as plain reverse_proxy would send it, and the
// stream is failed so a repeat of the request learns it.
func TestTapPassesThroughWhenAttachFails(t *testing.T) {
	h := testHandler(t)
	newSession(t, h, "2025-11-25")
	h.rt.store = attachFails{h.rt.store}
	before := testutil.ToFloat64(untapped.WithLabelValues("attach_failed"))
	up := &upstream{steps: []func(http.ResponseWriter, *http.Request) error{
		sseStep("eof", progress("u1", 1), result("u2", "7")),
	}}
	w := serve(t, h, up, post("7"))
	if w.Code != http.StatusOK || !strings.Contains(w.Body.String(), `"id":7,"result"`) {
		t.Fatalf("client got %d %q", w.Code, w.Body.String())
	}
	if testutil.ToFloat64(untapped.WithLabelValues("attach_failed")) != before+1 {
		t.Fatal("untapped_total{attach_failed} did not move")
	}
	s, _ := h.rt.store.Session("sess-1")
	str, ok := s.Stream(1)
	if !ok || str.View().State != policy.Failed {
		t.Fatalf("the stream is %+v, not failed", str.View())
	}
	if p, err := str.TakeProducer(t.Context()); err != nil {
		t.Fatalf("the producer role was kept: %v", err)
	} else {
		p.Done()
	}
}

// attachFails is a store whose request streams cannot attach a client.
type attachFails struct{ buffer.Backend }

func (f attachFails) Session(id string) (buffer.Session, bool) {
	s, ok := f.Backend.Session(id)
	if !ok {
		return nil, false
	}
	return attachFailsSession{s}, true
}

type attachFailsSession struct{ buffer.Session }

func (s attachFailsSession) NewStream(ids []string, key [32]byte) (buffer.Stream, error) {
	str, err := s.Session.NewStream(ids, key)
	if err != nil {
		return nil, err
	}
	return attachFailsStream{str}, nil
}

type attachFailsStream struct{ buffer.Stream }

func (attachFailsStream) Attach(uint64) (buffer.Reader, error) {
	return nil, errors.New("nats: timeout")
}

// standaloneAttachFails is a store whose created sessions' standalone
// stream cannot attach a client (a shared store failing at that moment).
type standaloneAttachFails struct{ buffer.Backend }

func (f standaloneAttachFails) CreateSession(id string, meta buffer.SessionMeta) (buffer.Session, error) {
	s, err := f.Backend.CreateSession(id, meta)
	if err != nil {
		return nil, err
	}
	return standaloneAttachFailsSession{s}, nil
}

type standaloneAttachFailsSession struct{ buffer.Session }

func (s standaloneAttachFailsSession) Standalone() buffer.Stream {
	return attachFailsStream{s.Session.Standalone()}
}

// An adopted standalone stream whose client cannot be attached answers
// that client a complete 503 at once, over HTTP/1.1 and HTTP/2, whatever
// the upstream's GET does (a comment, nothing, a notification later): the
// GET is closed before the proxy reads a byte of it, so nothing it took is
// lost, and the handler returns. (It once went on following the upstream
// with the 503 unflushed: the client got nothing until the session ended;
// then dropped the GET at its first write, losing what it had read; then
// kept following it, which never ends an HTTP/2 response.)
func TestAdoptionAnswersAtOnceWhenAttachFails(t *testing.T) {
	notification := "data: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/tools/list_changed\"}\n\n"
	for _, tc := range []struct {
		name string
		step func(http.ResponseWriter, *http.Request) error
	}{
		{"a comment", sseStep("hang", ": hello\n\n")},
		{"nothing", sseStep("hang")},
		{"a notification later", func(w http.ResponseWriter, r *http.Request) error {
			w.Header().Set("Content-Type", "text/event-stream")
			w.WriteHeader(http.StatusOK)
			http.NewResponseController(w).Flush()
			time.Sleep(300 * time.Millisecond) // the upstream's own delay: the notification comes after the 503
			return sseStep("hang", notification)(discardHeaders{w}, r)
		}},
	} {
		for _, h2 := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s, HTTP/2 %v", tc.name, h2), func(t *testing.T) {
				h := testHandler(t)
				s := newSession(t, h, "2025-11-25")
				cursor := eventid.Append(nil, s.Epoch(), policy.StandaloneNum, 3)
				// The proxy "restarted": a new store with the same key holds
				// nothing, and its standalone streams cannot attach a client.
				fresh := buffer.NewMemoryStore(buffer.Options{Limits: h.Limits(), Key: []byte("k")})
				t.Cleanup(fresh.Close)
				h.rt.store = standaloneAttachFails{fresh}
				up := &upstream{steps: []func(http.ResponseWriter, *http.Request) error{tc.step}}
				served := make(chan struct{}, 1)
				srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					defer func() {
						select {
						case served <- struct{}{}:
						default: // one request is what the test makes
						}
					}()
					if err := h.ServeHTTP(w, r, up); err != nil {
						t.Logf("ServeHTTP: %v", err)
					}
				}))
				if h2 {
					srv.EnableHTTP2 = true
					srv.StartTLS()
				} else {
					srv.Start()
				}
				defer func() { h.rt.Stop(); srv.Close() }()

				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				req, _ := http.NewRequestWithContext(ctx, "GET", srv.URL+"/mcp", nil)
				req.Header.Set("Accept", "text/event-stream")
				req.Header.Set(hdrSessionID, "sess-1")
				req.Header.Set(hdrVersion, "2025-11-25")
				req.Header.Set(hdrLastEventID, string(cursor))
				req.Header.Set("Authorization", "Bearer x")
				began := time.Now()
				resp, err := srv.Client().Do(req)
				if err != nil {
					t.Fatalf("after %v the client has no response: %v", time.Since(began), err)
				}
				body, err := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusServiceUnavailable || err != nil || time.Since(began) > 2*time.Second {
					t.Fatalf("the client got %d %q and %v after %v, want a complete 503 at once", resp.StatusCode, body, err, time.Since(began))
				}
				if h2 && resp.ProtoMajor != 2 {
					t.Fatalf("the client spoke %s", resp.Proto)
				}
				sess, ok := fresh.Session("sess-1")
				if !ok {
					t.Fatal("the session was not adopted")
				}
				// The handler returns only once the upstream's GET ended, after
				// its notification (if any) was written: what the proxy would
				// have taken of it is in the stream by then.
				select {
				case <-served:
				case <-time.After(5 * time.Second):
					t.Fatal("the handler did not return after the 503")
				}
				if v := sess.Standalone().View(); v.Head != 0 || v.State != policy.Live {
					t.Fatalf("the adopted standalone stream: head %d, %v; want nothing taken, live", v.Head, v.State)
				}
				if p, err := sess.Standalone().TakeProducer(ctx); err != nil {
					t.Fatalf("the adopted standalone stream's producer role was kept: %v", err)
				} else {
					p.Done()
				}
			})
		}
	}
}

// A standalone GET whose upstream answers a 200 the proxy cannot tap (a
// compressed stream) reaches the client as it comes, not held back while
// the GET might still be asked again for a 409.
func TestStandaloneUntappableAnswerPassesAtOnce(t *testing.T) {
	h := testHandler(t)
	newSession(t, h, "2025-11-25")
	up := &upstream{steps: []func(http.ResponseWriter, *http.Request) error{
		func(w http.ResponseWriter, r *http.Request) error {
			w.Header().Set("Content-Encoding", "gzip")
			w.Header().Set("Content-Type", "text/event-stream")
			w.WriteHeader(http.StatusOK)
			io.WriteString(w, ": hello\n\n")
			http.NewResponseController(w).Flush() // as reverse_proxy flushes SSE
			<-r.Context().Done()
			panic(http.ErrAbortHandler)
		},
	}}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := h.ServeHTTP(w, r, up); err != nil {
			t.Logf("ServeHTTP: %v", err)
		}
	}))
	defer func() { h.rt.Stop(); srv.Close() }()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", srv.URL+"/mcp", nil)
	req.Header.Set("Accept", "text/event-stream")
	req.Header.Set(hdrSessionID, "sess-1")
	req.Header.Set(hdrVersion, "2025-11-25")
	req.Header.Set("Authorization", "Bearer x")
	resp, err := (&http.Client{Transport: &http.Transport{DisableCompression: true}}).Do(req)
	if err != nil {
		t.Fatalf("no response headers: %v", err)
	}
	defer resp.Body.Close()
	buf := make([]byte, 9)
	if n, err := io.ReadFull(resp.Body, buf); resp.StatusCode != 200 || resp.Header.Get("Content-Encoding") != "gzip" || err != nil {
		t.Fatalf("the client got %d %v, %q %v", resp.StatusCode, resp.Header, buf[:n], err)
	}
}

// discardHeaders is a writer whose header calls were made already.
type discardHeaders struct{ http.ResponseWriter }

func (discardHeaders) WriteHeader(int) {}

// earlyHints writes a 103 the way reverse_proxy's Got1xxResponse does, then
// the final answer.
func earlyHints(final func(http.ResponseWriter, *http.Request) error) func(http.ResponseWriter, *http.Request) error {
	return func(w http.ResponseWriter, r *http.Request) error {
		h := w.Header()
		own := h.Clone()
		h.Set("Link", "</style.css>; rel=preload")
		w.WriteHeader(http.StatusEarlyHints)
		clear(h)
		maps.Copy(h, own)
		return final(w, r)
	}
}

// standaloneGet opens the session's standalone stream over real HTTP and
// returns what came until the response ended (at most 3 s), once the
// handler returned: whatever the proxy did about the upstream's answer
// (ending the session, asking again) it has done by then.
func standaloneGet(t *testing.T, h *Engine, up *upstream) (*http.Response, string) {
	served := make(chan struct{}, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() {
			select {
			case served <- struct{}{}:
			default: // one request is what the test makes
			}
		}()
		if err := h.ServeHTTP(w, r, up); err != nil {
			t.Logf("ServeHTTP: %v", err)
		}
	}))
	t.Cleanup(srv.Close)
	t.Cleanup(func() { h.rt.Stop() })
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", srv.URL+"/mcp", nil)
	req.Header.Set("Accept", "text/event-stream")
	req.Header.Set(hdrSessionID, "sess-1")
	req.Header.Set(hdrVersion, "2025-11-25")
	req.Header.Set("Authorization", "Bearer x")
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body) // to its end, or the deadline's
	resp.Body.Close()
	select {
	case <-served:
	case <-time.After(5 * time.Second):
		t.Error("the handler did not return after the client's response ended")
	}
	return resp, string(body)
}

// An upstream 103 before its answer to a standalone GET passes to the
// client, and the answer after it decides as ever: a 404 ends the session
// (it reached the client as a 200 once, the session kept).
func TestEarlyHintsThen404EndsTheSession(t *testing.T) {
	h := testHandler(t)
	newSession(t, h, "2025-11-25")
	up := &upstream{steps: []func(http.ResponseWriter, *http.Request) error{earlyHints(statusStep(404))}}
	resp, body := standaloneGet(t, h, up)
	t.Logf("client got %d %v %q", resp.StatusCode, resp.Header, body)
	if _, ok := h.rt.store.Session("sess-1"); ok {
		t.Errorf("session still held after upstream 404")
	}
	if resp.StatusCode != 404 {
		t.Errorf("client got %d, want the upstream's 404", resp.StatusCode)
	}
}

// An upstream 409 to a standalone GET is the upstream's own answer (the
// proxy closed its previous GET before opening this one), so it reaches
// the client as plain reverse_proxy passes it, after a 103 too: the 409's
// status and body, nothing merged, and the upstream is not asked again.
func TestEarlyHintsThen409ReachesTheClient(t *testing.T) {
	h := testHandler(t)
	newSession(t, h, "2025-11-25")
	up := &upstream{steps: []func(http.ResponseWriter, *http.Request) error{
		earlyHints(statusStep(409)),
		sseStep("hang", "id: _1\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/message\",\"params\":{}}\n\n"),
	}}
	resp, body := standaloneGet(t, h, up)
	t.Logf("client got %d %v %q", resp.StatusCode, resp.Header, body)
	if resp.StatusCode != http.StatusConflict || strings.Contains(body, "data:") {
		t.Errorf("client got %d %q, want the upstream's 409", resp.StatusCode, body)
	}
	if n := len(up.requests()); n != 1 {
		t.Errorf("the upstream was asked %d times, want once", n)
	}
}

// An upstream whose IDs restart on each connection (no event store) reuses
// IDs the stream took for new events on the proxy's reconnect: they are
// new content, so taken; only what a replay repeats (same ID, same
// content, from before the reconnect) is dropped. IDs repeated within one
// response are never dropped.
func TestTapRepeatsAreOnlyAReplaysResends(t *testing.T) {
	h := testHandler(t)
	newSession(t, h, "2025-11-25")
	up := &upstream{steps: []func(http.ResponseWriter, *http.Request) error{
		sseStep("eof", progress("1", 1), progress("1", 2), progress("2", 3), "retry: 10\n\n"),
		sseStep("eof", progress("2", 3), progress("1", 4), progress("2", 5), result("3", "7")),
	}}
	w := serve(t, h, up, post("7"))
	reqs := up.requests()
	if len(reqs) != 2 || reqs[1].Header.Get(hdrLastEventID) != "2" {
		t.Fatalf("%d upstream requests", len(reqs))
	}
	evs := events(t, w.Body.String())
	checkContiguous(t, evs)
	if len(evs) != 6 || !strings.Contains(evs[5].Data, `"result"`) {
		t.Fatalf("client got %+v", evs)
	}
	for i := 0; i < 5; i++ {
		if !strings.Contains(evs[i].Data, fmt.Sprintf(`"progress":%d}`, i+1)) {
			t.Fatalf("event %d is %+v", i+1, evs[i])
		}
	}
}

// An event of exactly max_event_bytes (its fields as retained, without the
// upstream's id) is kept in every form it may come in; one byte more fails
// the stream too_large.
func TestTapEventOfExactlyMaxEventBytes(t *testing.T) {
	const max = 1024
	pad := max - len("data: \n")
	for _, tc := range []struct{ name, ev string }{
		{"as stored", "data: " + strings.Repeat("x", pad) + "\n\n"},
		{"with an id", "id: 7\ndata: " + strings.Repeat("x", pad) + "\n\n"},
		{"CR LF", "data: " + strings.Repeat("x", pad) + "\r\n\r\n"},
		{"id after data", "data: " + strings.Repeat("x", pad) + "\nid: 7\n\n"},
		{"typed", "event: m\ndata: " + strings.Repeat("x", pad-len("event: m\n")) + "\n\n"},
		{"retry and id", "retry: 100\nid: 7\ndata: " + strings.Repeat("x", pad) + "\n\n"},
	} {
		for _, extra := range []int{0, 1} {
			t.Run(fmt.Sprintf("%s+%d", tc.name, extra), func(t *testing.T) {
				h := testHandler(t)
				h.MaxEventBytes = max
				newSession(t, h, "2025-06-18")
				ev := strings.Replace(tc.ev, "xxx", strings.Repeat("x", 3+extra), 1)
				up := &upstream{steps: []func(http.ResponseWriter, *http.Request) error{sseStep("eof", ev+result("", `"r1"`))}}
				body := serve(t, h, up, post(`"r1"`)).Body.String()
				if failed := strings.Contains(body, string(policy.ReasonTooLarge)); failed != (extra == 1) {
					t.Fatalf("an event of %d bytes: failed %v", max+extra, failed)
				}
			})
		}
	}
}

// retry: is a wait of at most reconnectMax, whatever its digits: the
// milliseconds are compared before they are multiplied (18446744073710 ms
// once wrapped around to 0.45 ms).
func TestRetryDelay(t *testing.T) {
	for _, tc := range []struct {
		ms   int64
		want time.Duration
	}{
		{0, 0}, {1, time.Millisecond}, {9999, 9999 * time.Millisecond}, {10000, reconnectMax},
		{18446744073710, reconnectMax}, {9223372036854775807, reconnectMax}, {9223372036854, reconnectMax},
	} {
		if got := retryDelay(tc.ms); got != tc.want {
			t.Errorf("retryDelay(%d) = %v, want %v", tc.ms, got, tc.want)
		}
	}
}

// A standalone GET the upstream answers with an empty clean 200 is an
// attempt that brought nothing: the follower backs off and stops after
// maxReconnects of them, and the client's response ends.
func TestTapEmptyStandaloneGETsBackOffAndStop(t *testing.T) {
	h := testHandler(t)
	newSession(t, h, "2025-11-25")
	var steps []func(http.ResponseWriter, *http.Request) error
	for i := 0; i <= maxReconnects; i++ {
		steps = append(steps, sseStep("eof"))
	}
	up := &upstream{steps: steps}
	g := httptest.NewRequest("GET", "/mcp", nil)
	g.Header.Set("Accept", "text/event-stream")
	g.Header.Set(hdrSessionID, "sess-1")
	g.Header.Set("Authorization", "Bearer x")
	serve(t, h, up, g) // returns: the client's response ended
	if n := len(up.requests()); n != 1+maxReconnects {
		t.Fatalf("%d upstream GETs, want %d", n, 1+maxReconnects)
	}
	if d := up.at[len(up.at)-1].Sub(up.at[0]); d < 3*time.Second {
		t.Fatalf("%d GETs within %v: no backoff", len(up.at), d)
	}
}
