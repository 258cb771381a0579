package shared

import (
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/internal/demoserver"
	"github.com/mcpresume/caddy-mcp-resume/internal/mcptest"
	"github.com/mcpresume/caddy-mcp-resume/internal/testnet"
	"github.com/mcpresume/caddy-mcp-resume/tests/harness"
)

// rebindAnswer is a whole answer: status, events (for a stream) and body.
type rebindAnswer struct {
	status int
	events []mcptest.Event
	body   string
}

func do(t *testing.T) func(*http.Response, error) rebindAnswer {
	return func(resp *http.Response, err error) rebindAnswer {
		t.Helper()
		return readAnswer(t, resp, err)
	}
}

func readAnswer(t *testing.T, resp *http.Response, err error) rebindAnswer {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	a := rebindAnswer{status: resp.StatusCode}
	if resp.StatusCode == http.StatusOK && mcptest.MediaType(resp.Header) == "text/event-stream" {
		a.events, err = mcptest.ReadEvents(resp.Body, 0, 20*time.Second)
		if err != nil {
			t.Fatalf("reading events: %v (got %d)", err, len(a.events))
		}
		return a
	}
	b, _ := io.ReadAll(resp.Body)
	a.body = string(b)
	return a
}

// outcome is one series of the credential checks counter on replica r.
func outcome(t *testing.T, r *replica, o string) float64 {
	t.Helper()
	m, err := mcptest.ScrapeMetrics(r.admin() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	return m.Series[`caddy_mcp_resume_credential_checks_total{outcome="`+o+`"}`]
}

func sameEvents(t *testing.T, what string, got, want []mcptest.Event) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d events, want %d: %+v", what, len(got), len(want), got)
	}
	for i := range got {
		if got[i].ID != want[i].ID || got[i].Data != want[i].Data {
			t.Fatalf("%s: event %d is %+v, want %+v", what, i, got[i], want[i])
		}
	}
}

// A rebind recorded by one replica holds on every replica of the shared
// store: alice's session, rebound on A to her refreshed token, resumes on
// B under that token; her previous token (still valid, same subject) on B
// is vouched for by the upstream and served, never refused; bob's valid
// token on her session gets the upstream's 403 on B and not one event.
func TestRebindHoldsOnEveryReplica(t *testing.T) {
	t.Parallel()
	ns := testnet.NATS(t)
	iss := mcptest.NewJWTIssuer("https://as.example.test")
	mux := http.NewServeMux()
	mux.Handle("/mcp", iss.Protect(demoserver.New(demoserver.Options{})))
	d := &deployment{t: t, upstream: harness.StartHandler(t, mux)}
	store := storeNATS(natsURLs(ns), "")
	a, b := d.start("r1", store, true), d.start("r2", store, true)
	ctx := t.Context()

	hc := &http.Client{Timeout: 30 * time.Second}
	token1, token2 := iss.Mint("alice", 10*time.Minute), iss.Mint("alice", 10*time.Minute)
	bearer := func(tok string) http.Header { return http.Header{"Authorization": {"Bearer " + tok}} }
	viaA := mcptest.NewClient("http://"+a.addr(), "2025-11-25", hc)
	viaA.Header = bearer(token1)
	if err := viaA.Initialize(ctx); err != nil {
		t.Fatal(err)
	}
	count := func(c *mcptest.Client, id int) []mcptest.Event {
		t.Helper()
		x := do(t)(c.Call(ctx, id, "count", map[string]any{"n": 5, "interval_ms": 10}, "p"))
		if len(x.events) != 7 { // priming, 5 progress, the result
			t.Fatalf("call %d: %d %+v %q", id, x.status, x.events, x.body)
		}
		return x.events
	}
	first := count(viaA, 1)

	reboundOnA := outcome(t, a, "rebound")
	viaA = viaA.WithHeader(bearer(token2))
	second := count(viaA, 2)
	if after := outcome(t, a, "rebound"); after != reboundOnA+1 {
		t.Fatalf("replica A did not rebind alice's session to token 2 (rebound %v -> %v)", reboundOnA, after)
	}

	viaB := *viaA
	viaB.URL = "http://" + b.addr() + "/mcp"
	before := map[string]float64{}
	for _, o := range []string{"rebound", "accepted", "refused_upstream", "refused_principal"} {
		before[o] = outcome(t, b, o)
	}

	// Token 2 on B: the session as A rebound it.
	x := do(t)(viaB.Resume(ctx, second[1].ID))
	if x.status != http.StatusOK {
		t.Fatalf("alice's resume on B with token 2: %d %q", x.status, x.body)
	}
	sameEvents(t, "alice's resume on B with token 2", mcptest.AfterPosition(x.events, second[1].ID), second[2:])
	if got := outcome(t, b, "rebound"); got != before["rebound"] {
		t.Errorf("B rebound the session again for token 2 (rebound %v -> %v): it did not see A's rebind", before["rebound"], got)
	}

	// Token 1 (the one before, unexpired) on B: the upstream vouches,
	// same subject: alice is served, and the session rebound back.
	x = do(t)(viaB.WithHeader(bearer(token1)).Resume(ctx, first[1].ID))
	if x.status != http.StatusOK {
		t.Fatalf("alice's resume on B with her previous token: %d %q, want her events", x.status, x.body)
	}
	sameEvents(t, "alice's resume on B with token 1", mcptest.AfterPosition(x.events, first[1].ID), first[2:])
	if got := outcome(t, b, "rebound"); got != before["rebound"]+1 {
		t.Errorf("B's rebound count %v -> %v, want one more: token 1 differs from the bound token 2", before["rebound"], got)
	}
	// And A sees that rebind back: token 1 is the bound one there too.
	reboundOnA = outcome(t, a, "rebound")
	x = do(t)(viaA.WithHeader(bearer(token1)).Resume(ctx, second[1].ID))
	if x.status != http.StatusOK {
		t.Fatalf("alice's resume on A with token 1 after B's rebind: %d %q", x.status, x.body)
	}
	sameEvents(t, "alice's resume on A with token 1", mcptest.AfterPosition(x.events, second[1].ID), second[2:])
	if got := outcome(t, a, "rebound"); got != reboundOnA {
		t.Errorf("A rebound again for token 1 (rebound %v -> %v): it did not see B's rebind", reboundOnA, got)
	}

	// Bob: a valid token, alice's session and cursors, on B.
	bob := viaB.WithHeader(bearer(iss.Mint("bob", 10*time.Minute)))
	refused := before["refused_upstream"]
	for _, cursor := range []string{first[1].ID, second[1].ID} {
		x = do(t)(bob.Resume(ctx, cursor))
		if x.status != http.StatusForbidden || len(x.events) != 0 || strings.Contains(x.body, "data:") {
			t.Fatalf("bob's resume of alice's stream on B: %d %+v %q, want 403 and no event", x.status, x.events, x.body)
		}
	}
	if got := outcome(t, b, "refused_upstream"); got != refused+2 {
		t.Errorf("B's refused_upstream %v -> %v, want 2 more (the upstream's 403 for bob)", refused, got)
	}
	t.Logf("bob on B: %d %q", x.status, x.body)

	// Alice still calls, on B, with her current token.
	third := count(viaB.WithHeader(bearer(token1)), 3)
	if !strings.Contains(third[len(third)-1].Data, "counted to 5") {
		t.Fatalf("alice's call on B: %+v", third)
	}
}
