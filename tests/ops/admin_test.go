package ops

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/internal/mcptest"
	"github.com/mcpresume/caddy-mcp-resume/tests/harness"
)

const secret = "SECRET-PAYLOAD-7f3a9c"

// The admin API lists sessions and streams with positions and sizes (never
// payloads), shows one session, answers 404 for an unknown one, and purges
// one; a purged session's next resume is re-adopted with a gap "purged".
func TestAdminAPI(t *testing.T) {
	c, _ := start(t, "")

	// Session A: a standalone GET stream (kept open) with two notices on it,
	// and two finished request streams, one carrying a recognisable payload.
	a := harness.NewSession(t, c.Base(), "2025-11-25")
	get := a.Request("GET", "", nil)
	defer get.Body.Close()
	if get.StatusCode != http.StatusOK {
		t.Fatalf("standalone GET: %d", get.StatusCode)
	}
	prime := harness.ReadEvents(t, get, 1)
	epochA := epochOf(t, prime[0].ID)
	wantIDs(t, prime, epochA, 0, 0) // stream 0: the session's standalone stream
	wantIDs(t, a.CallToEnd(1, "echo", map[string]any{"text": secret}), epochA, 1, 0, 1)
	wantIDs(t, a.CallToEnd(2, "notify", map[string]any{"n": 2, "interval_ms": 10}), epochA, 2, 0, 1)
	notices := harness.ReadEvents(t, get, 2)
	wantIDs(t, notices, epochA, 0, 1, 2)

	// Session B: one finished request stream.
	b := harness.NewSession(t, c.Base(), "2025-06-18")
	evs := b.CallToEnd(1, "count", map[string]any{"n": 3, "interval_ms": 0})
	epochB := epochOf(t, evs[0].ID)
	wantIDs(t, evs, epochB, 1, 1, 2, 3, 4) // 2025-06-18: no priming event

	status, raw := adminDo(t, c, "GET", "/mcp_resume/sessions")
	if status != http.StatusOK {
		t.Fatalf("list: %d %s", status, raw)
	}
	t.Logf("GET /mcp_resume/sessions: %s", raw)
	assertNoPayloads(t, raw)
	var list []sessionInfo
	decodeStrict(t, raw, &list)
	if len(list) != 2 || list[0].ID != a.SessionID || list[1].ID != b.SessionID {
		t.Fatalf("listed %+v, want sessions %s and %s in creation order", list, a.SessionID, b.SessionID)
	}
	sa := list[0]
	if sa.Epoch != epochA || sa.ProtocolVersion != "2025-11-25" || sa.ConnectedClients != 1 || sa.RetainedBytes <= 0 || len(sa.Streams) != 3 {
		t.Errorf("session A: %+v", sa)
	}
	if sa.Created.IsZero() || sa.LastActivity.Before(sa.Created) {
		t.Errorf("session A times: created %v, last activity %v", sa.Created, sa.LastActivity)
	}
	var sum int64
	for _, st := range sa.Streams {
		sum += st.RetainedBytes
	}
	if sum != sa.RetainedBytes {
		t.Errorf("session A retains %d bytes, its streams %d", sa.RetainedBytes, sum)
	}
	standalone := sa.stream(t, 0)
	if standalone.Kind != "standalone" || standalone.State != "live" || !standalone.Connected || !standalone.Producing ||
		standalone.Floor != 1 || standalone.Head != 2 || standalone.RetainedBytes <= 0 || standalone.Stalled {
		t.Errorf("standalone stream: %+v", standalone)
	}
	echo := sa.stream(t, 1)
	if echo.Kind != "request" || echo.State != "complete" || echo.Connected || echo.Producing ||
		echo.Floor != 1 || echo.Head != 1 || echo.RetainedBytes <= 0 || strings.Join(echo.RequestIDs, ",") != "1" {
		t.Errorf("echo stream: %+v", echo)
	}
	sb := list[1]
	if sb.Epoch != epochB || sb.ProtocolVersion != "2025-06-18" || sb.ConnectedClients != 0 || len(sb.Streams) != 1 {
		t.Errorf("session B: %+v", sb)
	}
	if st := sb.stream(t, 1); st.State != "complete" || st.Floor != 1 || st.Head != 4 || st.Connected || st.Producing {
		t.Errorf("session B's stream: %+v", st)
	}

	// One session.
	status, raw = adminDo(t, c, "GET", "/mcp_resume/sessions/"+a.SessionID)
	if status != http.StatusOK {
		t.Fatalf("show: %d %s", status, raw)
	}
	assertNoPayloads(t, raw)
	var one sessionInfo
	decodeStrict(t, raw, &one)
	if one.ID != a.SessionID || one.Epoch != epochA || len(one.Streams) != 3 {
		t.Errorf("show: %+v", one)
	}

	// Unknown session, unknown method.
	for _, m := range []string{"GET", "DELETE"} {
		if status, raw := adminDo(t, c, m, "/mcp_resume/sessions/no-such-session"); status != http.StatusNotFound {
			t.Errorf("%s unknown session: %d %s, want 404", m, status, raw)
		}
	}
	if status, raw := adminDo(t, c, "POST", "/mcp_resume/sessions"); status != http.StatusMethodNotAllowed {
		t.Errorf("POST /mcp_resume/sessions: %d %s, want 405", status, raw)
	}

	// Purge B. A resume of its call's stream gets a gap "purged" and, its
	// answer being gone with the logs, a JSON-RPC error for the call. A
	// resume of its standalone stream re-adopts the session, since the
	// upstream still knows it: a gap "purged", then a warning the client's
	// SDK surfaces, then the standalone stream live.
	m0 := scrapeBoth(t, c)
	if status, raw := adminDo(t, c, "DELETE", "/mcp_resume/sessions/"+b.SessionID); status != http.StatusNoContent {
		t.Fatalf("purge: %d %s, want 204", status, raw)
	}
	if status, _ := adminDo(t, c, "GET", "/mcp_resume/sessions/"+b.SessionID); status != http.StatusNotFound {
		t.Errorf("purged session still shown: %d", status)
	}
	if l := adminSessions(t, c); len(l) != 1 || l[0].ID != a.SessionID {
		t.Errorf("after the purge the list is %+v", l)
	}
	callCursor := eid(epochB, 1, 2)
	resp := b.Resume(callCursor)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("resume of the call after purge: %d", resp.StatusCode)
	}
	evs = harness.ReadEvents(t, resp, 0)
	resp.Body.Close()
	if len(evs) != 2 || evs[0].Type != "gap" || !strings.Contains(evs[0].Data, `"reason":"purged"`) ||
		!strings.Contains(evs[1].Data, `"id":1,"error":{"code":-32010`) {
		t.Fatalf("resume of the call after purge: %+v, want a gap and an error for call 1", evs)
	}
	lastID := eid(epochB, 0, 0)
	resp = b.Resume(lastID)
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("resume after purge: %d %q, want 200 text/event-stream", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	evs = harness.ReadEvents(t, resp, 2)
	resp.Body.Close()
	if evs[0].Type != "gap" {
		t.Fatalf("first event %+v, want event: gap", evs[0])
	}
	var g map[string]any
	if err := json.Unmarshal([]byte(evs[0].Data), &g); err != nil {
		t.Fatalf("gap data %q: %v", evs[0].Data, err)
	}
	if g["reason"] != "purged" || g["lastEventId"] != lastID {
		t.Errorf("gap data %s, want reason purged and lastEventId %s", evs[0].Data, lastID)
	}
	newEpoch := epochOf(t, evs[0].ID)
	if newEpoch == epochB {
		t.Errorf("re-adopted session kept its old epoch %s", newEpoch)
	}
	var note struct {
		Method string `json:"method"`
		Params struct {
			Level  string         `json:"level"`
			Logger string         `json:"logger"`
			Data   map[string]any `json:"data"`
		} `json:"params"`
	}
	if err := json.Unmarshal([]byte(evs[1].Data), &note); err != nil || evs[1].Type != "" ||
		note.Method != "notifications/message" || note.Params.Level != "warning" || note.Params.Logger != "mcp_resume" ||
		note.Params.Data["reason"] != "purged" {
		t.Errorf("second event %+v, want a notifications/message warning from logger mcp_resume with reason purged", evs[1])
	}
	readopted := false
	for _, s := range adminSessions(t, c) {
		if s.ID == b.SessionID {
			readopted = s.Epoch == newEpoch
		}
	}
	if !readopted {
		t.Errorf("session B is not listed again with epoch %s after the resume", newEpoch)
	}
	m1 := scrapeBoth(t, c)
	expectDelta(t, m0, m1, 1, "resumes_total", "outcome", "adopted")
	expectDelta(t, m0, m1, 1, "resumes_total", "outcome", "gap")
	expectDelta(t, m0, m1, 2, "gaps_total", "reason", "purged")

	// Purge A while its standalone stream is connected: the client's stream ends.
	if status, raw := adminDo(t, c, "DELETE", "/mcp_resume/sessions/"+a.SessionID); status != http.StatusNoContent {
		t.Fatalf("purge A: %d %s", status, raw)
	}
	if rest, err := mcptest.ReadEvents(get.Body, 0, 5*time.Second); err != nil || len(rest) != 0 {
		t.Errorf("A's open stream after the purge: %+v, %v; want its end", rest, err)
	}
	if got := scrapeBoth(t, c).get("sessions"); got != 1 {
		t.Errorf("sessions = %v after purging A, want 1 (B, re-adopted)", got)
	}
	// Let the re-adopted session's detached upstream GET go now.
	if status, raw := adminDo(t, c, "DELETE", "/mcp_resume/sessions/"+b.SessionID); status != http.StatusNoContent {
		t.Errorf("purge re-adopted B: %d %s", status, raw)
	}
}

// A purge ends the session's live streams with state failed, reason purged
// (caddy_mcp_resume_streams_failed_total exports that label), so the counter
// must move; likewise for sessions deleted or expired.
func TestMetricsPurgeCountsLiveStreams(t *testing.T) {
	c, _ := start(t, "")
	a := harness.NewSession(t, c.Base(), "2025-11-25")
	get := a.Request("GET", "", nil)
	defer get.Body.Close()
	harness.ReadEvents(t, get, 1) // priming: the upstream GET is open, the stream live
	m0 := scrapeBoth(t, c)
	if status, raw := adminDo(t, c, "DELETE", "/mcp_resume/sessions/"+a.SessionID); status != http.StatusNoContent {
		t.Fatalf("purge: %d %s", status, raw)
	}
	m1 := scrapeBoth(t, c)
	expectDelta(t, m0, m1, 1, "streams_failed_total", "reason", "purged")
}

// assertNoPayloads checks admin output for anything an event carried.
func assertNoPayloads(t *testing.T, raw []byte) {
	t.Helper()
	for _, s := range []string{secret, "notice 1 of 2", "step 1 of 3", "counted to", "jsonrpc", "progressToken"} {
		if strings.Contains(string(raw), s) {
			t.Errorf("admin output contains event payload %q: %s", s, raw)
		}
	}
}
