package resume

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/buffer"
	"github.com/mcpresume/caddy-mcp-resume/internal/eventid"
	"github.com/mcpresume/caddy-mcp-resume/policy"
)

// Unit tests of the initialize writer and the relay, on httptest, with the
// scripted upstream of tap_test.go.

func initializeRequest(version string) *http.Request {
	body := fmt.Sprintf(`{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":%q,"capabilities":{},"clientInfo":{"name":"t","version":"1"}}}`, version)
	r := httptest.NewRequest("POST", "/mcp", strings.NewReader(body))
	r.Header.Set("Content-Type", "application/json")
	r.Header.Set("Accept", "application/json, text/event-stream")
	r.Header.Set("Authorization", "Bearer x")
	return r
}

func initializeResult(version string) string {
	return fmt.Sprintf(`{"jsonrpc":"2.0","id":0,"result":{"protocolVersion":%q,"capabilities":{},"serverInfo":{"name":"s","version":"1"}}}`, version)
}

// watchingWriter records, at each write reaching the client, whether the
// session was registered by then.
type watchingWriter struct {
	*httptest.ResponseRecorder
	h          *Engine
	registered []bool
}

func (w *watchingWriter) Write(p []byte) (int, error) {
	_, ok := w.h.rt.store.Session("sess-1")
	w.registered = append(w.registered, ok)
	return w.ResponseRecorder.Write(p)
}

// The initialize writer registers the session before any byte of the
// result reaches the client, whether the upstream answers JSON (in two
// writes) or SSE; the client gets the upstream's bytes unchanged.
func TestInitializeRegistersBeforeTheResult(t *testing.T) {
	for _, kind := range []string{"json", "sse"} {
		t.Run(kind, func(t *testing.T) {
			h := testHandler(t)
			res := initializeResult("2025-11-25")
			sent := res
			next := &upstream{steps: []func(http.ResponseWriter, *http.Request) error{
				func(w http.ResponseWriter, r *http.Request) error {
					w.Header().Set(hdrSessionID, "sess-1")
					if kind == "json" {
						w.Header().Set("Content-Type", "application/json")
						w.WriteHeader(http.StatusOK)
						io.WriteString(w, res[:20])
						io.WriteString(w, res[20:])
						return nil
					}
					sent = "event: message\ndata: " + res + "\n\n"
					w.Header().Set("Content-Type", "text/event-stream")
					w.WriteHeader(http.StatusOK)
					io.WriteString(w, sent)
					return nil
				},
			}}
			w := &watchingWriter{ResponseRecorder: httptest.NewRecorder(), h: h}
			if err := h.ServeHTTP(w, initializeRequest("2025-11-25"), next); err != nil {
				t.Fatal(err)
			}
			if len(w.registered) == 0 || w.registered[0] != true {
				t.Fatalf("writes reached the client before the session was registered: %v", w.registered)
			}
			if got := w.Body.String(); got != sent {
				t.Fatalf("client got %q, want the upstream's %q", got, sent)
			}
			if sess, _ := h.rt.store.Session("sess-1"); sess.Meta().Version != "2025-11-25" || sess.Meta().Origin != policy.Initialized {
				t.Fatalf("session meta %+v", sess.Meta())
			}
		})
	}
}

// A session of a version without resumption is remembered, untapped: its
// calls pass through as the upstream sends them, with no proxy IDs.
func TestInitializeOfAnUnresumableVersion(t *testing.T) {
	h := testHandler(t)
	call := progress("up-1", 1) + result("up-2", "1")
	next := &upstream{steps: []func(http.ResponseWriter, *http.Request) error{
		func(w http.ResponseWriter, r *http.Request) error {
			w.Header().Set(hdrSessionID, "sess-1")
			w.Header().Set("Content-Type", "application/json")
			io.WriteString(w, initializeResult("2026-07-28"))
			return nil
		},
		sseStep("eof", call),
	}}
	serve(t, h, next, initializeRequest("2026-07-28"))
	sess, ok := h.rt.store.Session("sess-1")
	if !ok || sess.Meta().Origin != policy.Untapped {
		t.Fatalf("session %v held as %+v, want untapped", ok, sess)
	}
	r := post("1")
	r.Header.Set(hdrVersion, "2026-07-28")
	if got := serve(t, h, next, r).Body.String(); got != call {
		t.Fatalf("a 2026-07-28 call was changed: %q", got)
	}
}

// Responses the writer must not hold pass through untouched, and no
// session is registered: an error status, and a result too large to inspect.
func TestInitializeWriterPassesThrough(t *testing.T) {
	big := `{"jsonrpc":"2.0","id":0,"result":{"pad":"` + strings.Repeat("x", maxInitPeek) + `"}}`
	for name, step := range map[string]func(http.ResponseWriter, *http.Request) error{
		"400": func(w http.ResponseWriter, r *http.Request) error {
			w.Header().Set(hdrSessionID, "sess-1")
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusBadRequest)
			io.WriteString(w, `{"error":"bad"}`)
			return nil
		},
		"too large": func(w http.ResponseWriter, r *http.Request) error {
			w.Header().Set(hdrSessionID, "sess-1")
			w.Header().Set("Content-Type", "application/json")
			for i := 0; i < len(big); i += 64 << 10 {
				io.WriteString(w, big[i:min(i+64<<10, len(big))])
			}
			return nil
		},
	} {
		t.Run(name, func(t *testing.T) {
			h := testHandler(t)
			next := &upstream{steps: []func(http.ResponseWriter, *http.Request) error{step}}
			w := serve(t, h, next, initializeRequest("2025-11-25"))
			want := `{"error":"bad"}`
			if name == "too large" {
				want = big
			}
			if w.Body.String() != want {
				t.Fatalf("client got %d bytes, want the upstream's %d", w.Body.Len(), len(want))
			}
			if _, ok := h.rt.store.Session("sess-1"); ok {
				t.Fatal("a session was registered from a response the writer could not inspect")
			}
		})
	}
}

// relayServer serves h (with next as the upstream) on a real socket, as the
// relay needs: flushes, hijacks, write errors; with ConnContext, so a
// short answer can be written by the tap itself (handoff.go).
func relayServer(t *testing.T, h *Engine, next Next) *httptest.Server {
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.ServeHTTP(w, r, next)
	}))
	srv.Config.ConnContext = ConnContext
	srv.Start()
	t.Cleanup(srv.Close)
	return srv
}

func resumeReq(t *testing.T, base, lastID string) *http.Response {
	t.Helper()
	return resumeReqAs(t, base, lastID, "x", 0)
}

// resumeReqAs is resumeReq with the bearer token, bounded by timeout (0:
// none); the body closes with the test.
func resumeReqAs(t *testing.T, base, lastID, bearer string, timeout time.Duration) *http.Response {
	t.Helper()
	ctx := context.Background()
	if timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, timeout)
		t.Cleanup(cancel)
	}
	r, _ := http.NewRequestWithContext(ctx, "GET", base+"/mcp", nil)
	r.Header.Set("Accept", "text/event-stream")
	r.Header.Set(hdrSessionID, "sess-1")
	r.Header.Set(hdrVersion, "2025-11-25")
	r.Header.Set("Authorization", "Bearer "+bearer)
	r.Header.Set(hdrLastEventID, lastID)
	resp, err := http.DefaultClient.Do(r)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	return resp
}

// readSSE reads events (skipping comments) until n arrived or the body ends.
func readSSE(t *testing.T, body io.Reader, n int) (evs []sseEvent, comments int) {
	t.Helper()
	br := bufio.NewReader(body)
	var cur sseEvent
	for n <= 0 || len(evs) < n {
		line, err := br.ReadString('\n')
		if err != nil {
			return evs, comments
		}
		line = strings.TrimSuffix(line, "\n")
		switch {
		case line == "":
			if cur != (sseEvent{}) {
				evs = append(evs, cur)
			}
			cur = sseEvent{}
		case strings.HasPrefix(line, ":"):
			comments++
		case strings.HasPrefix(line, "id: "):
			cur.ID = line[4:]
		case strings.HasPrefix(line, "event: "):
			cur.Type = line[7:]
		case strings.HasPrefix(line, "data: "):
			cur.Data += line[6:]
		}
	}
	return evs, comments
}

// The relay replays what the client missed, follows live, sends keepalive
// comments while the stream is idle, and ends with the stream; a second
// connection to the stream takes it over and the first is cut.
func TestRelay(t *testing.T) {
	h := testHandler(t)
	h.Keepalive = 50 * time.Millisecond
	sess := newSession(t, h, "2025-11-25")
	release := make(chan struct{})
	next := &upstream{steps: []func(http.ResponseWriter, *http.Request) error{
		func(w http.ResponseWriter, r *http.Request) error {
			w.Header().Set("Content-Type", "text/event-stream")
			w.WriteHeader(http.StatusOK)
			for i := 1; i <= 3; i++ {
				io.WriteString(w, progress("", i))
			}
			http.NewResponseController(w).Flush()
			<-release
			io.WriteString(w, result("", "1"))
			return nil
		},
	}}
	srv := relayServer(t, h, next)

	// The call, cut by its client after the first event.
	req, _ := http.NewRequest("POST", srv.URL+"/mcp", post("1").Body)
	req.Header = post("1").Header
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	first, _ := readSSE(t, resp.Body, 2) // priming, progress 1
	resp.Body.Close()
	if len(first) != 2 {
		t.Fatalf("call: %+v", first)
	}
	stream := eventid.Append(nil, sess.Epoch(), 1, 1)

	// Resume from progress 1: the client's position (a priming event), the
	// replay (2, 3), then keepalives while idle.
	a := resumeReq(t, srv.URL, string(stream))
	defer a.Body.Close()
	evs, _ := readSSE(t, a.Body, 3)
	if len(evs) != 3 || evs[0] != (sseEvent{ID: string(stream)}) ||
		!strings.Contains(evs[1].Data, `"progress":2`) || !strings.Contains(evs[2].Data, `"progress":3`) {
		t.Fatalf("replay: %+v", evs)
	}
	br := bufio.NewReader(a.Body)
	if line, err := br.ReadString('\n'); err != nil || !strings.HasPrefix(line, ":") {
		t.Fatalf("no keepalive comment on an idle stream: %q %v", line, err)
	}

	// A second connection from progress 3 takes the stream over: the first
	// is cut, the second gets the live result and ends with the stream.
	b := resumeReq(t, srv.URL, string(eventid.Append(nil, sess.Epoch(), 1, 3)))
	defer b.Body.Close()
	done := make(chan error, 1)
	go func() { _, err := io.Copy(io.Discard, br); done <- err }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("the first connection was not cut when the second took the stream over")
	}
	close(release)
	evs, _ = readSSE(t, b.Body, 0)
	if len(evs) != 2 || evs[0] != (sseEvent{ID: string(eventid.Append(nil, sess.Epoch(), 1, 3))}) ||
		!strings.Contains(evs[1].Data, `"result"`) {
		t.Fatalf("taken-over stream: %+v, want its position, the result and the end", evs)
	}
}

// A next handler that panics while its SSE response is tapped (an
// in-process SDK server's bug) fails its stream loudly and the panic goes
// on to net/http: the request does not hang waiting for the relay of a
// stream nothing will end.
func TestAPanickingUpstreamFailsItsStream(t *testing.T) {
	t.Parallel()
	h := testHandler(t)
	newSession(t, h, "2025-11-25")
	next := NextHandler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		io.WriteString(w, "data: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\",\"params\":{\"progressToken\":1,\"progress\":1}}\n\n")
		http.NewResponseController(w).Flush()
		panic("the tool broke")
	}))
	rec := httptest.NewRecorder()
	recovered := make(chan any, 1)
	go func() {
		defer func() { recovered <- recover() }()
		h.ServeHTTP(rec, post("1"), next)
	}()
	select {
	case p := <-recovered:
		if p != "the tool broke" {
			t.Fatalf("recovered %v, want the handler's panic", p)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the request hangs after its upstream handler panicked")
	}
	evs := events(t, rec.Body.String())
	if len(evs) < 2 || !strings.Contains(evs[0].Data, "notifications/progress") || !strings.Contains(rec.Body.String(), "-32010") {
		t.Fatalf("the client got %q, want the progress then the failure", rec.Body.String())
	}
}

// A resume of a 2025-11-25 stream starts with the client's own position
// (a priming event), and a relay the stopping process cuts before it
// wrote an event on its connection (a resume at head) gives it again, an
// ID with no data: a client that took a stream with no ID in it for the
// call lost (the Go SDK) resumes again from it, whenever the cut comes.
func TestARelayCutByTheStopLeavesTheClientAnID(t *testing.T) {
	t.Parallel()
	h := testHandler(t)
	sess, _, srv := oneEventStream(t, h, "2025-11-25")
	at := string(eventid.Append(nil, sess.Epoch(), 1, 1))
	resp := resumeReq(t, srv.URL, at) // at head
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	pre := make([]byte, len("id: "+at+"\ndata: \n\n"))
	if _, err := io.ReadFull(br, pre); err != nil || string(pre) != "id: "+at+"\ndata: \n\n" {
		t.Fatalf("the resume began with %q, %v: want a priming event at the client's position", pre, err)
	}
	h.rt.Stop()
	rest, _ := io.ReadAll(br)
	if want := "id: " + at + "\n\n"; string(rest) != want {
		t.Fatalf("after the stop the client got %q, want %q", rest, want)
	}
}

// An older version's resume of a request stream (its clients may get no
// event without data) sends its headers with its first event, so a cut
// before it is a failed request the client makes again: a replay's at
// once, a resume at head's with the call's next event, however long that
// takes (no keep-alive goes before it).
func TestAnOlderVersionsResumeHoldsItsHeadersForItsFirstEvents(t *testing.T) {
	t.Parallel()
	h := testHandlerWith(t, Config{})
	h.Keepalive = 50 * time.Millisecond
	sess, str, srv := oneEventStream(t, h, "2025-06-18")
	first := func(lastID string) (string, time.Duration) {
		began := time.Now()
		resp := resumeReq(t, srv.URL, lastID)
		defer resp.Body.Close()
		line, err := bufio.NewReader(resp.Body).ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		return line, time.Since(began)
	}
	if line, _ := first(string(eventid.Append(nil, sess.Epoch(), 1, 0))); line != "id: "+string(eventid.Append(nil, sess.Epoch(), 1, 1))+"\n" {
		t.Fatalf("a replay began with %q, want its first event", line)
	}
	const later = 300 * time.Millisecond // six keep-alive intervals
	time.AfterFunc(later, func() { str.Append(context.Background(), buffer.Entry{Fields: []byte("data: {}\n")}) })
	line, took := first(string(eventid.Append(nil, sess.Epoch(), 1, 1)))
	if want := "id: " + string(eventid.Append(nil, sess.Epoch(), 1, 2)) + "\n"; line != want || took < later {
		t.Fatalf("a resume at head began with %q after %v, want %q after %v", line, took, want, later)
	}
}

// oneEventStream opens session sess-1 at version with request stream 1
// holding one event, and a server relaying h's resumes of it.
func oneEventStream(t *testing.T, h *Engine, version string) (buffer.Session, buffer.Stream, *httptest.Server) {
	t.Helper()
	sess := newSession(t, h, version)
	str, err := sess.NewStream([]string{`1`}, [32]byte{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := str.Append(context.Background(), buffer.Entry{Fields: []byte("data: {}\n")}); err != nil {
		t.Fatal(err)
	}
	return sess, str, relayServer(t, h, &upstream{})
}
