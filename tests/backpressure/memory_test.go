package backpressure

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/internal/mcptest"
	"github.com/mcpresume/caddy-mcp-resume/tests/harness"
)

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
