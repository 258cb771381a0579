package e2e

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/internal/demoserver"
	"github.com/mcpresume/caddy-mcp-resume/internal/eventid"
	"github.com/mcpresume/caddy-mcp-resume/internal/mcptest"
	"github.com/mcpresume/caddy-mcp-resume/tests/harness"
)

func mustParse(t *testing.T, id string) eventid.ID {
	t.Helper()
	p, err := eventid.Parse(id)
	if err != nil {
		t.Fatalf("event id %q: %v", id, err)
	}
	return p
}

// A 2025-11-25 stream starts with a priming event (id, empty data); older
// versions get none, since their clients may choke on empty data.
func TestPrimingOnlyFor20251125(t *testing.T) {
	c, _ := proxyFor(t, demoserver.Options{}, "")
	for _, tc := range []struct {
		version string
		primed  bool
	}{{"2025-11-25", true}, {"2025-06-18", false}, {"2025-03-26", false}} {
		t.Run(tc.version, func(t *testing.T) {
			rc := harness.NewSession(t, c.Base(), tc.version)
			resp := rc.Call(1, "count", map[string]any{"n": 2, "interval_ms": 10})
			defer resp.Body.Close()
			if cc := resp.Header.Get("Cache-Control"); !strings.Contains(cc, "no-cache") || resp.Header.Get("X-Accel-Buffering") != "no" {
				t.Errorf("headers: Cache-Control %q, X-Accel-Buffering %q", cc, resp.Header.Get("X-Accel-Buffering"))
			}
			evs := harness.ReadEvents(t, resp, 0)
			first := mustParse(t, evs[0].ID)
			if tc.primed {
				if first.Seq != 0 || evs[0].Data != "" {
					t.Fatalf("want a priming event first, got %+v", evs[0])
				}
				evs = evs[1:]
			} else if first.Seq != 1 {
				t.Fatalf("want no priming event, got %+v", evs[0])
			}
			if len(evs) != 3 || !strings.Contains(evs[2].Data, `"result"`) {
				t.Fatalf("want 2 progress events and the result, got %+v", evs)
			}
			for i, ev := range evs {
				if mustParse(t, ev.ID).Seq != uint64(i+1) {
					t.Fatalf("ids not contiguous from 1: %+v", evs)
				}
			}
		})
	}
}

// startCut starts a slow count, reads k events (after any priming), and
// drops the connection. It returns the ids read.
func startCut(t *testing.T, rc *harness.RawClient, id, n, k, intervalMS int) []string {
	t.Helper()
	resp := rc.Call(id, "count", map[string]any{"n": n, "interval_ms": intervalMS})
	evs := harness.ReadEvents(t, resp, k)
	resp.Body.Close()
	ids := make([]string, len(evs))
	for i, ev := range evs {
		ids[i] = ev.ID
	}
	return ids
}

// waitFloor waits until the proxy's admin API shows the stream of id with
// its floor above floor (or no longer lists it): the events up to it were
// evicted.
func waitFloor(t *testing.T, c *harness.Caddy, sid string, id eventid.ID, floor uint64, what string) {
	t.Helper()
	harness.WaitFor(t, 10*time.Second, what, func() bool {
		s, ok, err := mcptest.Session(c.Admin(), sid)
		if err != nil || !ok {
			return false
		}
		for _, st := range s.Streams {
			if st.Num == id.Stream {
				return st.Floor > floor
			}
		}
		return true // a stream with nothing retained may go
	})
}

func TestResumeDecisions(t *testing.T) {
	c, _ := proxyFor(t, demoserver.Options{}, "resume_window 300ms")
	rc := harness.NewSession(t, c.Base(), "2025-06-18")

	t.Run("replay the missed suffix then the result", func(t *testing.T) {
		ids := startCut(t, rc, 1, 6, 2, 100)
		resp := rc.Resume(ids[1])
		defer resp.Body.Close()
		evs := harness.ReadEvents(t, resp, 0)
		last := mustParse(t, ids[1])
		for i, ev := range evs {
			if got := mustParse(t, ev.ID); got.Seq != last.Seq+uint64(i)+1 || got.Stream != last.Stream {
				t.Fatalf("event %d has id %s after cursor %s", i, ev.ID, ids[1])
			}
		}
		if len(evs) != 5 || !strings.Contains(evs[4].Data, `"counted to 6"`) {
			t.Fatalf("want progress 3..6 and the result, got %+v", evs)
		}
	})

	t.Run("at head replays nothing", func(t *testing.T) {
		// A live stream: 200, nothing replayed, then what comes next.
		live := rc.Call(8, "count", map[string]any{"n": 3, "interval_ms": 300})
		evs := harness.ReadEvents(t, live, 1)
		live.Body.Close()
		resp := rc.Resume(evs[0].ID)
		if resp.StatusCode != 200 {
			t.Fatalf("status %d", resp.StatusCode)
		}
		next := harness.ReadEvents(t, resp, 1)
		resp.Body.Close()
		if mustParse(t, next[0].ID).Seq != mustParse(t, evs[0].ID).Seq+1 {
			t.Fatalf("resume at head of a live stream replayed %+v", next)
		}
		// An ended stream: 204, nothing more will come (SSE clients stop
		// reconnecting, where an empty 200 made them ask again forever).
		resp = rc.Call(2, "count", map[string]any{"n": 1, "interval_ms": 1})
		evs = harness.ReadEvents(t, resp, 0)
		resp.Body.Close()
		resp = rc.Resume(evs[len(evs)-1].ID)
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusNoContent {
			t.Fatalf("resume at head of a complete stream: %d, want 204", resp.StatusCode)
		}
	})

	t.Run("ahead of head is 400 with a JSON-RPC error", func(t *testing.T) {
		ids := startCut(t, rc, 3, 3, 1, 10)
		id := mustParse(t, ids[0])
		id.Seq += 1000
		resp := rc.Resume(id.String())
		defer resp.Body.Close()
		assertJSONRPCError(t, resp, http.StatusBadRequest)
	})

	t.Run("foreign epoch and unknown stream are 400", func(t *testing.T) {
		ids := startCut(t, rc, 4, 3, 1, 10)
		id := mustParse(t, ids[0])
		foreign := id
		foreign.Epoch = "aaaaaaaa"
		resp := rc.Resume(foreign.String())
		assertJSONRPCError(t, resp, http.StatusBadRequest)
		resp.Body.Close()
		unknown := id
		unknown.Stream += 100
		resp = rc.Resume(unknown.String())
		assertJSONRPCError(t, resp, http.StatusBadRequest)
		resp.Body.Close()
	})

	t.Run("below the floor is an explicit gap, then the retained rest", func(t *testing.T) {
		// Read 3 events and leave; they were delivered, so after the resume
		// window they are evicted. The rest was never delivered and stays.
		ids := startCut(t, rc, 5, 30, 3, 60)
		first := mustParse(t, ids[0])
		last := mustParse(t, ids[len(ids)-1])
		waitFloor(t, c, rc.SessionID, last, last.Seq, "the 3 delivered events to be evicted (window 300ms + a sweep)")
		resp := rc.Resume(ids[0])
		defer resp.Body.Close()
		evs := harness.ReadEvents(t, resp, 0)
		if len(evs) < 3 || evs[0].Type != "gap" {
			t.Fatalf("want a gap event first, got %+v", evs)
		}
		var g struct {
			LastEventID string `json:"lastEventId"`
			ResumeFrom  string `json:"resumeFrom"`
			Lost        int    `json:"lost"`
			Reason      string `json:"reason"`
		}
		if err := json.Unmarshal([]byte(evs[0].Data), &g); err != nil {
			t.Fatal(err)
		}
		gapID := mustParse(t, evs[0].ID)
		if g.LastEventID != ids[0] || g.Reason != "evicted" || g.Lost != 2 || gapID.Seq != first.Seq+2 {
			t.Fatalf("gap %+v with id %s after cursor %s", g, evs[0].ID, ids[0])
		}
		if !strings.Contains(evs[1].Data, "notifications/message") || !strings.Contains(evs[1].Data, "warning") {
			t.Fatalf("want a warning standard clients see, got %+v", evs[1])
		}
		// Then every retained event from the floor, contiguous, to the result.
		next := gapID.Seq + 1
		for _, ev := range evs[2:] {
			if got := mustParse(t, ev.ID).Seq; got != next {
				t.Fatalf("after the gap got seq %d, want %d", got, next)
			}
			next++
		}
		if !strings.Contains(evs[len(evs)-1].Data, `"counted to 30"`) {
			t.Fatalf("the result did not follow the gap: %+v", evs[len(evs)-1])
		}
	})

	t.Run("below the floor without the response is a JSON-RPC error", func(t *testing.T) {
		resp := rc.Call(6, "count", map[string]any{"n": 3, "interval_ms": 1})
		evs := harness.ReadEvents(t, resp, 0)
		resp.Body.Close()
		end := mustParse(t, evs[len(evs)-1].ID)
		waitFloor(t, c, rc.SessionID, end, end.Seq, "all of call 6, delivered, to be evicted")
		resp = rc.Resume(evs[0].ID)
		defer resp.Body.Close()
		got := harness.ReadEvents(t, resp, 0)
		if len(got) != 2 || got[0].Type != "gap" || !strings.Contains(got[1].Data, `"id":6`) || !strings.Contains(got[1].Data, `"error"`) {
			t.Fatalf("want gap then an error for request 6, got %+v", got)
		}
	})

	t.Run("a second connection takes the stream over", func(t *testing.T) {
		ids := startCut(t, rc, 7, 40, 1, 100)
		first := rc.Resume(ids[0])
		defer first.Body.Close()
		if evs := harness.ReadEvents(t, first, 1); len(evs) != 1 {
			t.Fatal("first resume got nothing")
		}
		second := rc.Resume(ids[0]) // the client went back: no 409, a takeover
		defer second.Body.Close()
		if second.StatusCode != 200 {
			t.Fatalf("takeover status %d", second.StatusCode)
		}
		evs := harness.ReadEvents(t, second, 2)
		if mustParse(t, evs[0].ID).Seq != mustParse(t, ids[0]).Seq+1 {
			t.Fatalf("takeover did not replay from its cursor: %+v", evs)
		}
		// The old connection ends (aborted) instead of hanging on.
		done := make(chan error, 1)
		go func() { _, err := io.Copy(io.Discard, first.Body); done <- err }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Fatal("the old connection was not closed after a takeover")
		}
	})
}

func assertJSONRPCError(t *testing.T, resp *http.Response, status int) {
	t.Helper()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != status {
		t.Fatalf("status %d, want %d: %s", resp.StatusCode, status, body)
	}
	var m struct {
		JSONRPC string `json:"jsonrpc"`
		Error   *struct {
			Code    int    `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
	}
	if err := json.Unmarshal(body, &m); err != nil || m.JSONRPC != "2.0" || m.Error == nil || m.Error.Message == "" {
		t.Fatalf("not a JSON-RPC error body: %s", body)
	}
}

// A session the proxy does not know, resumed with an ID the proxy minted
// for it (after a proxy restart), gets an explicit gap, not silence: on its
// standalone stream the proxy takes the session over (new epoch, a warning,
// then live); on a call's stream, whose requests it can no longer name, it
// signals the gap and holds the response open instead of ending it (which
// would only make the client ask again) or mixing in another stream.
func TestResumeAfterProxyRestartIsAGap(t *testing.T) {
	upstream := harness.StartDemo(t, demoserver.Options{})
	c := harness.StartCaddy(t, mcptest.ResumeRoute(upstream, ""))
	rc := harness.NewSession(t, c.Base(), "2025-11-25")
	get := rc.Request("GET", "", nil)
	standaloneID := harness.ReadEvents(t, get, 1)[0].ID // its priming event
	get.Body.Close()
	// Priming, then one progress event. The call runs for 5s: it must still
	// be running when Caddy stops (at 10ms a step it could end first under
	// load, and with the shared store a finished call resumes whole).
	ids := startCut(t, rc, 1, 50, 2, 100)
	// Restart: stop Caddy (the store goes with it), start it again.
	harness.StopCaddy(t)
	c.Load(t, mcptest.ResumeRoute(upstream, ""))
	rc.Reconnect()

	call := rc.Resume(ids[1])
	defer call.Body.Close()
	if harness.SharedStore() {
		// The store outlived the process: the session, its epoch and the
		// call's events are all there. The stop left no handler in the
		// zone, so the zone drained: its call read on into the store to its
		// end while the new configuration served, and the resume gets the
		// rest of it, every step once, and the result.
		evs := harness.ReadEvents(t, call, 0)
		if len(evs) == 0 || !strings.Contains(evs[len(evs)-1].Data, `"counted to 50"`) {
			t.Fatalf("call stream after a restart with the shared store: %+v; want the rest of the call and its result", evs)
		}
		for i, ev := range evs {
			if ev.Type == "gap" || (i > 0 && mustParse(t, ev.ID).Seq != mustParse(t, evs[i-1].ID).Seq+1) {
				t.Fatalf("call stream after a restart with the shared store: a gap or a hole at %d: %+v", i, evs)
			}
		}
		resp := rc.Resume(standaloneID)
		defer resp.Body.Close()
		resp2 := rc.Call(2, "count", map[string]any{"n": 1, "interval_ms": 1})
		defer resp2.Body.Close()
		if evs := harness.ReadEvents(t, resp2, 0); mustParse(t, evs[0].ID).Epoch != mustParse(t, ids[0]).Epoch {
			t.Fatalf("the session's epoch changed across a restart with the shared store: %+v", evs)
		}
		return
	}
	evs := harness.ReadEvents(t, call, 1)
	if evs[0].Type != "gap" || !strings.Contains(evs[0].Data, `"reason":"proxy_restarted"`) {
		t.Fatalf("call stream: want a proxy_restarted gap, got %+v", evs)
	}
	if rest, err := mcptest.ReadEvents(call.Body, 1, 500*time.Millisecond); err == nil || len(rest) != 0 {
		t.Fatalf("call stream after the gap: %+v %v; want it held open, with nothing else", rest, err)
	}

	resp := rc.Resume(standaloneID)
	defer resp.Body.Close()
	evs = harness.ReadEvents(t, resp, 2)
	if evs[0].Type != "gap" || !strings.Contains(evs[0].Data, `"reason":"proxy_restarted"`) {
		t.Fatalf("want a proxy_restarted gap, got %+v", evs)
	}
	moved := mustParse(t, evs[0].ID)
	if moved.Epoch == mustParse(t, ids[0]).Epoch {
		t.Fatal("the adopted session reuses the old epoch: old IDs would collide with new ones")
	}
	if !strings.Contains(evs[1].Data, "warning") {
		t.Fatalf("want a warning notification, got %+v", evs[1])
	}
	// The adopted session works: a new call is tapped under the new epoch.
	resp2 := rc.Call(2, "count", map[string]any{"n": 1, "interval_ms": 1})
	defer resp2.Body.Close()
	evs = harness.ReadEvents(t, resp2, 0)
	if mustParse(t, evs[0].ID).Epoch != moved.Epoch {
		t.Fatalf("new stream not under the adopted epoch: %+v", evs)
	}
}

// `caddy reload` in the middle of a stream loses nothing: the logs live in a
// pool that outlives the config, and the detached upstream read carries on.
func TestReloadMidStreamLosesNothing(t *testing.T) {
	c, upstream := proxyFor(t, demoserver.Options{}, "")
	rc := harness.NewSession(t, c.Base(), "2025-06-18")
	resp := rc.Call(1, "count", map[string]any{"n": 15, "interval_ms": 100})
	evs := harness.ReadEvents(t, resp, 3)
	c.Load(t, mcptest.ResumeRoute(upstream, "keepalive 10s")) // a changed config, as `caddy reload`
	more := harness.ReadEvents(t, resp, 0)                    // the same connection carries on
	resp.Body.Close()
	rc.Reconnect() // the stream's connection went back to the pool, but its server is gone
	evs = append(evs, more...)
	if len(evs) != 16 || !strings.Contains(evs[15].Data, `"counted to 15"`) {
		t.Fatalf("want 15 progress events and the result across the reload, got %d", len(evs))
	}
	for i, ev := range evs {
		if mustParse(t, ev.ID).Seq != uint64(i+1) {
			t.Fatalf("event %d: id %s", i, ev.ID)
		}
	}
	// And a cut after the reload resumes from the same log.
	ids := startCut(t, rc, 2, 6, 2, 80)
	c.Load(t, mcptest.ResumeRoute(upstream, ""))
	rc.Reconnect()
	// A connection accepted while the old server shuts down may be reset
	// (seen once in a loaded run): the client tries again, as SDK clients
	// do; a resume from the same cursor answers the same.
	var err error
	for try := 0; try < 3; try++ {
		if resp, err = rc.Client.Resume(t.Context(), ids[1]); err == nil {
			break
		}
		t.Logf("resume after reload, try %d: %v", try+1, err)
		rc.Reconnect()
		time.Sleep(50 * time.Millisecond) // a retry's pause, as an SDK client's: nothing to wait on
	}
	if err != nil {
		t.Fatalf("resume after reload: %v", err)
	}
	defer resp.Body.Close()
	if evs := harness.ReadEvents(t, resp, 0); len(evs) != 5 {
		t.Fatalf("resume after reload got %d events, want 5", len(evs))
	}
}

// 2026-07-28 removed resumption: such traffic passes through byte for byte,
// and a client that disconnects cancels the upstream request.
func TestMCP20260728PassesThrough(t *testing.T) {
	canceled := make(chan struct{}, 1)
	const body = "id: upstream-1\nevent: message\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"x\"}\n\n"
	up := harness.StartHandler(t, &mcptest.Upstream{Tools: map[string]mcptest.Tool{
		"x": func(w http.ResponseWriter, r *http.Request, _ *mcptest.Request) {
			w.Header().Set("Content-Type", "text/event-stream")
			w.WriteHeader(200)
			io.WriteString(w, body)
			http.NewResponseController(w).Flush()
			if r.URL.Query().Get("hold") == "" {
				return
			}
			select {
			case <-r.Context().Done():
				canceled <- struct{}{}
			case <-time.After(20 * time.Second):
			}
		},
	}})
	c := harness.StartCaddy(t, mcptest.ResumeRoute(up, ""))
	send := func(query string) *http.Response {
		req, _ := http.NewRequest("POST", c.Base()+"/mcp"+query, strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"x"}}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		req.Header.Set("Mcp-Protocol-Version", "2026-07-28")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	resp := send("")
	got, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(got) != body {
		t.Fatalf("2026-07-28 response changed by the proxy:\n got %q\nwant %q", got, body)
	}
	resp = send("?hold=1")
	buf := make([]byte, len(body))
	io.ReadFull(resp.Body, buf)
	resp.Body.Close() // the client goes away
	select {
	case <-canceled:
	case <-time.After(10 * time.Second):
		t.Fatal("the upstream request was not cancelled when the 2026-07-28 client left")
	}
	if n := len(c.AdminSessions(t)); n != 0 {
		t.Fatalf("the proxy holds %d sessions for pass-through traffic", n)
	}
}

// ID shape sanity: the proxy's IDs are short and never contain '_' (which
// upstream SDKs split their own IDs on) or CR/LF.
func TestIDsAreOpaqueAndShort(t *testing.T) {
	c, _ := proxyFor(t, demoserver.Options{}, "")
	rc := harness.NewSession(t, c.Base(), "2025-11-25")
	resp := rc.Call(1, "count", map[string]any{"n": 2, "interval_ms": 1})
	defer resp.Body.Close()
	for _, ev := range harness.ReadEvents(t, resp, 0) {
		if strings.ContainsAny(ev.ID, "_\r\n") || len(ev.ID) > eventid.MaxLen {
			t.Fatalf("id %q", ev.ID)
		}
	}
}

// A client that re-sends the same request (same session, id and body), as
// clients that never resume POST streams do, gets the retained stream: the
// tool does not run twice.
func TestRepeatedRequestIsAnsweredFromTheLog(t *testing.T) {
	c, _ := proxyFor(t, demoserver.Options{}, "")
	rc := harness.NewSession(t, c.Base(), "2025-06-18")
	first := startCut(t, rc, 9, 5, 2, 50)
	resp := rc.Call(9, "count", map[string]any{"n": 5, "interval_ms": 50})
	defer resp.Body.Close()
	evs := harness.ReadEvents(t, resp, 0)
	if len(evs) != 6 || evs[0].ID != first[0] || evs[1].ID != first[1] || !strings.Contains(evs[5].Data, `"counted to 5"`) {
		t.Fatalf("the repeat was not answered from the first stream (first ids %v): %+v", first, evs)
	}
	// A different request id is a new call.
	other := rc.Call(10, "count", map[string]any{"n": 5, "interval_ms": 1})
	defer other.Body.Close()
	if evs := harness.ReadEvents(t, other, 1); mustParse(t, evs[0].ID).Stream == mustParse(t, first[0]).Stream {
		t.Fatal("a new request was answered from another request's stream")
	}
}
