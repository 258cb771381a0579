package ops

import (
	"encoding/json"
	"fmt"
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

func eid(epoch string, stream uint32, seq uint64) string {
	return eventid.ID{Epoch: epoch, Stream: stream, Seq: seq}.String()
}

// The counters and gauges move as a resume plays out: events enqueued once,
// a replay, a resume at head and refused resumes each counted by outcome,
// acks freeing retained bytes, and nothing evicted before its time.
func TestMetricsResumeOutcomes(t *testing.T) {
	c, _ := start(t, "")
	m0 := scrapeBoth(t, c)
	if v, ok := m0.lookup("sessions"); !ok || v != 0 {
		t.Fatalf("sessions before any traffic = %v (present %v), want 0", v, ok)
	}

	cl := harness.NewSession(t, c.Base(), "2025-11-25")
	m1 := scrapeBoth(t, c)
	if got := m1.get("sessions"); got != 1 {
		t.Errorf("sessions = %v after initialize, want 1", got)
	}

	evs := cl.CallToEnd(1, "count", map[string]any{"n": 3, "interval_ms": 0})
	epoch := epochOf(t, evs[0].ID)
	wantIDs(t, evs, epoch, 1, 0, 1, 2, 3, 4) // priming, 3 progress, result
	m2 := scrapeBoth(t, c)
	expectDelta(t, m1, m2, 4, "events_enqueued_total") // the proxy's own priming event is not retained
	for name, want := range map[string]float64{"sessions": 1, "streams": 1, "connected_clients": 0, "upstream_reads": 0, "stalled_streams": 0} {
		if got := m2.get(name); got != want {
			t.Errorf("%s = %v after the call, want %v", name, got, want)
		}
	}
	retained := m2.get("retained_bytes")
	if retained <= 0 {
		t.Fatalf("retained_bytes = %v: delivered events must stay retained for resume_window", retained)
	}
	if s := adminSessions(t, c); len(s) != 1 || float64(s[0].RetainedBytes) != retained {
		t.Errorf("admin API says %+v, metrics retained_bytes %v", s, retained)
	}

	// Replay: the client saw event 1 only.
	resp := cl.Resume(eid(epoch, 1, 1))
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("resume: %d", resp.StatusCode)
	}
	wantIDs(t, mcptest.AfterPosition(harness.ReadEvents(t, resp, 0), eid(epoch, 1, 1)), epoch, 1, 2, 3, 4)
	resp.Body.Close()

	// At head: nothing to replay; the stream is complete, so 204 says
	// nothing more will come (SSE clients stop reconnecting).
	resp = cl.Resume(eid(epoch, 1, 4))
	if resp.StatusCode != http.StatusNoContent {
		t.Fatalf("resume at head of a complete stream: %d, want 204", resp.StatusCode)
	}
	resp.Body.Close()

	// Refused: ahead of head, and an ID whose epoch was not minted for
	// this session.
	other := eventid.NewEpoch([]byte("another proxy's secret"), cl.SessionID)
	for _, id := range []string{eid(epoch, 1, 9), eid(other, 1, 1)} {
		resp = cl.Resume(id)
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(body), `"code":-32011`) {
			t.Errorf("resume from %s: %d %s, want 400 with a JSON-RPC error", id, resp.StatusCode, body)
		}
	}

	m3 := scrapeBoth(t, c)
	expectDelta(t, m2, m3, 1, "resumes_total", "outcome", "replayed")
	expectDelta(t, m2, m3, 1, "resumes_total", "outcome", "ended")
	expectDelta(t, m2, m3, 2, "resumes_total", "outcome", "rejected")
	expectDelta(t, m2, m3, 0, "resumes_total", "outcome", "gap")
	expectDelta(t, m2, m3, 0, "gaps_total", "reason", "evicted")
	expectDelta(t, m2, m3, 0, "resumes_from_evicted_total")
	expectDelta(t, m2, m3, 0, "events_enqueued_total") // a replay re-sends, it does not re-enqueue
	// The cursors acknowledged events: 1 (replay from 1), then 2..4 (at head).
	expectDelta(t, m2, m3, 4, "events_evicted_total")
	if got := m3.get("retained_bytes"); got != 0 {
		t.Errorf("retained_bytes = %v after every event was acknowledged, want 0", got)
	}
	if got, ok := m3.lookup("events_evicted_before_ack_total"); !ok || got != 0 {
		t.Errorf("events_evicted_before_ack_total = %v (present %v), want 0", got, ok)
	}
}

// A gap: with a short resume window, events delivered longer ago than the
// window are evicted by the sweeper; a resume from an early ID then gets the
// gap signal, and the gap metrics move, while evicted-before-ack stays 0.
func TestMetricsGap(t *testing.T) {
	c, _ := start(t, "resume_window 300ms")
	cl := harness.NewSession(t, c.Base(), "2025-11-25")
	m0 := scrapeBoth(t, c)

	evs := cl.CallToEnd(1, "count", map[string]any{"n": 3, "interval_ms": 0})
	epoch := epochOf(t, evs[0].ID)
	wantIDs(t, evs, epoch, 1, 0, 1, 2, 3, 4)

	// Delivered 300ms ago or more: evicted within a sweep (500ms) after that.
	harness.WaitFor(t, 5*time.Second, "the delivered events to be evicted", func() bool {
		s := adminSessions(t, c)
		if len(s) != 1 {
			return false
		}
		st := s[0].stream(t, 1)
		return st.Floor == st.Head+1 && st.RetainedBytes == 0
	})
	m1 := scrapeBoth(t, c)
	expectDelta(t, m0, m1, 4, "events_enqueued_total")
	expectDelta(t, m0, m1, 4, "events_evicted_total")
	if got := m1.get("retained_bytes"); got != 0 {
		t.Errorf("retained_bytes = %v after eviction, want 0", got)
	}

	resp := cl.Resume(eid(epoch, 1, 1))
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("resume below the floor: %d %q, want 200 text/event-stream", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	evs = harness.ReadEvents(t, resp, 0)
	resp.Body.Close()
	if len(evs) != 2 {
		t.Fatalf("got %d events, want the gap event and an error for the lost result: %+v", len(evs), evs)
	}
	if evs[0].Type != "gap" || evs[0].ID != eid(epoch, 1, 4) {
		t.Errorf("first event %+v, want event: gap with id %s", evs[0], eid(epoch, 1, 4))
	}
	var g map[string]any
	if err := json.Unmarshal([]byte(evs[0].Data), &g); err != nil {
		t.Fatalf("gap data %q: %v", evs[0].Data, err)
	}
	want := map[string]any{"lastEventId": eid(epoch, 1, 1), "resumeFrom": eid(epoch, 1, 5), "lost": float64(3), "reason": "evicted"}
	for k, v := range want {
		if g[k] != v {
			t.Errorf("gap data %s = %v, want %v (data %s)", k, g[k], v, evs[0].Data)
		}
	}
	var rpcErr struct {
		ID    json.RawMessage `json:"id"`
		Error struct {
			Code int `json:"code"`
		} `json:"error"`
	}
	if err := json.Unmarshal([]byte(evs[1].Data), &rpcErr); err != nil || string(rpcErr.ID) != "1" ||
		rpcErr.Error.Code > -32000 || rpcErr.Error.Code < -32019 {
		t.Errorf("second event %q: want a JSON-RPC error for request 1 with a code in -32019..-32000", evs[1].Data)
	}

	m2 := scrapeBoth(t, c)
	expectDelta(t, m1, m2, 1, "resumes_total", "outcome", "gap")
	expectDelta(t, m1, m2, 1, "gaps_total", "reason", "evicted")
	expectDelta(t, m1, m2, 1, "resumes_from_evicted_total")
	expectDelta(t, m1, m2, 0, "resumes_total", "outcome", "replayed")
	if got, ok := m2.lookup("events_evicted_before_ack_total"); !ok || got != 0 {
		t.Errorf("events_evicted_before_ack_total = %v (present %v), want 0", got, ok)
	}
}

// A reload (what `caddy reload` does) keeps the endpoint working, registers
// nothing twice, and resets no counter; the retained sessions carry on.
func TestMetricsSurviveReload(t *testing.T) {
	upstream := harness.StartDemo(t, demoserver.Options{})
	c := harness.StartCaddy(t, site(upstream, ""))
	cl := harness.NewSession(t, c.Base(), "2025-11-25")
	evs := cl.CallToEnd(1, "count", map[string]any{"n": 2, "interval_ms": 0})
	epoch := epochOf(t, evs[0].ID)
	resp := cl.Resume(eid(epoch, 1, 1))
	wantIDs(t, mcptest.AfterPosition(harness.ReadEvents(t, resp, 0), eid(epoch, 1, 1)), epoch, 1, 2, 3)
	resp.Body.Close()
	before := scrapeBoth(t, c)

	reloads := []struct {
		name string
		load func()
	}{
		{"same config", func() { c.Load(t, site(upstream, "")) }},
		{"changed config", func() { c.Load(t, site(upstream, "resume_window 90s")) }},
		{"with the metrics global option", func() { c.LoadWithGlobal(t, "metrics", site(upstream, "")) }},
	}
	for i, rl := range reloads {
		rl.load()
		cl.Reconnect()
		after := scrapeBoth(t, c)
		for k, v := range before.family(prefix).Series {
			if w, ok := after.Series[k]; !before.isGauge(k) && (!ok || w < v) {
				t.Errorf("reload %q: %s went from %v to %v (present %v)", rl.name, k, v, w, ok)
			}
		}
		if got := after.get("sessions"); got != 1 {
			t.Errorf("reload %q: sessions = %v, want 1 (the store outlives reloads)", rl.name, got)
		}
		if s := adminSessions(t, c); len(s) != 1 || s[0].Epoch != epoch {
			t.Errorf("reload %q: admin lists %+v, want the session with epoch %s", rl.name, s, epoch)
		}

		// Still counting: a resume at the head of the complete stream (204)
		// and a new call.
		resp := cl.Resume(eid(epoch, 1, 3))
		resp.Body.Close()
		if resp.StatusCode != http.StatusNoContent {
			t.Errorf("reload %q: resume at head: %d", rl.name, resp.StatusCode)
		}
		cl.CallToEnd(2+i, "count", map[string]any{"n": 1, "interval_ms": 0})
		now := scrapeBoth(t, c)
		expectDelta(t, after, now, 1, "resumes_total", "outcome", "ended")
		expectDelta(t, after, now, 2, "events_enqueued_total")
		before = now
	}
	// The global option adds Caddy's own HTTP metrics next to the module's.
	if len(before.family("caddy_http_requests_total").Series) == 0 {
		t.Errorf("no caddy_http_requests_total with the metrics global option")
	}
}

// Every metric metrics.go defines is registered: after some traffic each one
// is on /metrics (a CounterVec only once a label value moved, so those are
// only checked when the traffic moves them).
func TestEveryMetricIsExposed(t *testing.T) {
	// Two zones: the memory store, and a shared (JetStream) one, whose
	// metrics only a shared store has.
	upstream := harness.StartDemo(t, demoserver.Options{})
	sharedPort := harness.CaddyPort(t)
	c := harness.StartCaddyWithSites(t, "", site(upstream, ""), mcptest.Site{Port: sharedPort,
		Body: site(upstream, "zone shared\nstore nats {\n embedded "+t.TempDir()+"\n}")})
	for _, base := range []string{c.Base(), fmt.Sprintf("http://127.0.0.1:%d", sharedPort)} {
		cl := harness.NewSession(t, base, "2025-11-25")
		evs := cl.CallToEnd(1, "count", map[string]any{"n": 1, "interval_ms": 0})
		resp := cl.Resume(evs[1].ID)
		harness.ReadEvents(t, resp, 0)
		resp.Body.Close()
	}
	m := scrapeBoth(t, c)
	present := func(name string) bool { _, ok := m.Sum(name); return ok }
	for name, typ := range moduleMetrics(t) {
		if typ == "countervec" && name != prefix+"resumes_total" {
			continue
		}
		if typ == "histogram" && !strings.HasSuffix(name, "_count") && !strings.HasSuffix(name, "_sum") && !strings.HasSuffix(name, "_bucket") {
			continue // the family name is not a series
		}
		if !present(name) {
			t.Errorf("%s (%s) is defined in resume/metrics.go but not exposed", name, typ)
		}
	}
}

// A call from an HTTP/1 client on a connection with nothing unread has its
// relay's start written by the goroutine reading the upstream (Caddy gives
// the engine the connection: caddymodule registers resume.ConnContext); over
// HTTP/2 the relay always has a goroutine of its own. Either way the client
// gets the whole call.
func TestMetricsRelaysByWriter(t *testing.T) {
	upstream := harness.StartDemo(t, demoserver.Options{})
	c := harness.StartCaddyWithGlobal(t, "servers {\n\t\tprotocols h1 h2c\n\t}", site(upstream, ""))
	args := map[string]any{"n": 2, "interval_ms": 0}

	h1 := harness.NewSession(t, c.Base(), "2025-11-25")
	m0 := scrapeBoth(t, c)
	if evs := h1.CallToEnd(1, "count", args); len(evs) != 4 {
		t.Fatalf("HTTP/1 call: %d events, want priming, 2 progress, result", len(evs))
	}
	m1 := scrapeBoth(t, c)
	expectDelta(t, m0, m1, 1, "relays_total", "writer", "tap")
	expectDelta(t, m0, m1, 0, "relays_total", "writer", "goroutine")

	var p http.Protocols
	p.SetUnencryptedHTTP2(true)
	tr := &http.Transport{Protocols: &p}
	t.Cleanup(tr.CloseIdleConnections)
	h2 := harness.NewRawClientOver(t, c.Base(), "2025-11-25", &http.Client{Transport: tr, Timeout: 30 * time.Second})
	h2.Initialize()
	resp := h2.Call(1, "count", args)
	if resp.ProtoMajor != 2 {
		t.Fatalf("the call went over HTTP/%d", resp.ProtoMajor)
	}
	evs := harness.ReadEvents(t, resp, 0)
	resp.Body.Close()
	if len(evs) != 4 {
		t.Fatalf("HTTP/2 call: %d events, want priming, 2 progress, result", len(evs))
	}
	m2 := scrapeBoth(t, c)
	expectDelta(t, m1, m2, 0, "relays_total", "writer", "tap")
	expectDelta(t, m1, m2, 1, "relays_total", "writer", "goroutine")
}
