package security

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/internal/demoserver"
	"github.com/mcpresume/caddy-mcp-resume/internal/eventid"
	"github.com/mcpresume/caddy-mcp-resume/internal/mcptest"
	"github.com/mcpresume/caddy-mcp-resume/tests/harness"
)

// Requests naming made-up sessions cannot lock initialize out (review item
// 3). A stateless upstream accepts any Mcp-Session-Id and answers calls with
// streams; the proxy adopts such sessions into a share of their own (a
// quarter of max_sessions), beyond which it passes them through, so every
// initialize still gets a session, and a 2026-07-28 initialize passes
// through whatever the count. GETs with made-up sessions and cursors of the
// proxy's shape create nothing and start no upstream reads.
func TestMadeUpSessionsCannotLockOutInitialize(t *testing.T) {
	ctx := t.Context()
	up := &mcptest.Upstream{}
	c := harness.StartCaddy(t, mcptest.ResumeRoute(harness.StartHandler(t, up), "max_sessions 20"))
	anon := newClient(c.Base(), "2025-06-18", nil)
	err := mcptest.Parallel(200, 8, func(i int) error {
		cl := anon.WithHeader(nil)
		cl.SessionID = fmt.Sprintf("made-up-%d", i)
		resp, err := cl.Call(ctx, i, "count", map[string]any{"n": 1}, "")
		if err != nil {
			return err
		}
		_, err = harness.Finish(resp, nil)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if n := len(sessions(t, c)); n > 20/4 {
		t.Fatalf("%d made-up sessions held, want at most max_sessions/4 = %d", n, 20/4)
	}
	for i := 0; i < 20; i++ {
		if err := newClient(c.Base(), "2025-06-18", nil).Initialize(ctx); err != nil {
			t.Fatalf("initialize %d after the flood: %v", i+1, err)
		}
	}
	// Now max_sessions is reached: a 2025 initialize gets 503, a 2026-07-28
	// one (no resumption to hold) passes through untouched.
	x := harness.Must(t)(newClient(c.Base(), "2025-06-18", nil).Do(ctx, "POST",
		`{"jsonrpc":"2.0","id":7,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"late","version":"1"}}}`, nil))
	if code, _ := harness.RPCError(t, x, http.StatusServiceUnavailable); code == 0 || !strings.Contains(string(x.Body), `"id":7`) {
		t.Fatalf("503 body %s: want the initialize's id", x.Body)
	}
	x = harness.Must(t)(newClient(c.Base(), "2026-07-28", nil).Do(ctx, "POST",
		`{"jsonrpc":"2.0","id":8,"method":"initialize","params":{"protocolVersion":"2026-07-28","capabilities":{},"clientInfo":{"name":"new","version":"1"}}}`, nil))
	if x.Status != http.StatusOK {
		t.Fatalf("2026-07-28 initialize with max_sessions reached: %s, want the upstream's answer", x)
	}

	// One-shot GETs naming made-up sessions with cursors of the proxy's
	// shape: not minted for those sessions, so the upstream answers them.
	before := len(sessions(t, c))
	reads, _ := c.Metrics()
	for i := 0; i < 100; i++ {
		cl := anon.WithHeader(nil)
		cl.SessionID = fmt.Sprintf("ghost-%d", i)
		x := harness.Must(t)(cl.Resume(ctx, eventid.ID{Epoch: "abcdefgh", Stream: 0, Seq: 3}.String()))
		if x.Status != http.StatusMethodNotAllowed { // what this upstream answers a GET
			t.Fatalf("GET for a made-up session: %s, want the upstream's answer", x)
		}
	}
	if n := len(sessions(t, c)); n != before {
		t.Fatalf("made-up GETs created %d sessions", n-before)
	}
	after, _ := c.Metrics()
	if a, b := after.Series["caddy_mcp_resume_upstream_reads"], reads.Series["caddy_mcp_resume_upstream_reads"]; a > b {
		t.Fatalf("made-up GETs left %v upstream reads running", a-b)
	}
}

// A stolen session ID cannot be taken over (review item 4). Ended sessions
// are remembered exactly (not in a cache that drops entries): after 400
// other sessions ended, a session that idled out at the proxy (alive at the
// upstream) answers another credential with 403, whatever cursor it brings,
// and its owner gets it back.
func TestStolenSessionCannotBeTakenOver(t *testing.T) {
	ctx := t.Context()
	upstream := harness.StartDemo(t, demoserver.Options{})
	c := harness.StartCaddy(t, mcptest.ResumeRoute(upstream, "session_idle_timeout 1s"))
	owner := mustInit(t, newClient(c.Base(), "2025-11-25", cred("Authorization", "Bearer owner")))
	cursor := standaloneCursor(t, owner) // its standalone stream's priming event
	// 400 other sessions bound to one credential end (deleted by their clients).
	other := cred("Authorization", "Bearer other")
	if err := mcptest.Parallel(400, 8, func(i int) error {
		cl := newClient(c.Base(), "2025-06-18", other)
		if err := cl.Initialize(ctx); err != nil {
			return err
		}
		if err := cl.Delete(ctx); err != nil {
			return err
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	harness.WaitFor(t, 10*time.Second, "the owner's session to idle out", func() bool {
		_, held := adminSession(t, c, owner.SessionID)
		return !held
	})
	thief := owner.WithHeader(cred("Authorization", "Bearer thief"))
	for _, id := range []string{cursor, eventid.ID{Epoch: "abcdefgh", Stream: 0, Seq: 1}.String()} {
		harness.RPCError(t, harness.Must(t)(thief.Resume(ctx, id)), http.StatusForbidden)
	}
	harness.RPCError(t, harness.Must(t)(thief.Do(ctx, "POST", mcptest.CallBody(9, "echo", map[string]any{"text": "thief"}, ""), nil)), http.StatusForbidden)
	if _, held := adminSession(t, c, owner.SessionID); held {
		t.Fatal("the thief's requests adopted the session")
	}
	// The owner resumes its standalone stream: adopted again, a gap.
	resp, err := owner.Resume(ctx, cursor)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	evs, err := mcptest.ReadEvents(resp.Body, 1, 10*time.Second)
	if err != nil || resp.StatusCode != 200 || len(evs) != 1 || evs[0].Type != "gap" || !strings.Contains(evs[0].Data, "expired") {
		t.Fatalf("owner's resume: %d %+v %v", resp.StatusCode, evs, err)
	}
	// The 400 ended sessions are all still remembered with their credential.
	m, _ := c.Metrics()
	if m.Series["caddy_mcp_resume_tombstones"] < 400 || m.Series["caddy_mcp_resume_tombstones_dropped_total"] != 0 {
		t.Fatalf("tombstones %v, dropped %v: ended sessions were forgotten",
			m.Series["caddy_mcp_resume_tombstones"], m.Series["caddy_mcp_resume_tombstones_dropped_total"])
	}
}

// A late cursor is never a 400 (review item 5). After a purge, a client
// with a standalone stream and a call whose answer was still to come gets,
// in either order of resuming: on the call's stream a gap and the JSON-RPC
// error for the call; on the standalone stream the session taken over.
func TestLateCursorsAfterAPurgeGetGaps(t *testing.T) {
	ctx := t.Context()
	upstream := harness.StartDemo(t, demoserver.Options{})
	c := harness.StartCaddy(t, mcptest.ResumeRoute(upstream, ""))
	for _, standaloneFirst := range []bool{true, false} {
		t.Run(fmt.Sprintf("standalone first %v", standaloneFirst), func(t *testing.T) {
			cl := mustInit(t, newClient(c.Base(), "2025-11-25", nil))
			standalone := standaloneCursor(t, cl)
			resp, err := cl.Call(ctx, 4, "count", map[string]any{"n": 50, "interval_ms": 100}, "p")
			if err != nil {
				t.Fatal(err)
			}
			evs, err := mcptest.ReadEvents(resp.Body, 2, 10*time.Second)
			resp.Body.Close()
			if err != nil {
				t.Fatal(err)
			}
			call := evs[1].ID
			purge(t, c, cl.SessionID)
			resumeCall := func() {
				x := harness.Must(t)(cl.Resume(ctx, call))
				if x.Status != 200 || len(x.Events) != 2 || x.Events[0].Type != "gap" || !strings.Contains(x.Events[0].Data, "purged") ||
					!strings.Contains(x.Events[1].Data, `"id":4,"error":{"code":-32010`) {
					t.Fatalf("resume of the call after the purge: %s", x)
				}
			}
			resumeStandalone := func() {
				r, err := cl.Resume(ctx, standalone)
				if err != nil {
					t.Fatal(err)
				}
				defer r.Body.Close()
				evs, err := mcptest.ReadEvents(r.Body, 2, 10*time.Second)
				if err != nil || r.StatusCode != 200 || evs[0].Type != "gap" || !strings.Contains(evs[1].Data, "warning") {
					t.Fatalf("resume of the standalone stream after the purge: %d %+v %v", r.StatusCode, evs, err)
				}
			}
			if standaloneFirst {
				resumeStandalone()
				resumeCall()
			} else {
				resumeCall()
				resumeStandalone()
			}
		})
	}
}

// A 2026-07-28 session is never tapped (review item 8), even when a later
// POST omits MCP-Protocol-Version: the proxy remembers the session as one
// it does not tap, and the upstream's bytes pass through.
func TestSessionsWithoutResumptionAreNeverTapped(t *testing.T) {
	ctx := t.Context()
	up := &mcptest.Upstream{Version: "2026-07-28"}
	c := harness.StartCaddy(t, mcptest.ResumeRoute(harness.StartHandler(t, up), ""))
	cl := mustInit(t, newClient(c.Base(), "2026-07-28", nil))
	cl.Version = "" // the next POST carries no MCP-Protocol-Version
	x := harness.Must(t)(cl.Call(ctx, 3, "count", map[string]any{"n": 2}, "p"))
	for _, ev := range x.Events {
		if ev.ID != "" {
			t.Fatalf("a 2026-07-28 session's stream was tapped: %s", x)
		}
	}
	if len(x.Events) != 3 {
		t.Fatalf("stream %s", x)
	}
	if s, held := adminSession(t, c, cl.SessionID); held && len(s.Streams) > 0 {
		t.Fatalf("the session holds streams: %+v", s)
	}
}

// A repeated request is only ever answered from its own stream (review
// item 15.2). After a purge the session's streams are numbered anew: a
// re-sent request must not find another request's stream by number.
func TestRepeatedRequestsNeverGetAnotherStream(t *testing.T) {
	ctx := t.Context()
	upstream := harness.StartDemo(t, demoserver.Options{})
	c := harness.StartCaddy(t, mcptest.ResumeRoute(upstream, ""))
	cl := mustInit(t, newClient(c.Base(), "2025-06-18", nil))
	body3 := mcptest.CallBody(3, "echo", map[string]any{"text": "three"}, "")
	body5 := mcptest.CallBody(5, "echo", map[string]any{"text": "five"}, "")
	first := harness.Must(t)(cl.Do(ctx, "POST", body3, nil))
	harness.Must(t)(cl.Do(ctx, "POST", body5, nil))
	epoch := mustParseID(t, first.Events[0].ID).Epoch
	purge(t, c, cl.SessionID)
	// The client comes back: its standalone stream adopts the session.
	r, err := cl.Resume(ctx, eventid.ID{Epoch: epoch, Stream: 0, Seq: 0}.String())
	if err != nil {
		t.Fatal(err)
	}
	mcptest.ReadEvents(r.Body, 1, 10*time.Second)
	r.Body.Close()
	harness.Must(t)(cl.Do(ctx, "POST", body5, nil)) // stream 1 of the new incarnation answers 5
	x := harness.Must(t)(cl.Do(ctx, "POST", body3, nil))
	if !strings.Contains(string(x.Body), `"id":3`) || strings.Contains(string(x.Body), "five") {
		t.Fatalf("re-sent request 3 got %s", x)
	}
}

func sessions(t *testing.T, c *harness.Caddy) []string {
	t.Helper()
	ss, err := c.Sessions()
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, s := range ss {
		ids = append(ids, s.ID)
	}
	return ids
}

func purge(t *testing.T, c *harness.Caddy, sid string) {
	t.Helper()
	if status, err := mcptest.Purge(c.Admin(), sid); err != nil || status != http.StatusNoContent {
		t.Fatalf("purge %s: %d %v", sid, status, err)
	}
}

// standaloneCursor opens the client's standalone stream, takes the ID of its
// first event (the priming event, on 2025-11-25) and leaves.
func standaloneCursor(t *testing.T, cl *mcptest.Client) string {
	t.Helper()
	resp, err := cl.Do(t.Context(), "GET", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	evs, err := mcptest.ReadEvents(resp.Body, 1, 10*time.Second)
	if err != nil || len(evs) != 1 || evs[0].ID == "" {
		t.Fatalf("standalone stream: %d %+v %v", resp.StatusCode, evs, err)
	}
	return evs[0].ID
}
