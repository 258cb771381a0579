package follow

// The producer handover of the standalone stream on one replica: the
// session's previous upstream GET is closed before the next one opens, so
// an upstream that allows one GET per session never refuses the proxy,
// and a 409 the upstream sends of its own reaches the client as is.

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/internal/demoserver"
	"github.com/mcpresume/caddy-mcp-resume/internal/mcptest"
	"github.com/mcpresume/caddy-mcp-resume/tests/harness"
)

// The official Go SDK server behind an upstream that answers 409 to a GET
// of a session while another is open: the session is purged here while
// the proxy's detached GET of it is open, and its client resumes at once,
// which adopts the session and opens a new GET, five times over. Each new
// GET waits for the old one to be closed, so the upstream sees the next
// GET only once the proxy closed the previous one: a 409 it answers is
// only its own delay in noticing that close (which the proxy rides out),
// never a GET the proxy still holds; and each resume gets its gap, never
// the 409. (The proxy once opened the new GET while the old one was still
// being read, and swallowed any 409 for a second.)
func TestStandaloneGETsOfAnAdoptedSessionNeverConflict(t *testing.T) {
	up := &mcptest.OneGET{Next: demoserver.New(demoserver.Options{})}
	c := harness.StartCaddy(t, mcptest.ResumeRoute(harness.StartHandler(t, up), ""))
	cl := harness.NewSession(t, c.Base(), "2025-11-25")
	resp := cl.Request("GET", "", nil)
	cursor := harness.ReadEvents(t, resp, 1)[0].ID // the priming event
	resp.Body.Close()
	const rounds = 5
	for i := 0; i < rounds; i++ {
		harness.WaitFor(t, 10*time.Second, "the proxy's upstream GET to be open", func() bool { return up.Open(cl.SessionID) == 1 })
		if status, err := mcptest.Purge(c.Admin(), cl.SessionID); err != nil || status != http.StatusNoContent {
			t.Fatalf("purge: %d %v", status, err)
		}
		r := cl.Resume(cursor)
		evs, err := mcptest.ReadEvents(r.Body, 1, 10*time.Second)
		r.Body.Close()
		if r.StatusCode != http.StatusOK || err != nil || evs[0].Type != "gap" {
			t.Fatalf("round %d: resume after the purge got %d %+v %v, want the gap", i+1, r.StatusCode, evs, err)
		}
		cursor = evs[0].ID
	}
	harness.WaitFor(t, 10*time.Second, "the last upstream GET to be open", func() bool { return up.Open(cl.SessionID) == 1 })
	gets, lags := up.Counts()
	t.Logf("%d upstream GETs; %d answered 409, the other GET ending %v later", gets, len(lags), lags)
	if gets != rounds+1+len(lags) {
		t.Fatalf("%d upstream GETs, want %d and one per 409", gets, rounds+1)
	}
	for _, lag := range lags {
		if lag > 500*time.Millisecond { // the server's notice of a closed connection takes milliseconds
			t.Fatalf("a GET came while the proxy held the session's previous GET open (it ended %v later)", lag)
		}
	}
}

// A 409 the upstream answers a standalone GET of its own accord (no other
// GET of the session is open through the proxy) reaches the client as
// plain reverse_proxy passes it: status and body, asked once, not again.
func TestUpstreamConflictReachesTheClient(t *testing.T) {
	up := &scripted{Upstream: &mcptest.Upstream{}, get: func(w http.ResponseWriter, r *http.Request, n int) {
		http.Error(w, "the upstream's own conflict", http.StatusConflict)
	}}
	c := harness.StartCaddy(t, mcptest.ResumeRoute(harness.StartHandler(t, up), ""))
	cl := harness.NewSession(t, c.Base(), "2025-06-18")
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	began := time.Now()
	resp, err := cl.Do(ctx, "GET", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	took := time.Since(began)
	if resp.StatusCode != http.StatusConflict || !strings.Contains(string(body), "the upstream's own conflict") {
		t.Fatalf("client got %d %q, want the upstream's 409", resp.StatusCode, body)
	}
	time.Sleep(time.Second) // a GET asked again would come by now
	if n := up.gets.Load(); n != 1 || took > 2*time.Second {
		t.Fatalf("the upstream was asked %d times, the answer took %v; want once, at once", n, took)
	}
}
