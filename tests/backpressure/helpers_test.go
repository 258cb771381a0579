package backpressure

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/internal/eventid"
	"github.com/mcpresume/caddy-mcp-resume/internal/mcptest"
	"github.com/mcpresume/caddy-mcp-resume/tests/harness"
)

// ---- the flood upstream ------------------------------------------------------

// newFlood is the upstream of the flood tests: an mcptest.Upstream whose
// tools/call streams progress notifications flushed one by one as fast as
// the connection takes them, and which counts what it managed to write.
func newFlood() *mcptest.Upstream {
	return &mcptest.Upstream{Version: "2025-06-18", FlushEach: true, KeepCalls: true}
}

// floodProxy is a Caddy with the resume options conf in front of a flood
// upstream whose connections get send buffers of sndbuf bytes (0: the
// kernel's).
func floodProxy(t *testing.T, sndbuf int, conf string) (*mcptest.Upstream, *harness.Caddy) {
	t.Helper()
	f := newFlood()
	return f, harness.StartCaddy(t, mcptest.ResumeRoute(harness.StartHandlerSndbuf(t, f, sndbuf), conf))
}

// floodArgs asks for n progress events of exactly eventSize bytes on the
// wire (the sizes in these tests are the upstream's bytes, framing included).
func floodArgs(n, eventSize int) mcptest.StreamArgs {
	return mcptest.StreamArgs{N: n, Size: eventSize - len(mcptest.EventPrefix) - len(mcptest.EventSuffix)}
}

// floodCall returns the (latest) tools/call of a session, waiting for it to
// start.
func floodCall(t testing.TB, f *mcptest.Upstream, sid string) *mcptest.Call {
	t.Helper()
	var c *mcptest.Call
	if !mcptest.Eventually(10*time.Second, 5*time.Millisecond, func() bool { c = f.LastCall(sid); return c != nil }) {
		t.Fatalf("flood: no tools/call arrived for session %s", sid)
	}
	return c
}

// upstreamFinished fails the test unless the call's handler ends, having
// written its response, within 10s.
func upstreamFinished(t *testing.T, fc *mcptest.Call) {
	t.Helper()
	select {
	case <-fc.Done:
	case <-time.After(10 * time.Second):
		t.Fatal("the upstream handler did not finish")
	}
	if !fc.Finished.Load() {
		t.Fatal("the upstream could not write its response")
	}
}

// ---- Caddy ---------------------------------------------------------------------

// evictedBeforeAck is the metric that must stay 0: an event may leave the
// log only once a client acknowledged it or its resume window passed.
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
	v, ok := m.Sum(evictedBeforeAck)
	if !ok {
		t.Errorf("admin /metrics does not expose %s", evictedBeforeAck)
		return
	}
	if v != 0 {
		t.Errorf("%s = %v, want 0: events left a log while a client could still ask for them", evictedBeforeAck, v)
	}
}

// ---- a raw Streamable HTTP client ---------------------------------------------

// client is a session over its own cuttable transport. Its methods return
// errors (no t.Fatal) so goroutines can use them.
type client struct {
	*mcptest.Client
	ct *mcptest.CuttableTransport
}

func newClient(base, version string) *client {
	ct := mcptest.NewCuttableTransport(0)
	return &client{Client: mcptest.NewClient(base, version, &http.Client{Transport: ct}), ct: ct}
}

// session is a client of c whose session is initialized; it is closed when
// the test ends.
func session(t *testing.T, c *harness.Caddy) *client {
	t.Helper()
	cl := newClient(c.Base(), "2025-06-18")
	t.Cleanup(cl.close)
	if err := cl.initialize(); err != nil {
		t.Fatal(err)
	}
	return cl
}

func (c *client) close() { c.ct.CloseIdleConnections(); c.ct.Cut(false) }

// initialize opens the session, within 30s.
func (c *client) initialize() error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return c.Initialize(ctx)
}

// call starts a tools/call and returns its open SSE stream.
func (c *client) call(id int, tool string, args any, idle time.Duration) (*sseStream, error) {
	return c.open("POST", mcptest.CallBody(id, tool, args, "t"), nil, idle)
}

// resume sends GET with Last-Event-ID and returns the SSE stream.
func (c *client) resume(lastID string, idle time.Duration) (*sseStream, error) {
	return c.open("GET", "", http.Header{"Last-Event-Id": {lastID}}, idle)
}

func (c *client) open(method, body string, extra http.Header, idle time.Duration) (*sseStream, error) {
	ctx, cancel := context.WithCancel(context.Background())
	s := &sseStream{cancel: cancel, idle: idle}
	s.watchdog = time.AfterFunc(idle, func() { s.timedOut.Store(true); cancel() })
	resp, err := c.Do(ctx, method, body, extra)
	if err != nil {
		s.watchdog.Stop()
		cancel()
		return nil, fmt.Errorf("%s: %w", method, err)
	}
	if resp.StatusCode != 200 || mcptest.MediaType(resp.Header) != "text/event-stream" {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		s.watchdog.Stop()
		cancel()
		return nil, fmt.Errorf("%s: %d %s %s", method, resp.StatusCode, resp.Header.Get("Content-Type"), b)
	}
	s.resp = resp
	s.events = mcptest.NewSSEReader(resp.Body, 4096)
	return s, nil
}

// sseStream reads one SSE response event by event. A watchdog ends it if no
// event arrives for its idle duration.
type sseStream struct {
	resp     *http.Response
	events   *mcptest.SSEReader
	cancel   context.CancelFunc
	idle     time.Duration
	watchdog *time.Timer
	timedOut atomic.Bool
}

// next returns the next event (comments skipped); io.EOF at the end.
func (s *sseStream) next() (mcptest.Event, error) {
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
	gaps     []mcptest.Gap
	lost     int      // sum of the gaps' lost counts
	warnings []string // notifications/message without an id (sent with a gap)
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
func (tr *tracker) take(ev mcptest.Event, requestID int) error {
	if ev.Type == "gap" {
		var g mcptest.Gap
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
	var m mcptest.Message
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

// dumpState logs what the proxy holds, for a failure to say why.
func dumpState(t *testing.T, c *harness.Caddy) {
	t.Helper()
	if ss, err := c.Sessions(); err == nil {
		for _, se := range ss {
			b, _ := json.Marshal(se)
			t.Logf("session %s", b)
		}
	}
	if m, err := c.Metrics(); err == nil {
		for k, v := range m.Series {
			if strings.HasPrefix(k, "caddy_mcp_resume_") && v != 0 {
				t.Logf("%s %v", k, v)
			}
		}
	}
}
