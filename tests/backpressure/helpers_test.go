package backpressure

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/internal/eventid"
	"github.com/mcpresume/caddy-mcp-resume/tests/harness"
)

// ---- the flood upstream ------------------------------------------------------

// flood is a minimal MCP server (Streamable HTTP, 2025-06-18) written with
// plain net/http: initialize gets a session, notifications get 202, and a
// tools/call answers with an SSE stream of n progress notifications of exactly
// eventSize bytes each, written and flushed as fast as the connection takes
// them, then the JSON-RPC response. It counts what it managed to write.
type flood struct {
	eventSize int

	nextSession atomic.Int64
	mu          sync.Mutex
	calls       map[string]*floodCall // by session id
}

type floodCall struct {
	n        int
	written  atomic.Int64 // bytes of progress events flushed to the socket
	events   atomic.Int64 // progress events flushed
	finished atomic.Bool  // the response was flushed too
	done     chan struct{}
}

func newFlood(eventSize int) *flood {
	return &flood{eventSize: eventSize, calls: make(map[string]*floodCall)}
}

// call returns the (latest) tools/call of a session, waiting for it to start.
func (f *flood) call(t testing.TB, sid string) *floodCall {
	t.Helper()
	var c *floodCall
	if !harness.Eventually(10*time.Second, 5*time.Millisecond, func() bool {
		f.mu.Lock()
		c = f.calls[sid]
		f.mu.Unlock()
		return c != nil
	}) {
		t.Fatalf("flood: no tools/call arrived for session %s", sid)
	}
	return c
}

// appendProgressEvent appends event i of n, exactly size bytes on the wire
// (the buffer is reused, so the upstream holds one event at a time).
func appendProgressEvent(dst []byte, i, n, size int) []byte {
	dst = fmt.Appendf(dst, "event: message\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\",\"params\":{\"progressToken\":\"t\",\"progress\":%d,\"total\":%d,\"pad\":\"", i, n)
	const suffix = "\"}}\n\n"
	if pad := size - len(suffix) - len(dst); pad > 0 {
		dst = append(dst, padding[:min(pad, len(padding))]...)
	}
	return append(dst, suffix...)
}

var padding = strings.Repeat("x", 1<<20)

func (f *flood) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch r.Method {
	case http.MethodPost:
	case http.MethodDelete:
		w.WriteHeader(http.StatusOK)
		return
	default:
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	var msg struct {
		ID     json.RawMessage `json:"id"`
		Method string          `json:"method"`
		Params struct {
			Arguments struct {
				N int `json:"n"`
			} `json:"arguments"`
		} `json:"params"`
	}
	if err := json.NewDecoder(r.Body).Decode(&msg); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	if len(msg.ID) == 0 {
		w.WriteHeader(http.StatusAccepted) // a notification
		return
	}
	switch msg.Method {
	case "initialize":
		sid := fmt.Sprintf("flood-%d", f.nextSession.Add(1))
		w.Header().Set("Mcp-Session-Id", sid)
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"jsonrpc":"2.0","id":%s,"result":{"protocolVersion":"2025-06-18","capabilities":{"tools":{}},"serverInfo":{"name":"flood","version":"1"}}}`, msg.ID)
		return
	case "tools/call":
	default:
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"jsonrpc":"2.0","id":%s,"result":{}}`, msg.ID)
		return
	}
	c := &floodCall{n: msg.Params.Arguments.N, done: make(chan struct{})}
	defer close(c.done)
	f.mu.Lock()
	f.calls[r.Header.Get("Mcp-Session-Id")] = c
	f.mu.Unlock()

	rc := http.NewResponseController(w)
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	if rc.Flush() != nil {
		return
	}
	ev := make([]byte, 0, f.eventSize+64)
	for i := 1; i <= c.n; i++ {
		ev = appendProgressEvent(ev[:0], i, c.n, f.eventSize)
		if _, err := w.Write(ev); err != nil {
			return
		}
		if rc.Flush() != nil {
			return
		}
		c.written.Add(int64(len(ev)))
		c.events.Add(1)
	}
	fmt.Fprintf(w, "event: message\ndata: {\"jsonrpc\":\"2.0\",\"id\":%s,\"result\":{\"content\":[{\"type\":\"text\",\"text\":\"flooded %d\"}]}}\n\n", msg.ID, c.n)
	if rc.Flush() == nil {
		c.finished.Store(true)
	}
}

// ---- Caddy ---------------------------------------------------------------------

// evictedBeforeAck is the metric that must stay 0 (design §4).
const evictedBeforeAck = "caddy_mcp_resume_events_evicted_before_ack_total"

// assertNoEarlyEviction checks caddy_mcp_resume_events_evicted_before_ack_total
// through Caddy's admin /metrics; it fails the test if the metric is exposed
// and not 0, and says so if it is not exposed.
func assertNoEarlyEviction(t *testing.T, c *harness.Caddy) {
	t.Helper()
	m, err := c.Metrics()
	if err != nil {
		t.Errorf("admin /metrics: %v", err)
		return
	}
	v, ok := harness.MetricSum(m, evictedBeforeAck)
	if !ok {
		t.Errorf("admin /metrics does not expose %s", evictedBeforeAck)
		return
	}
	if v != 0 {
		t.Errorf("%s = %v, want 0: events left a log while a client could still ask for them", evictedBeforeAck, v)
	}
}

// ---- a raw Streamable HTTP client ---------------------------------------------

// client speaks Streamable HTTP by hand over its own cuttable transport.
// Its methods return errors (no t.Fatal) so goroutines can use them.
type client struct {
	url     string
	version string
	sid     string
	ct      *harness.CuttableTransport
	hc      *http.Client
}

func newClient(base, version string, rcvbuf int) *client {
	ct := harness.NewCuttableTransportRcvbuf(rcvbuf)
	return &client{url: base + "/mcp", version: version, ct: ct, hc: &http.Client{Transport: ct}}
}

func (c *client) close() { c.ct.CloseIdleConnections(); c.ct.Cut(false) }

func (c *client) do(ctx context.Context, method, body string, extra map[string]string) (*http.Response, error) {
	req, err := harness.NewStreamableRequest(ctx, method, c.url, body, nil, c.sid, c.version)
	if err != nil {
		return nil, err
	}
	for k, v := range extra {
		req.Header.Set(k, v)
	}
	return c.hc.Do(req)
}

// initialize opens a session and sends notifications/initialized.
func (c *client) initialize() error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, err := c.do(ctx, "POST", fmt.Sprintf(`{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":%q,"capabilities":{},"clientInfo":{"name":"backpressure","version":"1"}}}`, c.version), nil)
	if err != nil {
		return fmt.Errorf("initialize: %w", err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		return fmt.Errorf("initialize: %d %s", resp.StatusCode, body)
	}
	c.sid = resp.Header.Get("Mcp-Session-Id")
	if c.sid == "" || !bytes.Contains(body, []byte(c.version)) {
		return fmt.Errorf("initialize: no session or another version: %q", body)
	}
	resp, err = c.do(ctx, "POST", `{"jsonrpc":"2.0","method":"notifications/initialized"}`, nil)
	if err != nil {
		return fmt.Errorf("notifications/initialized: %w", err)
	}
	resp.Body.Close()
	if resp.StatusCode != 202 {
		return fmt.Errorf("notifications/initialized: %d", resp.StatusCode)
	}
	return nil
}

// call starts a tools/call and returns its open SSE stream.
func (c *client) call(id int, tool string, args map[string]any, idle time.Duration) (*sseStream, error) {
	a, _ := json.Marshal(args)
	body := fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":%q,"arguments":%s,"_meta":{"progressToken":"t"}}}`, id, tool, a)
	return c.open("POST", body, nil, idle)
}

// resume sends GET with Last-Event-ID and returns the SSE stream.
func (c *client) resume(lastID string, idle time.Duration) (*sseStream, error) {
	return c.open("GET", "", map[string]string{"Last-Event-ID": lastID}, idle)
}

func (c *client) open(method, body string, extra map[string]string, idle time.Duration) (*sseStream, error) {
	ctx, cancel := context.WithCancel(context.Background())
	s := &sseStream{cancel: cancel, idle: idle}
	s.watchdog = time.AfterFunc(idle, func() { s.timedOut.Store(true); cancel() })
	resp, err := c.do(ctx, method, body, extra)
	if err != nil {
		s.watchdog.Stop()
		cancel()
		return nil, fmt.Errorf("%s: %w", method, err)
	}
	if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		s.watchdog.Stop()
		cancel()
		return nil, fmt.Errorf("%s: %d %s %s", method, resp.StatusCode, resp.Header.Get("Content-Type"), b)
	}
	s.resp = resp
	s.events = harness.NewSSEReader(resp.Body, 4096)
	return s, nil
}

// sseStream reads one SSE response event by event. A watchdog ends it if no
// event arrives for its idle duration.
type sseStream struct {
	resp     *http.Response
	events   *harness.SSEReader
	cancel   context.CancelFunc
	idle     time.Duration
	watchdog *time.Timer
	timedOut atomic.Bool
}

// next returns the next event (comments skipped); io.EOF at the end.
func (s *sseStream) next() (harness.SSEEvent, error) {
	s.watchdog.Reset(s.idle)
	ev, err := s.events.Next()
	if err != nil && s.timedOut.Load() {
		return ev, fmt.Errorf("no event for %v", s.idle)
	}
	return ev, err
}

// close drops the connection (the body is unfinished, so the transport closes it).
func (s *sseStream) close() {
	s.watchdog.Stop()
	s.cancel()
	s.resp.Body.Close()
}

// ---- checking what a client got ----------------------------------------------

// tracker checks one request stream as a client sees it across connections:
// proxy IDs <epoch>-<stream>-<seq> with contiguous seq (so every event
// exactly once, in order), progress i at seq i, then the response. A gap
// (event: gap) is accepted and accounted: its id moves the cursor, its data
// says how many events were lost.
type tracker struct {
	epoch    string
	stream   uint32
	lastID   string
	lastSeq  uint64
	progress int // last progress value seen
	events   int // events with data and an id taken
	done     bool
	errorMsg string // a JSON-RPC error response, if that ended the call
	gaps     []gapInfo
	lost     int      // sum of the gaps' lost counts
	warnings []string // notifications/message without an id (sent with a gap)
}

type gapInfo struct {
	LastEventID string `json:"lastEventId"`
	ResumeFrom  string `json:"resumeFrom"`
	Lost        int    `json:"lost"`
	Reason      string `json:"reason"`
}

type message struct {
	ID     json.RawMessage `json:"id"`
	Method string          `json:"method"`
	Params struct {
		Progress float64 `json:"progress"`
	} `json:"params"`
	Result json.RawMessage `json:"result"`
	Error  *struct {
		Message string `json:"message"`
	} `json:"error"`
}

func (tr *tracker) position(evID string) (eventid.ID, error) {
	id, err := eventid.Parse(evID)
	if err != nil {
		return id, fmt.Errorf("event id %q: %v", evID, err)
	}
	if tr.epoch == "" {
		tr.epoch, tr.stream = id.Epoch, id.Stream
	} else if id.Epoch != tr.epoch || id.Stream != tr.stream {
		return id, fmt.Errorf("event id %q: epoch/stream changed from %s-%d", evID, tr.epoch, tr.stream)
	}
	return id, nil
}

// take checks one event; an error means loss, duplication or disorder.
func (tr *tracker) take(ev harness.SSEEvent, requestID int) error {
	if ev.Type == "gap" {
		var g gapInfo
		if err := json.Unmarshal([]byte(ev.Data), &g); err != nil {
			return fmt.Errorf("gap event: %v: %s", err, ev.Data)
		}
		id, err := tr.position(ev.ID)
		if err != nil {
			return err
		}
		if g.Lost > 0 {
			if id.Seq != tr.lastSeq+uint64(g.Lost) {
				return fmt.Errorf("gap %s moves the cursor from seq %d to %d but says %d lost", ev.Data, tr.lastSeq, id.Seq, g.Lost)
			}
			tr.lost += g.Lost
			tr.progress += g.Lost
		}
		tr.gaps = append(tr.gaps, g)
		tr.lastSeq, tr.lastID = id.Seq, ev.ID
		return nil
	}
	var m message
	if ev.ID == "" {
		// Only what goes with a gap comes without an id: the warning, or
		// the error for a request whose response was lost.
		if err := json.Unmarshal([]byte(ev.Data), &m); err != nil || len(tr.gaps) == 0 {
			return fmt.Errorf("event without id: %+v", ev)
		}
		switch {
		case m.Method == "notifications/message":
			tr.warnings = append(tr.warnings, ev.Data)
		case string(m.ID) == strconv.Itoa(requestID) && m.Error != nil:
			tr.done, tr.errorMsg = true, m.Error.Message
		default:
			return fmt.Errorf("event without id: %+v", ev)
		}
		return nil
	}
	id, err := tr.position(ev.ID)
	if err != nil {
		return err
	}
	if ev.Data == "" { // priming event (2025-11-25): the position before seq 1
		if id.Seq != 0 || tr.events > 0 {
			return fmt.Errorf("empty event %q not at seq 0", ev.ID)
		}
		tr.lastID = ev.ID
		return nil
	}
	if id.Seq != tr.lastSeq+1 {
		return fmt.Errorf("event %q after seq %d: lost or duplicated events", ev.ID, tr.lastSeq)
	}
	tr.lastSeq, tr.lastID = id.Seq, ev.ID
	tr.events++
	if err := json.Unmarshal([]byte(ev.Data), &m); err != nil {
		return fmt.Errorf("event %q: %v: %.200s", ev.ID, err, ev.Data)
	}
	switch {
	case m.Method == "notifications/progress":
		if int(m.Params.Progress) != tr.progress+1 {
			return fmt.Errorf("event %q: progress %v after %d", ev.ID, m.Params.Progress, tr.progress)
		}
		tr.progress++
	case m.Method != "":
		return fmt.Errorf("event %q: unexpected notification %.200s", ev.ID, ev.Data)
	case string(m.ID) == strconv.Itoa(requestID):
		tr.done = true
		if m.Error != nil {
			tr.errorMsg = m.Error.Message
		}
	default:
		return fmt.Errorf("event %q: unexpected message %.200s", ev.ID, ev.Data)
	}
	return nil
}

// readAll reads a stream to its end (or the call's response) into tr.
func readAll(s *sseStream, tr *tracker, requestID int) error {
	for !tr.done {
		ev, err := s.next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		if err := tr.take(ev, requestID); err != nil {
			return err
		}
	}
	return nil
}

// drain reads a call to its response, resuming from the last event seen
// whenever a connection ends, and re-resuming every batch events: a resume
// acknowledges what was read, which is what frees the log when delivered
// events stay retained for a long resume window.
func drain(cl *client, s *sseStream, tr *tracker, requestID, batch, maxResumes int) (resumes int, err error) {
	for {
		for k := 0; k < batch && !tr.done; k++ {
			ev, err := s.next()
			if err == io.EOF {
				break
			}
			if err != nil {
				s.close()
				return resumes, fmt.Errorf("after resume %d from %s, %d events in: %w", resumes, tr.lastID, k, err)
			}
			if err := tr.take(ev, requestID); err != nil {
				s.close()
				return resumes, fmt.Errorf("after resume %d: %w", resumes, err)
			}
		}
		s.close()
		if tr.done {
			return resumes, nil
		}
		if resumes >= maxResumes {
			return resumes, errors.New("too many resumes without the response")
		}
		resumes++
		if s, err = cl.resume(tr.lastID, s.idle); err != nil {
			return resumes, fmt.Errorf("resume %d from %s: %w", resumes, tr.lastID, err)
		}
	}
}
