package e2e

import (
	"context"
	"encoding/base64"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"golang.org/x/crypto/bcrypt"

	"github.com/mcpresume/caddy-mcp-resume/internal/demoserver"
	"github.com/mcpresume/caddy-mcp-resume/internal/mcptest"
	"github.com/mcpresume/caddy-mcp-resume/tests/harness"
)

// deleteCounter counts the DELETEs that reach the handler it wraps, and
// how they were answered.
type deleteCounter struct {
	next    http.Handler
	deletes atomic.Int64
	ok      atomic.Int64 // answered 2xx
}

func (d *deleteCounter) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodDelete {
		d.next.ServeHTTP(w, r)
		return
	}
	d.deletes.Add(1)
	sw := &statusWriter{ResponseWriter: w, status: http.StatusOK}
	d.next.ServeHTTP(sw, r)
	if sw.status/100 == 2 {
		d.ok.Add(1)
	}
}

type statusWriter struct {
	http.ResponseWriter
	status int
	wrote  bool
}

func (s *statusWriter) WriteHeader(code int) {
	if !s.wrote {
		s.status, s.wrote = code, true
	}
	s.ResponseWriter.WriteHeader(code)
}

// series returns the value of one exact series of a metric on c's admin
// endpoint, 0 if not exposed.
func series(t *testing.T, c *harness.Caddy, name, labels string) float64 {
	t.Helper()
	m, err := c.Metrics()
	if err != nil {
		t.Fatal(err)
	}
	return m.Series[name+"{"+labels+"}"]
}

// readAll reads a whole non-stream answer (a refusal).
func readAll(t *testing.T, resp *http.Response) string {
	t.Helper()
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("reading %d answer: %v", resp.StatusCode, err)
	}
	return string(b)
}

// noEvent fails unless a refusal carries no SSE event at all.
func noEvent(t *testing.T, what string, resp *http.Response, body string) {
	t.Helper()
	if mcptest.MediaType(resp.Header) == "text/event-stream" || strings.Contains(body, "data:") ||
		strings.Contains(body, "id:") || strings.Contains(body, "progress") {
		t.Fatalf("%s: the refusal carries events: %s %q", what, resp.Header.Get("Content-Type"), body)
	}
}

// An OAuth-protected upstream (the Go SDK's RequireBearerToken in front of
// its streamable handler, no event store) and a Go SDK client whose bearer
// token rotates every second, as OAuth clients refresh short-lived tokens:
// through mcp_resume's default binding (bearer, rebind subject) a call cut
// mid-stream after a rotation resumes under the new token with every
// progress notification once and its result; the proxy rebinds the session
// (the upstream vouched, same iss+sub); the session keeps working and its
// DELETE reaches the upstream. Another user's valid token on the session's
// ID gets the upstream's own 403 on a resume with a valid Last-Event-ID,
// and not one event.
func TestGoSDKBearerRotation(t *testing.T) {
	iss := mcptest.NewJWTIssuer("https://as.example.test")
	dc := &deleteCounter{next: iss.Protect(demoserver.New(demoserver.Options{}))}
	mux := http.NewServeMux()
	mux.Handle("/mcp", dc)
	upstream := harness.StartHandler(t, mux)
	c := harness.StartCaddy(t, mcptest.ResumeRoute(upstream, ""))
	const rebound = `outcome="rebound"`
	const checks = "caddy_mcp_resume_credential_checks_total"
	reboundBefore := series(t, c, checks, rebound)

	alice := &mcptest.RotatingToken{Issuer: iss, Sub: "alice", Every: time.Second}
	// What the client sends on its resume GETs: a valid Last-Event-ID of
	// alice's session, and the token it came with.
	var mu sync.Mutex
	var resumes []struct{ lastID, auth string }
	record := func(next http.RoundTripper) http.RoundTripper {
		return alice.Transport(mcptest.RoundTripFunc(func(r *http.Request) (*http.Response, error) {
			if id := r.Header.Get("Last-Event-ID"); r.Method == http.MethodGet && id != "" {
				mu.Lock()
				resumes = append(resumes, struct{ lastID, auth string }{id, r.Header.Get("Authorization")})
				mu.Unlock()
			}
			return next.RoundTrip(r)
		}))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	client, err := mcptest.ConnectSDKVia(ctx, c.Base()+"/mcp", "2025-11-25", 0, mcptest.NewCuttableTransport(0), record)
	if err != nil {
		t.Fatalf("connect through the proxy with a bearer token: %v", err)
	}
	closed := false
	t.Cleanup(func() {
		if !closed {
			client.Session.Close()
		}
	})
	sid := client.Session.ID()
	firstToken := alice.Token()

	// The call: a rotation after the 4th notification, then the cut; the
	// client resumes with the new token.
	const n = 12
	var tokenAtCut string
	cut := client.After(4, func() int {
		tokenAtCut = alice.Rotate()
		return client.Transport.Cut(false)
	})
	res, err := countTo(ctx, client.Session, n, 150)
	if err != nil {
		t.Fatalf("call with a rotating token, cut mid-stream: %v", err)
	}
	if cuts := <-cut; cuts == 0 {
		t.Fatal("no connection was cut")
	}
	if got := resultText(res); got != fmt.Sprintf("counted to %d", n) {
		t.Fatalf("result %q", got)
	}
	harness.AssertOnceInOrder(t, client.ProgressAfterCall(n), n)
	mu.Lock()
	got := append(resumes[:0:0], resumes...)
	mu.Unlock()
	if len(got) == 0 {
		t.Fatal("the client never resumed with Last-Event-ID")
	}
	for _, r := range got {
		if r.auth == "Bearer "+firstToken {
			t.Fatalf("a resume went with the token of initialize; the test must rotate before the cut")
		}
	}
	// The SDK waits about a second before it resumes, so the token minted
	// at the cut may already have been replaced by the next one.
	t.Logf("tokens minted: %d; resumes: %d (the first with the token minted at the cut: %v)",
		alice.Minted(), len(got), got[0].auth == "Bearer "+tokenAtCut)
	if after := series(t, c, checks, rebound); after <= reboundBefore {
		t.Fatalf("%s{%s} did not rise (%v -> %v)", checks, rebound, reboundBefore, after)
	}

	// Bob: a valid token of his own, alice's session ID and a valid
	// Last-Event-ID of hers.
	bob := mcptest.NewClient(c.Base(), "2025-11-25", &http.Client{Timeout: 20 * time.Second})
	bob.SessionID = sid
	bob.Header = http.Header{"Authorization": {"Bearer " + iss.Mint("bob", time.Minute)}}
	// The proxy asks the upstream (a ping on the session with bob's
	// headers); the Go SDK server refuses another user on the session
	// ("session user mismatch"), and that refusal is what bob gets.
	refusedBefore := series(t, c, checks, `outcome="refused_upstream"`)
	resp, err := bob.Resume(ctx, got[0].lastID)
	if err != nil {
		t.Fatal(err)
	}
	body := readAll(t, resp)
	if resp.StatusCode != http.StatusForbidden || !strings.Contains(body, "session user mismatch") {
		t.Fatalf("bob's resume of alice's stream: %d %q, want the upstream's 403 session user mismatch", resp.StatusCode, body)
	}
	noEvent(t, "bob's resume", resp, body)
	if after := series(t, c, checks, `outcome="refused_upstream"`); after != refusedBefore+1 {
		t.Fatalf("%s{outcome=\"refused_upstream\"}: %v -> %v, want one more", checks, refusedBefore, after)
	}
	t.Logf("bob's resume GET: %d %s %q", resp.StatusCode, resp.Header.Get("Content-Type"), body)
	resp, err = bob.Do(ctx, http.MethodPost, mcptest.CallBody(99, "echo", map[string]any{"text": "bob-was-here"}, "b"), nil)
	if err != nil {
		t.Fatal(err)
	}
	body = readAll(t, resp)
	if resp.StatusCode != http.StatusForbidden || strings.Contains(body, "bob-was-here") {
		t.Fatalf("bob's call in alice's session: %d %q, want 403", resp.StatusCode, body)
	}
	t.Logf("bob's POST: %d %q", resp.StatusCode, body)

	// Alice's session is unaffected: a second call, with another rotation
	// on the way.
	alice.Rotate()
	res, err = client.Session.CallTool(ctx, &mcp.CallToolParams{Name: "echo", Arguments: map[string]any{"text": "second call"}})
	if err != nil {
		t.Fatalf("second call: %v", err)
	}
	if got := resultText(res); got != "second call" {
		t.Fatalf("second call's result %q", got)
	}

	// Close: the DELETE (with yet another token) reaches the upstream.
	alice.Rotate()
	closed = true
	if err := client.Session.Close(); err != nil {
		t.Logf("close: %v", err)
	}
	harness.WaitFor(t, 10*time.Second, "the DELETE at the upstream", func() bool { return dc.deletes.Load() >= 1 })
	if dc.ok.Load() != 1 || dc.deletes.Load() != 1 {
		t.Fatalf("DELETEs at the upstream: %d, answered 2xx: %d; want 1 and 1", dc.deletes.Load(), dc.ok.Load())
	}
}

func basicAuth(user, password string) http.Header {
	return http.Header{"Authorization": {"Basic " + base64.StdEncoding.EncodeToString([]byte(user+":"+password))}}
}

func bcryptHash(t *testing.T, password string) string {
	t.Helper()
	h, err := bcrypt.GenerateFromPassword([]byte(password), bcrypt.MinCost)
	if err != nil {
		t.Fatal(err)
	}
	return string(h)
}

// basicAuthSite is a site whose /mcp* route authenticates with basic_auth
// (users to bcrypt hashes) and binds sessions to the user Caddy verified.
func basicAuthSite(upstream string, users map[string]string) string {
	var b strings.Builder
	b.WriteString("\troute /mcp* {\n\t\tbasic_auth {\n")
	for _, u := range []string{"alice", "bob"} {
		fmt.Fprintf(&b, "\t\t\t%s %s\n", u, users[u])
	}
	b.WriteString("\t\t}\n\t\tmcp_resume {\n")
	if mcptest.StoreBlock != "" {
		b.WriteString(mcptest.StoreBlock + "\n")
	}
	fmt.Fprintf(&b, "\t\t\tbind {http.auth.user.id}\n\t\t}\n\t\treverse_proxy %s\n\t}", upstream)
	return b.String()
}

// progressOf returns the progress values and the result's text of events.
func progressOf(t *testing.T, evs []mcptest.Event) (progress []float64, result string) {
	t.Helper()
	for _, ev := range evs {
		if ev.Data == "" {
			continue // a priming event
		}
		m, err := mcptest.DecodeMessage(ev.Data)
		if err != nil {
			t.Fatalf("event %q: %v", ev.Data, err)
		}
		switch {
		case m.Method == "notifications/progress":
			progress = append(progress, m.Params.Progress)
		case m.Result != nil:
			result = string(m.Result)
		}
	}
	return progress, result
}

// A session bound to the identity Caddy's basic_auth verified
// ({http.auth.user.id}) survives a password change (a reload with a new
// hash): the Authorization bytes change, the identity does not, so alice's
// new password resumes her running call from the log and calls on; her old
// one gets basic_auth's 401; bob, authenticated, gets 403 -32011 on her
// session and not one event.
func TestBasicAuthIdentityBinding(t *testing.T) {
	upstream := harness.StartDemo(t, demoserver.Options{})
	users := map[string]string{"alice": bcryptHash(t, "alice-old-pw"), "bob": bcryptHash(t, "bob-pw")}
	c := harness.StartCaddy(t, basicAuthSite(upstream, users))

	alice := harness.NewRawClient(t, c.Base(), "2025-11-25")
	alice.Header = basicAuth("alice", "alice-old-pw")
	alice.Initialize()
	const n = 10
	resp := alice.Call(1, "count", map[string]any{"n": n, "interval_ms": 100})
	evs := harness.ReadEvents(t, resp, 4) // the priming event and progress 1..3
	resp.Body.Close()                     // alice's connection drops mid-call
	progress, _ := progressOf(t, evs)
	if err := mcptest.OnceInOrder(progress, 3); err != nil {
		t.Fatalf("before the cut: %v", err)
	}
	cursor := evs[len(evs)-1].ID

	// Alice changes her password: the config is reloaded with a new hash.
	users["alice"] = bcryptHash(t, "alice-new-pw")
	c.Load(t, basicAuthSite(upstream, users))
	alice.Reconnect()

	old := alice.WithHeader(basicAuth("alice", "alice-old-pw"))
	// A connection accepted while the old server shuts down may be reset:
	// the client tries again, as SDK clients do.
	r, err := old.Resume(context.Background(), cursor)
	for try := 0; err != nil && try < 2; try++ {
		t.Logf("resume right after the reload: %v; again", err)
		alice.Reconnect()
		time.Sleep(50 * time.Millisecond) // a retry's pause, as an SDK client's: nothing to wait on
		r, err = old.Resume(context.Background(), cursor)
	}
	if err != nil {
		t.Fatal(err)
	}
	body := readAll(t, r)
	if r.StatusCode != http.StatusUnauthorized {
		t.Fatalf("alice's old password after the change: %d %q, want basic_auth's 401", r.StatusCode, body)
	}
	noEvent(t, "old password", r, body)

	// Bob, authenticated, on alice's session with a valid cursor.
	bob := alice.WithHeader(basicAuth("bob", "bob-pw"))
	r, err = bob.Resume(context.Background(), cursor)
	if err != nil {
		t.Fatal(err)
	}
	body = readAll(t, r)
	if r.StatusCode != http.StatusForbidden || !strings.Contains(body, "-32011") {
		t.Fatalf("bob's resume of alice's stream: %d %q, want 403 -32011", r.StatusCode, body)
	}
	noEvent(t, "bob's resume", r, body)
	r, err = bob.Do(context.Background(), http.MethodPost, mcptest.CallBody(7, "echo", map[string]any{"text": "bob-was-here"}, "b"), nil)
	if err != nil {
		t.Fatal(err)
	}
	body = readAll(t, r)
	if r.StatusCode != http.StatusForbidden || !strings.Contains(body, "-32011") || strings.Contains(body, "bob-was-here") {
		t.Fatalf("bob's call in alice's session: %d %q, want 403 -32011", r.StatusCode, body)
	}

	// Alice, new password: her call's rest from the log, then live, once each.
	alice.Header = basicAuth("alice", "alice-new-pw")
	r = alice.Resume(cursor)
	if r.StatusCode != http.StatusOK {
		t.Fatalf("alice's resume with her new password: %d %q", r.StatusCode, readAll(t, r))
	}
	rest := harness.ReadEvents(t, r, 0)
	r.Body.Close()
	progress, result := progressOf(t, rest)
	for i, p := range progress {
		if p != float64(i+4) || len(progress) != n-3 {
			t.Fatalf("resumed progress %v, want 4..%d once each", progress, n)
		}
	}
	if !strings.Contains(result, fmt.Sprintf("counted to %d", n)) {
		t.Fatalf("resumed result %q (events %+v)", result, rest)
	}
	echo := alice.CallToEnd(2, "echo", map[string]any{"text": "after the password change"})
	if _, result := progressOf(t, echo); !strings.Contains(result, "after the password change") {
		t.Fatalf("alice's call after the change: %+v", echo)
	}
}
