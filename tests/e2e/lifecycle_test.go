package e2e

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/internal/demoserver"
	"github.com/mcpresume/caddy-mcp-resume/internal/mcptest"
	"github.com/mcpresume/caddy-mcp-resume/tests/harness"
)

// DELETE purges the session's logs once the upstream accepted it; a late
// resume then reaches the upstream, whose 404 tells the client to
// re-initialize (the proxy never invents a session the upstream lost).
func TestDeletePurgesTheSession(t *testing.T) {
	c, _ := proxyFor(t, demoserver.Options{}, "")
	rc := harness.NewSession(t, c.Base(), "2025-06-18")
	ids := startCut(t, rc, 1, 3, 1, 10)
	if n := len(c.AdminSessions(t)); n != 1 {
		t.Fatalf("%d sessions before DELETE", n)
	}
	resp := rc.Request("DELETE", "", nil)
	resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		t.Fatalf("DELETE: %d", resp.StatusCode)
	}
	if n := len(c.AdminSessions(t)); n != 0 {
		t.Fatalf("%d sessions after DELETE: the logs were not purged", n)
	}
	resp = rc.Resume(ids[0])
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Fatalf("resume after DELETE: %d %s, want the upstream's 404", resp.StatusCode, body)
	}
}

// A session with no client for session_idle_timeout expires at the proxy:
// its detached upstream read ends with it, and a late resume of the call's
// stream gets a gap with reason "expired" and, since the call's answer is
// lost with it, a JSON-RPC error for the call (-32010), instead of silence,
// a 400, or another stream's events.
func TestIdleSessionExpiresWithAGap(t *testing.T) {
	c, _ := proxyFor(t, demoserver.Options{}, "session_idle_timeout 1s")
	rc := harness.NewSession(t, c.Base(), "2025-06-18")
	ids := startCut(t, rc, 1, 100, 1, 100) // a 10 s tool, left running
	harness.WaitFor(t, 10*time.Second, "the idle session to expire", func() bool { return len(c.AdminSessions(t)) == 0 })
	resp := rc.Resume(ids[0])
	defer resp.Body.Close()
	evs := harness.ReadEvents(t, resp, 2)
	if len(evs) < 2 {
		t.Fatalf("want the gap and the call's error, the stream ended after %+v", evs)
	}
	var g struct{ Reason string }
	if evs[0].Type != "gap" || json.Unmarshal([]byte(evs[0].Data), &g) != nil || g.Reason != "expired" {
		t.Fatalf("want a gap with reason expired, got %+v", evs)
	}
	if !strings.Contains(evs[1].Data, `"id":1,"error":{"code":-32010`) || !strings.Contains(evs[1].Data, "expired") {
		t.Fatalf("want the JSON-RPC error for call 1 standard clients see, got %+v", evs[1])
	}
	if rest, err := mcptest.ReadEvents(resp.Body, 0, 5*time.Second); err != nil || len(rest) != 0 {
		t.Fatalf("after the error the stream must end: %+v %v", rest, err)
	}
	// A resume from the gap's id gets 204: nothing more will come.
	again := rc.Resume(evs[0].ID)
	again.Body.Close()
	if again.StatusCode != http.StatusNoContent {
		t.Fatalf("resume after the gap: %d, want 204", again.StatusCode)
	}
}
