package harness

// This file is the kit of the flood suites (backpressure, soak): a flood
// upstream, a client that reads SSE responses event by event under an idle
// watchdog, and a Tracker that checks what a client got across cuts,
// resumes and gaps.

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
)

// ---- the flood upstream ------------------------------------------------------

// NewFlood is the upstream of the flood tests: an mcptest.Upstream whose
// tools/call streams progress notifications flushed one by one as fast as
// the connection takes them, and which counts what it managed to write.
func NewFlood() *mcptest.Upstream {
	return &mcptest.Upstream{Version: "2025-06-18", FlushEach: true, KeepCalls: true}
}

// FloodProxy is a Caddy with the resume options conf in front of a flood
// upstream whose connections get send buffers of sndbuf bytes (0: the
// kernel's).
func FloodProxy(t *testing.T, sndbuf int, conf string) (*mcptest.Upstream, *Caddy) {
	t.Helper()
	f := NewFlood()
	return f, StartCaddy(t, mcptest.ResumeRoute(StartHandlerSndbuf(t, f, sndbuf), conf))
}

// FloodArgs asks for n progress events of exactly eventSize bytes on the
// wire (the sizes in these tests are the upstream's bytes, framing included).
func FloodArgs(n, eventSize int) mcptest.StreamArgs {
	return mcptest.StreamArgs{N: n, Size: eventSize - len(mcptest.EventPrefix) - len(mcptest.EventSuffix)}
}

// FloodCall returns the (latest) tools/call of a session, waiting for it to
// start.
func FloodCall(t testing.TB, f *mcptest.Upstream, sid string) *mcptest.Call {
	t.Helper()
	var c *mcptest.Call
	if !mcptest.Eventually(10*time.Second, 5*time.Millisecond, func() bool { c = f.LastCall(sid); return c != nil }) {
		t.Fatalf("flood: no tools/call arrived for session %s", sid)
	}
	return c
}

// UpstreamFinished fails the test unless the call's handler ends, having
// written its response, within 10s.
func UpstreamFinished(t *testing.T, fc *mcptest.Call) {
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

// EvictedBeforeAck is the metric that must stay 0: an event may leave the
// log only once a client acknowledged it or its resume window passed.
const EvictedBeforeAck = "caddy_mcp_resume_events_evicted_before_ack_total"

// AssertNoEarlyEviction checks caddy_mcp_resume_events_evicted_before_ack_total
// through Caddy's admin /metrics; it fails the test if the metric is exposed
// and not 0, and says so if it is not exposed.
func AssertNoEarlyEviction(t *testing.T, c *Caddy) {
	t.Helper()
	m, err := c.Metrics()
	if err != nil {
		t.Errorf("admin /metrics: %v", err)
		return
	}
	v, ok := m.Sum(EvictedBeforeAck)
	if !ok {
		t.Errorf("admin /metrics does not expose %s", EvictedBeforeAck)
		return
	}
	if v != 0 {
		t.Errorf("%s = %v, want 0: events left a log while a client could still ask for them", EvictedBeforeAck, v)
	}
}

// ---- a raw Streamable HTTP client that reads streams event by event -----------

// StreamClient is a session over its own cuttable transport, for tests that
// read SSE responses event by event across cuts and resumes. Its methods
// return errors (no t.Fatal) so goroutines can use them.
type StreamClient struct {
	*mcptest.Client
	CT *mcptest.CuttableTransport
}

// NewStreamClient is a StreamClient of the MCP endpoint at base, not yet
// initialized.
func NewStreamClient(base, version string) *StreamClient {
	ct := mcptest.NewCuttableTransport(0)
	return &StreamClient{Client: mcptest.NewClient(base, version, &http.Client{Transport: ct}), CT: ct}
}

// StreamSession is a StreamClient of c whose session is initialized; it is closed when
// the test ends.
func StreamSession(t testing.TB, c *Caddy) *StreamClient {
	t.Helper()
	cl := NewStreamClient(c.Base(), "2025-06-18")
	t.Cleanup(cl.Close)
	if err := cl.Init(); err != nil {
		t.Fatal(err)
	}
	return cl
}

// Close drops the client's connections.
func (c *StreamClient) Close() { c.CT.CloseIdleConnections(); c.CT.Cut(false) }

// Init opens the session, within 30s.
func (c *StreamClient) Init() error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return c.Initialize(ctx)
}

// CallStream starts a tools/call and returns its open SSE stream.
func (c *StreamClient) CallStream(id int, tool string, args any, idle time.Duration) (*Stream, error) {
	return c.Open("POST", mcptest.CallBody(id, tool, args, "t"), nil, idle)
}

// ResumeStream sends GET with Last-Event-ID and returns the SSE stream.
func (c *StreamClient) ResumeStream(lastID string, idle time.Duration) (*Stream, error) {
	return c.Open("GET", "", http.Header{"Last-Event-Id": {lastID}}, idle)
}

// Open sends a request (body "" for none) and returns its SSE response as
// a Stream, which ends if no event comes for idle; any other answer is an
// error.
func (c *StreamClient) Open(method, body string, extra http.Header, idle time.Duration) (*Stream, error) {
	ctx, cancel := context.WithCancel(context.Background())
	s := &Stream{cancel: cancel, idle: idle}
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

// Stream reads one SSE response event by event. A watchdog ends it if no
// event arrives for its idle duration.
type Stream struct {
	resp     *http.Response
	events   *mcptest.SSEReader
	cancel   context.CancelFunc
	idle     time.Duration
	watchdog *time.Timer
	timedOut atomic.Bool
}

// Next returns the next event (comments skipped); io.EOF at the end.
func (s *Stream) Next() (mcptest.Event, error) {
	s.watchdog.Reset(s.idle)
	ev, err := s.events.Next()
	if err != nil && s.timedOut.Load() {
		return ev, fmt.Errorf("no event for %v", s.idle)
	}
	return ev, err
}

// Close drops the connection (the body is unfinished, so the transport closes it).
func (s *Stream) Close() {
	s.watchdog.Stop()
	s.cancel()
	s.resp.Body.Close()
}

// ---- checking what a client got ----------------------------------------------

// Tracker checks one request stream as a client sees it across connections:
// proxy IDs <epoch>-<stream>-<seq> with contiguous seq (so every event
// exactly once, in order), progress i at seq i, then the response. A gap
// (event: gap) is accepted and accounted: its id moves the cursor, its data
// says how many events were lost.
type Tracker struct {
	Epoch    string
	Stream   uint32
	LastID   string
	LastSeq  uint64
	Progress int // last progress value seen
	Events   int // events with data and an id taken
	Done     bool
	ErrorMsg string // a JSON-RPC error response, if that ended the call
	Gaps     []mcptest.Gap
	Lost     int      // sum of the gaps' lost counts
	Warnings []string // notifications/message without an id (sent with a gap)
	primed   bool     // the stream began with a priming event (2025-11-25)
}

// Position parses an event id of the tracked stream (the first one
// fixes epoch and stream).
func (tr *Tracker) Position(evID string) (eventid.ID, error) {
	id, err := eventid.Parse(evID)
	if err != nil {
		return id, fmt.Errorf("event id %q: %v", evID, err)
	}
	if tr.Epoch == "" {
		tr.Epoch, tr.Stream = id.Epoch, id.Stream
	} else if id.Epoch != tr.Epoch || id.Stream != tr.Stream {
		return id, fmt.Errorf("event id %q: epoch/stream changed from %s-%d", evID, tr.Epoch, tr.Stream)
	}
	return id, nil
}

// Take checks one event; an error means loss, duplication or disorder.
func (tr *Tracker) Take(ev mcptest.Event, requestID int) error {
	if ev.Type == "gap" {
		var g mcptest.Gap
		if err := json.Unmarshal([]byte(ev.Data), &g); err != nil {
			return fmt.Errorf("gap event: %v: %s", err, ev.Data)
		}
		id, err := tr.Position(ev.ID)
		if err != nil {
			return err
		}
		if g.Lost > 0 {
			if id.Seq != tr.LastSeq+uint64(g.Lost) {
				return fmt.Errorf("gap %s moves the cursor from seq %d to %d but says %d lost", ev.Data, tr.LastSeq, id.Seq, g.Lost)
			}
			tr.Lost += g.Lost
			tr.Progress += g.Lost
		}
		tr.Gaps = append(tr.Gaps, g)
		tr.LastSeq, tr.LastID = id.Seq, ev.ID
		return nil
	}
	var m mcptest.Message
	if ev.ID == "" {
		// Only what goes with a gap comes without an id: the warning, or
		// the error for a request whose response was lost.
		if err := json.Unmarshal([]byte(ev.Data), &m); err != nil || len(tr.Gaps) == 0 {
			return fmt.Errorf("event without id: %+v", ev)
		}
		switch {
		case m.Method == "notifications/message":
			tr.Warnings = append(tr.Warnings, ev.Data)
		case string(m.ID) == strconv.Itoa(requestID) && m.Error != nil:
			tr.Done, tr.ErrorMsg = true, m.Error.Message
		default:
			return fmt.Errorf("event without id: %+v", ev)
		}
		return nil
	}
	id, err := tr.Position(ev.ID)
	if err != nil {
		return err
	}
	if ev.Data == "" {
		// A priming event: the position before seq 1 at the start of a
		// 2025-11-25 stream, and then the client's own at each resume's;
		// it never moves the cursor. Older versions get none at all.
		switch {
		case id.Seq == 0 && tr.LastSeq == 0 && tr.Events == 0:
			tr.primed = true
		case !tr.primed:
			return fmt.Errorf("empty event %q on a stream that did not begin with a priming event", ev.ID)
		case id.Seq != tr.LastSeq:
			return fmt.Errorf("empty event %q not at the client's position (seq %d)", ev.ID, tr.LastSeq)
		}
		tr.LastID = ev.ID
		return nil
	}
	if id.Seq != tr.LastSeq+1 {
		return fmt.Errorf("event %q after seq %d: lost or duplicated events", ev.ID, tr.LastSeq)
	}
	tr.LastSeq, tr.LastID = id.Seq, ev.ID
	tr.Events++
	if err := json.Unmarshal([]byte(ev.Data), &m); err != nil {
		return fmt.Errorf("event %q: %v: %.200s", ev.ID, err, ev.Data)
	}
	switch {
	case m.Method == "notifications/progress":
		if int(m.Params.Progress) != tr.Progress+1 {
			return fmt.Errorf("event %q: progress %v after %d", ev.ID, m.Params.Progress, tr.Progress)
		}
		tr.Progress++
	case m.Method != "":
		return fmt.Errorf("event %q: unexpected notification %.200s", ev.ID, ev.Data)
	case string(m.ID) == strconv.Itoa(requestID):
		tr.Done = true
		if m.Error != nil {
			tr.ErrorMsg = m.Error.Message
		}
	default:
		return fmt.Errorf("event %q: unexpected message %.200s", ev.ID, ev.Data)
	}
	return nil
}

// Drain reads a call to its response, resuming from the last event seen
// whenever a connection ends, and re-resuming every batch events: a resume
// acknowledges what was read, which is what frees the log when delivered
// events stay retained for a long resume window.
func Drain(cl *StreamClient, s *Stream, tr *Tracker, requestID, batch, maxResumes int) (resumes int, err error) {
	for {
		for k := 0; k < batch && !tr.Done; k++ {
			ev, err := s.Next()
			if err == io.EOF {
				break
			}
			if err != nil {
				s.Close()
				return resumes, fmt.Errorf("after resume %d from %s, %d events in: %w", resumes, tr.LastID, k, err)
			}
			if err := tr.Take(ev, requestID); err != nil {
				s.Close()
				return resumes, fmt.Errorf("after resume %d: %w", resumes, err)
			}
		}
		s.Close()
		if tr.Done {
			return resumes, nil
		}
		if resumes >= maxResumes {
			return resumes, errors.New("too many resumes without the response")
		}
		resumes++
		if s, err = cl.ResumeStream(tr.LastID, s.idle); err != nil {
			return resumes, fmt.Errorf("resume %d from %s: %w", resumes, tr.LastID, err)
		}
	}
}

// DumpState logs what the proxy holds, for a failure to say why.
func DumpState(t *testing.T, c *Caddy) {
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
