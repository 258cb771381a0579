package backpressure

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/internal/mcptest"
	"github.com/mcpresume/caddy-mcp-resume/tests/harness"
)

// A client reading at full speed is never failed (review item 2), even when
// stall_timeout equals resume_window, as the defaults have it (here scaled
// to 2s): its stream is slowed to max_stream_bytes per resume_window while
// the window holds the room, but it is never stalled.
func TestAFastReaderIsNeverFailed(t *testing.T) {
	_, c := harness.FloodProxy(t, 0, `
			resume_window 2s
			stall_timeout 2s
			max_stream_bytes 64KiB
			max_session_bytes 64KiB`)
	cl := harness.StreamSession(t, c)
	const n = 1000
	s, err := cl.CallStream(1, "flood", harness.FloodArgs(n, 200), 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var tr harness.Tracker
	if _, err := harness.Drain(cl, s, &tr, 1, n+10, 0); err != nil {
		t.Fatal(err)
	}
	if tr.Progress != n || tr.ErrorMsg != "" || len(tr.Gaps) != 0 {
		t.Fatalf("got %d of %d events, error %q, gaps %+v", tr.Progress, n, tr.ErrorMsg, tr.Gaps)
	}
	m, _ := c.Metrics()
	if v := m.Series[`caddy_mcp_resume_streams_failed_total{reason="stalled"}`]; v != 0 {
		t.Fatalf("streams_failed_total{stalled} = %v", v)
	}
	if v := m.Series["caddy_mcp_resume_backpressure_stalls_total"]; v == 0 {
		t.Fatal("the bound was never reached: the test shows nothing")
	}
	harness.AssertNoEarlyEviction(t, c)
}

// The reserve protects the clients that are there (review item 7): eight
// sessions start chatty calls and hang up, filling what streams without a
// client may hold; an unrelated client's call still gets every event.
func TestTheReserveServesConnectedClients(t *testing.T) {
	f, c := harness.FloodProxy(t, 0, `
			max_total_bytes 1MiB
			max_session_bytes 128KiB
			max_stream_bytes 128KiB
			stall_timeout 1m`)
	f.Hold("flood")
	for i := 0; i < 8; i++ {
		cl := harness.NewStreamClient(c.Base(), "2025-06-18")
		if err := cl.Init(); err != nil {
			t.Fatal(err)
		}
		args := harness.FloodArgs(100000, 200)
		args.Pre, args.Hold = 1, "flood" // the rest once every client has left
		s, err := cl.CallStream(1, "flood", args, 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		s.Next()
		s.Close() // hang up
		defer cl.Close()
	}
	harness.WaitFor(t, 10*time.Second, "the clients to be gone", func() bool {
		ss, _ := c.Sessions()
		gone := 0
		for _, se := range ss {
			for _, st := range se.Streams {
				if st.Kind == "request" && st.Head >= 1 && !st.Connected {
					gone++
				}
			}
		}
		return gone == 8
	})
	f.Release("flood")
	harness.WaitFor(t, 20*time.Second, "the hung-up sessions to fill what they may", func() bool {
		m, _ := c.Metrics()
		return m.Series["caddy_mcp_resume_stalled_streams"] == 8
	})
	cl := harness.StreamSession(t, c)
	s, err := cl.CallStream(2, "flood", harness.FloodArgs(5, 200), 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var tr harness.Tracker
	if _, err := harness.Drain(cl, s, &tr, 2, 100, 0); err != nil {
		harness.DumpState(t, c)
		t.Fatal(err)
	}
	if tr.Progress != 5 || tr.ErrorMsg != "" || len(tr.Gaps) != 0 {
		t.Fatalf("the connected client got %d of 5 events, error %q, gaps %+v", tr.Progress, tr.ErrorMsg, tr.Gaps)
	}
}

// Raising stall_timeout on reload does not make stalled appends spin
// (review item 15.5): 100 stalled streams, stall_timeout 5s -> 60s, and the
// process stays nearly idle (the old timer re-armed every millisecond and
// burned ~1.9 cores until the new timeout).
func TestRaisingStallTimeoutDoesNotSpin(t *testing.T) {
	f := harness.NewFlood()
	up := harness.StartHandler(t, f)
	opts := func(stall string) string {
		return fmt.Sprintf(`
			max_stream_bytes 16KiB
			max_session_bytes 16KiB
			max_total_bytes 64MiB
			stall_timeout %s`, stall)
	}
	c := harness.StartCaddy(t, mcptest.ResumeRoute(up, opts("5s")))
	// The floods wait until every session is open, so all 100 stall at
	// about the same time, well within the 5s (however loaded the machine).
	f.Hold("flood")
	err := mcptest.Parallel(100, 8, func(i int) error {
		cl := harness.NewStreamClient(c.Base(), "2025-06-18")
		if err := cl.Init(); err != nil {
			return err
		}
		args := harness.FloodArgs(1000, 200) // 200 KB: over the bound, little in socket buffers
		args.Pre, args.Hold = 1, "flood"
		s, err := cl.CallStream(1, "flood", args, 10*time.Second)
		if err != nil {
			return err
		}
		s.Next()
		s.Close()
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	f.Release("flood")
	harness.WaitFor(t, 5*time.Second, "100 stalled streams", func() bool {
		m, _ := c.Metrics()
		return m.Series["caddy_mcp_resume_stalled_streams"] == 100
	})
	c.Load(t, mcptest.ResumeRoute(up, opts("60s")))
	time.Sleep(6 * time.Second) // past the old timeout
	cpu := func() time.Duration {
		var ru syscall.Rusage
		syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
		return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	before := cpu()
	time.Sleep(2 * time.Second)
	used := cpu() - before
	t.Logf("CPU over 2s with 100 stalled streams after the reload: %v", used)
	if used > time.Second {
		t.Fatalf("%v of CPU in 2s: stalled appends spin", used)
	}
	m, _ := c.Metrics()
	if v := m.Series[`caddy_mcp_resume_streams_failed_total{reason="stalled"}`]; v != 0 {
		t.Fatalf("%v streams failed under the raised timeout", v)
	}
}

// What retained_bytes says is what the heap holds (review item 15.6):
// streams that cycle many small events within the window, acknowledged up
// to head-1, leave no memory behind that the bounds do not see.
func TestRetainedBytesTrackTheHeap(t *testing.T) {
	harness.MemoryStoreOnly(t, heapVersusRetained)
	_, c := harness.FloodProxy(t, 0, `
			resume_window 10m
			max_stream_bytes 32MiB
			max_session_bytes 64MiB
			max_total_bytes 64MiB`)
	cl := harness.StreamSession(t, c)
	base := mcptest.SettledHeap()
	const n = 100000
	for cycle := 1; cycle <= 5; cycle++ {
		s, err := cl.CallStream(cycle, "flood", harness.FloodArgs(n, 120), 20*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		var tr harness.Tracker
		if _, err := harness.Drain(cl, s, &tr, cycle, n+10, 0); err != nil || tr.Progress != n {
			t.Fatalf("cycle %d: %d events, %v", cycle, tr.Progress, err)
		}
		// The client acknowledges all but the last event.
		id := tr.LastID[:strings.LastIndexByte(tr.LastID, '-')+1] + fmt.Sprint(tr.LastSeq-1)
		resp, err := cl.Do(t.Context(), "GET", "", http.Header{"Last-Event-Id": {id}})
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	m, _ := c.Metrics()
	retained := int64(m.Series["caddy_mcp_resume_retained_bytes"])
	grown := int64(mcptest.SettledHeap()) - int64(base)
	t.Logf("5 cycles of %d events: retained_bytes %d, heap grew %d", n, retained, grown)
	if grown > retained+8<<20 {
		t.Fatalf("the heap grew %d bytes while retained_bytes says %d: evicted events hold memory the bounds do not see", grown, retained)
	}
}

// A stream that once carried a large event does not keep an event-sized
// buffer for its life (review item 15.7): six standalone streams whose
// upstream GETs stay open, idle, after one 4 MB event each hold no more than
// small buffers once the event left the log (their clients read it and
// left; the proxy keeps reading the upstream for them). One such stream
// goes first, before the heap is measured: what a process keeps once for
// its largest message (the NATS client's write buffer does) is not kept
// per stream.
func TestIdleStreamsGiveLargeBuffersBack(t *testing.T) {
	up := &mcptest.Upstream{}
	big := strings.Repeat("x", 4<<20)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet {
			up.ServeHTTP(w, r)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(200)
		fmt.Fprintf(w, "data: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/message\",\"params\":{\"level\":\"info\",\"data\":%q}}\n\n", big)
		http.NewResponseController(w).Flush()
		<-r.Context().Done() // the GET stays open, idle
	})
	c := harness.StartCaddy(t, mcptest.ResumeRoute(harness.StartHandler(t, h), "resume_window 1s"))
	opened := 0
	idle := func(n int) {
		t.Helper()
		for ; n > 0; n-- {
			opened++
			cl := harness.NewStreamClient(c.Base(), "2025-06-18")
			if err := cl.Init(); err != nil {
				t.Fatal(err)
			}
			s, err := cl.Open("GET", "", nil, 20*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			if ev, err := s.Next(); err != nil || len(ev.Data) < 4<<20 {
				t.Fatalf("standalone event: %d bytes, %v", len(ev.Data), err)
			}
			s.Close()
			cl.Close()
		}
		// The relays notice their clients left as they do (not at once).
		harness.WaitFor(t, 10*time.Second, "the upstream GETs to be read with no client", func() bool {
			m, _ := c.Metrics()
			return m.Series["caddy_mcp_resume_detached_upstreams"] == float64(opened)
		})
		harness.WaitFor(t, 10*time.Second, "the events to leave their logs", func() bool {
			m, _ := c.Metrics()
			return m.Series["caddy_mcp_resume_retained_bytes"] == 0
		})
	}
	idle(1)
	base := mcptest.SettledHeap()
	idle(6)
	// Kept for the stream's life is what fails: a loaded machine can show a
	// plateau while a connection or two still let go of their buffers, so
	// the heap is given 10 s to come down before it is judged.
	var grown int64
	mcptest.Eventually(10*time.Second, 250*time.Millisecond, func() bool {
		grown = int64(mcptest.SettledHeap()) - int64(base)
		return grown <= 8<<20
	})
	t.Logf("six idle streams after a 4 MB event each: heap grew %d", grown)
	if grown > 8<<20 {
		t.Fatalf("six idle streams hold %d bytes: event-sized buffers kept", grown)
	}
}

// An event within max_event_bytes is kept (review item 15.8): the bound is
// on the event's fields as retained, the one size every check uses; a
// larger one fails its stream as too_large and the limit metric says so.
func TestMaxEventBytesIsOneSize(t *testing.T) {
	up := &mcptest.Upstream{Tools: map[string]mcptest.Tool{"sized": func(w http.ResponseWriter, r *http.Request, req *mcptest.Request) {
		var a struct{ Fields int }
		fmt.Sscanf(string(req.Params.Arguments), `{"fields":%d}`, &a.Fields)
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(200)
		// fields = "data: " + data + "\n", data a notification padded to size
		pre := `{"jsonrpc":"2.0","method":"notifications/message","params":{"level":"info","data":"`
		post := `"}}`
		pad := a.Fields - len("data: \n") - len(pre) - len(post)
		fmt.Fprintf(w, "data: %s%s%s\n\n", pre, strings.Repeat("p", pad), post)
		fmt.Fprintf(w, "data: {\"jsonrpc\":\"2.0\",\"id\":%s,\"result\":{}}\n\n", req.ID)
	}}}
	c := harness.StartCaddy(t, mcptest.ResumeRoute(harness.StartHandler(t, up), `
			max_stream_bytes 8192
			max_event_bytes 8000
			resume_window 1s`))
	cl := harness.StreamSession(t, c)
	limit := func() float64 {
		m, _ := c.Metrics()
		return m.Series[`caddy_mcp_resume_limit_rejections_total{limit="max_event_bytes"}`]
	}
	for _, tc := range []struct {
		fields int
		ok     bool
	}{{7999, true}, {8000, true}, {8001, false}} {
		before := limit()
		s, err := cl.CallStream(tc.fields, "sized", map[string]int{"fields": tc.fields}, 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		var evs []mcptest.Event
		for {
			ev, err := s.Next()
			if err != nil {
				break
			}
			evs = append(evs, ev)
		}
		s.Close()
		failed := len(evs) > 0 && strings.Contains(evs[len(evs)-1].Data, "too_large")
		if tc.ok == failed || tc.ok && len(evs) != 2 {
			t.Fatalf("an event of %d bytes of fields: %d events, failed %v", tc.fields, len(evs), failed)
		}
		if moved := limit() - before; (moved == 1) == tc.ok {
			t.Fatalf("an event of %d bytes: limit_rejections_total{max_event_bytes} moved by %v", tc.fields, moved)
		}
	}
}

// A repeated request replayed over a slow link loses nothing (review item
// 1): the first answer was read in full, and its events' window runs out
// while the repeat still replays them to a slow client. The replay is a
// resume from 0, and an attached reader protects what it has yet to read.
func TestRepeatedRequestOverASlowLinkLosesNothing(t *testing.T) {
	// The window (4s) must outlast the first read (a second or so, more
	// under -race on a loaded machine) and be shorter than the slow repeat
	// (10s).
	_, c := harness.FloodProxy(t, 0, `
			resume_window 4s
			max_stream_bytes 64MiB
			max_session_bytes 64MiB
			max_total_bytes 128MiB`)
	cl := harness.StreamSession(t, c)
	const n = 20000
	s, err := cl.CallStream(1, "flood", harness.FloodArgs(n, 120), 20*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var first harness.Tracker
	if _, err := harness.Drain(cl, s, &first, 1, n+10, 0); err != nil || first.Progress != n {
		t.Fatalf("first answer: %d events, %v", first.Progress, err)
	}
	before, _ := c.Metrics()
	// The same request again (same session, id and body), read slowly.
	s, err = cl.CallStream(1, "flood", harness.FloodArgs(n, 120), 20*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var again harness.Tracker
	for !again.Done {
		ev, err := s.Next()
		if err != nil {
			t.Fatalf("after %d events of the repeat: %v", again.Progress, err)
		}
		if err := again.Take(ev, 1); err != nil {
			t.Fatal(err)
		}
		if again.Progress%1000 == 0 {
			time.Sleep(500 * time.Millisecond) // 10 s in all: over twice the window
		}
	}
	s.Close()
	if again.Progress != n || again.ErrorMsg != "" || len(again.Gaps) != 0 || again.Epoch != first.Epoch || again.Stream != first.Stream {
		t.Fatalf("the repeat got %d of %d events (error %q, gaps %+v), stream %s-%d (first %s-%d)",
			again.Progress, n, again.ErrorMsg, again.Gaps, again.Epoch, again.Stream, first.Epoch, first.Stream)
	}
	after, _ := c.Metrics()
	if d := after.Series["caddy_mcp_resume_repeated_requests_total"] - before.Series["caddy_mcp_resume_repeated_requests_total"]; d != 1 {
		t.Fatalf("repeated_requests_total moved by %v: the repeat was not answered from the log", d)
	}
	harness.AssertNoEarlyEviction(t, c)
}

// Ended streams leave their session (review item 6): a session that makes
// many short calls keeps the records of only the latest ended ones once
// their events are gone, so its memory, its admin view and the work per
// request stay bounded.
func TestEndedStreamsLeaveTheSession(t *testing.T) {
	_, c := harness.FloodProxy(t, 0, "resume_window 200ms")
	cl := harness.StreamSession(t, c)
	const calls = 1500
	for i := 1; i <= calls; i++ {
		s, err := cl.CallStream(i, "flood", harness.FloodArgs(1, 120), 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		var tr harness.Tracker
		if _, err := harness.Drain(cl, s, &tr, i, 10, 0); err != nil {
			t.Fatal(err)
		}
	}
	var held int
	harness.WaitFor(t, 10*time.Second, "ended streams to retire", func() bool {
		ss, err := c.Sessions()
		if err != nil || len(ss) != 1 {
			return false
		}
		held = len(ss[0].Streams)
		return held <= 64
	})
	t.Logf("%d calls: %d stream records held", calls, held)
}
