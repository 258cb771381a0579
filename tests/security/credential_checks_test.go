package security

// Attacks on the credential check the upstream vouches for (bind bearer):
// the check's path, forged and odd tokens, upstreams that verify nothing or
// answer oddly, and bindings that come out empty.

import (
	"bytes"
	"encoding/base64"
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

// forgeJWT is an unsigned JWT ("alg":"none", or any alg with a junk
// signature) naming iss and sub: what anyone can write.
func forgeJWT(alg, iss, sub string) string {
	enc := base64.RawURLEncoding.EncodeToString
	claims, _ := json.Marshal(map[string]any{"iss": iss, "sub": sub, "exp": time.Now().Add(time.Hour).Unix()})
	sig := "c2ln"
	if alg == "none" {
		sig = ""
	}
	return enc([]byte(`{"alg":"`+alg+`","typ":"JWT"}`)) + "." + enc(claims) + "." + sig
}

// at is cl on another path of the same route (route /mcp* matches it).
func at(cl *mcptest.Client, url string) *mcptest.Client {
	d := *cl
	d.URL = url
	return &d
}

// aliceWithJWT starts a Go SDK upstream behind auth.RequireBearerToken on
// /mcp only (as harness.StartDemo mounts it), opens alice's session with a
// valid JWT and makes one call; it returns her client, a cursor inside the
// call and the secret text of its result.
func aliceWithJWT(t *testing.T, extra func(mux *http.ServeMux)) (*harness.Caddy, *mcptest.JWTIssuer, *mcptest.Client, string, string) {
	iss := mcptest.NewJWTIssuer("https://as.example.test")
	mux := http.NewServeMux()
	mux.Handle("/mcp", iss.Protect(demoserver.New(demoserver.Options{})))
	if extra != nil {
		extra(mux)
	}
	caddy := harness.StartCaddy(t, mcptest.ResumeRoute(harness.StartHandler(t, mux), ""))
	alice := mustInit(t, newClient(caddy.Base(), "2025-11-25", cred("Authorization", "Bearer "+iss.Mint("alice", time.Hour))))
	const secret = "alice-secret-result-5e1d"
	x := harness.Must(t)(alice.Call(t.Context(), 1, "count", map[string]any{"n": 3, "interval_ms": 5}, "alice-progress"))
	if len(x.Events) < 3 {
		t.Fatalf("alice's call: %s", x)
	}
	y := harness.Must(t)(alice.Call(t.Context(), 2, "echo", map[string]any{"text": secret}, "a"))
	if !strings.Contains(string(y.Body), secret) {
		t.Fatalf("alice's echo: %s", y)
	}
	return caddy, iss, alice, x.Events[0].ID, secret
}

// Any path under the route (route /mcp*) reaches the proxy: the credential
// check asks the endpoint the session began on, never the request's own
// path, and an upstream 404 to it ends nothing. A request naming alice's
// session on a path the upstream 404s (/mcpx) with any token once deleted
// her session.
func TestARequestOnAnotherPathCannotEndTheSession(t *testing.T) {
	caddy, _, alice, cursor, _ := aliceWithJWT(t, nil)
	mallory := at(alice.WithHeader(cred("Authorization", "Bearer mallory-junk")), caddy.Base()+"/mcpx")
	x, err := harness.Finish(mallory.Resume(t.Context(), cursor))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("mallory's GET /mcpx: %s", x)
	if _, held := adminSession(t, caddy, alice.SessionID); !held {
		t.Fatal("alice's session is gone from the proxy after a request with another token on /mcpx: the upstream's 404 (no such path) for the ping was taken for 'session lost'")
	}
	y := harness.Must(t)(alice.Resume(t.Context(), cursor))
	if y.Status != http.StatusOK || len(y.Events) == 0 {
		t.Fatalf("alice's resume after mallory's request: %s, want her replay", y)
	}
}

// The same, for an unauthenticated endpoint of the upstream under the
// route's prefix (here /mcp-health, 200 to any POST): it once vouched. Mallory's GET /mcp-health with alice's session ID, a
// cursor and a forged unsigned JWT naming alice's iss and sub: the ping
// goes to /mcp-health, gets 200 ("accepted"), the claims match, the
// session is rebound to mallory's forged token and alice's log is
// replayed to mallory; from then on the forged token is the bound one on
// /mcp too (a resume under the bound token is answered without asking).
func TestAnotherPathCannotVouchForAForgedJWT(t *testing.T) {
	caddy, iss, alice, cursor, secret := aliceWithJWT(t, func(mux *http.ServeMux) {
		mux.HandleFunc("/mcp-health", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			w.Write([]byte(`{"status":"ok"}`))
		})
	})
	forged := "Bearer " + forgeJWT("none", iss.Issuer, "alice")
	mallory := alice.WithHeader(cred("Authorization", forged))
	x, err := harness.Finish(at(mallory, caddy.Base()+"/mcp-health").Resume(t.Context(), cursor))
	if err != nil {
		t.Fatal(err)
	}
	if len(x.Events) > 0 {
		t.Errorf("mallory's forged JWT on /mcp-health got %d of alice's events: %s", len(x.Events), x)
	}
	// And on the real endpoint, with the same forged token, nothing asked.
	y, err := harness.Finish(mallory.Resume(t.Context(), cursor))
	if err != nil {
		t.Fatal(err)
	}
	if len(y.Events) > 0 || strings.Contains(string(y.Body), "alice-progress") {
		t.Errorf("mallory's forged JWT then reads alice's log on /mcp: %s", y)
	}
	noLeak(t, "mallory", append(x.Body, y.Body...), secret)
}

// An upstream that does not verify tokens (the demo server with no auth, an upstream behind a
// gateway that strips nothing, an upstream that only authorizes tools)
// answers the ping 200 for any token. Then the iss/sub check reads claims
// nobody verified: a forged unsigned JWT naming alice's iss and sub takes
// her session over and reads her log. Before the change the raw-token
// binding refused it; now the proxy trusts claims only once the upstream
// refused the same check with no credential at all.
func TestForgedJWTsGetNothingFromAnUpstreamThatVerifiesNone(t *testing.T) {
	upstream := harness.StartDemo(t, demoserver.Options{})
	caddy := harness.StartCaddy(t, mcptest.ResumeRoute(upstream, ""))
	const issuer = "https://as.example.test"
	alice := mustInit(t, newClient(caddy.Base(), "2025-11-25", cred("Authorization", "Bearer "+mcptest.NewJWTIssuer(issuer).Mint("alice", time.Hour))))
	x := harness.Must(t)(alice.Call(t.Context(), 1, "count", map[string]any{"n": 3, "interval_ms": 5}, "alice-progress"))
	if len(x.Events) < 3 {
		t.Fatalf("alice's call: %s", x)
	}
	for _, alg := range []string{"none", "HS256"} {
		mallory := alice.WithHeader(cred("Authorization", "Bearer "+forgeJWT(alg, issuer, "alice")))
		y, err := harness.Finish(mallory.Resume(t.Context(), x.Events[0].ID))
		if err != nil {
			t.Fatal(err)
		}
		if len(y.Events) > 0 {
			t.Errorf("alg %s: a forged JWT naming alice read her log (upstream verifies nothing): %s", alg, y)
		}
	}
}

// pingScript wraps an upstream: the proxy's credential checks (JSON-RPC
// pings with ids mcp-resume-check-*) get answer instead; everything else
// goes to next.
func pingScript(next http.Handler, answer http.HandlerFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost {
			body, _ := io.ReadAll(r.Body)
			r.Body = io.NopCloser(bytes.NewReader(body))
			if bytes.Contains(body, []byte(`"mcp-resume-check-`)) {
				answer(w, r)
				return
			}
		}
		next.ServeHTTP(w, r)
	})
}

// rotated starts an upstream whose pings get answer, opens alice's session
// with one JWT and returns her client with a refreshed JWT (same subject)
// and a cursor inside her call.
func rotated(t *testing.T, answer http.HandlerFunc) (*harness.Caddy, *mcptest.Client, string) {
	iss := mcptest.NewJWTIssuer("https://as.example.test")
	mux := http.NewServeMux()
	mux.Handle("/mcp", pingScript(iss.Protect(demoserver.New(demoserver.Options{})), answer))
	caddy := harness.StartCaddy(t, mcptest.ResumeRoute(harness.StartHandler(t, mux), ""))
	alice := mustInit(t, newClient(caddy.Base(), "2025-11-25", cred("Authorization", "Bearer "+iss.Mint("alice", time.Hour))))
	x := harness.Must(t)(alice.Call(t.Context(), 1, "count", map[string]any{"n": 3, "interval_ms": 5}, "p"))
	if len(x.Events) < 3 {
		t.Fatalf("alice's call: %s", x)
	}
	return caddy, alice.WithHeader(cred("Authorization", "Bearer "+iss.Mint("alice", time.Hour))), x.Events[0].ID
}

// An upstream that answers the ping 200 at once but as an
// SSE stream it does not end (or ends late: a slow server that keeps the
// POST stream open for server-to-client requests, a keep-alive comment
// stream) holds the client's rotated-token request for the whole
// vouchTimeout (10 s) before: the verdict is known when the status
// arrives, and the body gets a second to end.
func TestAnAcceptedCheckIsNotHeldByItsStream(t *testing.T) {
	_, alice, cursor := rotated(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		w.Write([]byte(": waiting\n\n"))
		http.NewResponseController(w).Flush()
		<-r.Context().Done()
	})
	start := time.Now()
	x, err := harness.Finish(alice.Resume(t.Context(), cursor))
	if err != nil {
		t.Fatal(err)
	}
	took := time.Since(start)
	t.Logf("resume with a refreshed token: %s after %v", x, took)
	if took > 3*time.Second {
		t.Errorf("the rotated-token resume waited %v for the end of a ping stream whose 200 had arrived at once", took.Round(time.Millisecond))
	}
}

// A ping the upstream never answers costs the client the
// vouchTimeout (10 s), not more, and gets 503 with Retry-After.
func TestAnUnansweredCheckCostsItsTimeoutThen503(t *testing.T) {
	_, alice, cursor := rotated(t, func(w http.ResponseWriter, r *http.Request) { <-r.Context().Done() })
	start := time.Now()
	x, err := harness.Finish(alice.Resume(t.Context(), cursor))
	if err != nil {
		t.Fatal(err)
	}
	took := time.Since(start)
	harness.RPCError(t, x, http.StatusServiceUnavailable)
	if took > 12*time.Second || x.Header.Get("Retry-After") == "" {
		t.Errorf("a ping never answered: %s after %v", x, took)
	}
}

// The relayed refusal: hop-by-hop and session headers must not pass;
// a body over 64 KiB is cut with a Content-Length that matches.
func TestTheRelayedRefusalCarriesNoHopByHopHeaders(t *testing.T) {
	big := strings.Repeat("x", 100<<10)
	_, alice, cursor := rotated(t, func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("WWW-Authenticate", `Bearer error="invalid_token"`)
		h.Set("Mcp-Session-Id", "upstream-other-session")
		h.Set("Set-Cookie", "a=b")
		h.Set("Keep-Alive", "timeout=1")
		h.Set("Proxy-Authenticate", "Basic")
		h.Set("Upgrade", "h2c")
		h.Set("Trailer", "X-T")
		h.Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusUnauthorized)
		w.Write([]byte(big))
	})
	resp, err := alice.Resume(t.Context(), cursor)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("reading the relayed refusal: %v", err)
	}
	t.Logf("relayed: %d %v, %d bytes", resp.StatusCode, resp.Header, len(body))
	if resp.StatusCode != http.StatusUnauthorized || resp.Header.Get("WWW-Authenticate") == "" {
		t.Fatalf("want the upstream's 401 with WWW-Authenticate: %d %v", resp.StatusCode, resp.Header)
	}
	for _, h := range []string{"Mcp-Session-Id", "Keep-Alive", "Upgrade", "Trailer"} {
		if v := resp.Header.Get(h); v != "" {
			t.Errorf("relayed refusal carries %s: %q", h, v)
		}
	}
	if resp.ContentLength != int64(len(body)) || len(body) > 64<<10 {
		t.Errorf("Content-Length %d, body %d", resp.ContentLength, len(body))
	}
}

// bind {http.auth.user.id} with no authentication handler before
// mcp_resume (wrong order, auth in another route, a misspelt placeholder)
// replaces to "" for everyone: a session bound to that would be anyone's.
// The proxy binds no session to an empty identity: initialize gets a 500
// with a JSON-RPC error naming bind (and reaches no upstream), a POST that
// would adopt a session passes through without adopting it.
func TestAnEmptyIdentityBindsNoSession(t *testing.T) {
	for _, bind := range []string{"{http.auth.user.id}", "{http.auth.user.idd}"} {
		t.Run(bind, func(t *testing.T) {
			upstream := harness.StartDemo(t, demoserver.Options{})
			caddy := harness.StartCaddy(t, mcptest.ResumeRoute(upstream, "bind "+bind))
			alice := newClient(caddy.Base(), "2025-11-25", cred("Authorization", "Bearer alice"))
			x, err := harness.Finish(alice.Do(t.Context(), "POST", `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"a","version":"1"}}}`, nil))
			if err != nil {
				t.Fatal(err)
			}
			harness.RPCError(t, x, http.StatusInternalServerError)
			if !strings.Contains(string(x.Body), "bind") || x.Header.Get("Mcp-Session-Id") != "" {
				t.Fatalf("initialize with an empty identity: %s", x)
			}
			// A session the proxy does not hold, named on a POST: passed
			// through (the demo upstream does not know it), never adopted.
			y, err := harness.Finish(alice.Do(t.Context(), "POST", mcptest.CallBody(2, "echo", map[string]any{"text": "x"}, "p"),
				http.Header{"Mcp-Session-Id": {"made-up-session"}}))
			if err != nil {
				t.Fatal(err)
			}
			if _, held := adminSession(t, caddy, "made-up-session"); held {
				t.Fatalf("a session was adopted under an empty identity: %s", y)
			}
		})
	}
}

// On the MCP endpoint of an upstream that verifies tokens,
// nothing of alice's log goes to another subject's valid JWT, a JWT with
// alice's sub from another issuer or with a bad signature, two
// Authorization headers, odd schemes and whitespace, or a token in another
// header; alice's own refreshed token in lowercase "bearer" is rebound.
func TestOddCredentialsGetNothing(t *testing.T) {
	caddy, iss, alice, cursor, _ := aliceWithJWT(t, nil)
	other := mcptest.NewJWTIssuer("https://evil.example.test")
	bob := iss.Mint("bob", time.Hour)
	for name, h := range map[string]http.Header{
		"bob's valid JWT":          cred("Authorization", "Bearer "+bob),
		"alice's sub, other iss":   cred("Authorization", "Bearer "+other.Mint("alice", time.Hour)),
		"alg none":                 cred("Authorization", "Bearer "+forgeJWT("none", iss.Issuer, "alice")),
		"bad signature":            cred("Authorization", "Bearer "+forgeJWT("HS256", iss.Issuer, "alice")),
		"two headers":              {"Authorization": {"Bearer " + bob, "Bearer " + forgeJWT("none", iss.Issuer, "alice")}},
		"tab":                      cred("Authorization", "Bearer\t"+bob),
		"token in another header":  {"X-Authorization": {"Bearer " + iss.Mint("alice", time.Hour)}},
		"forged + bob's, one line": cred("Authorization", "Bearer "+forgeJWT("none", iss.Issuer, "alice")+" "+bob),
	} {
		x, err := harness.Finish(alice.WithHeader(h).Resume(t.Context(), cursor))
		if err != nil {
			t.Fatal(err)
		}
		if len(x.Events) > 0 || x.Status/100 == 2 {
			t.Errorf("%s: %s", name, x)
		}
	}
	if _, held := adminSession(t, caddy, alice.SessionID); !held {
		t.Fatal("alice's session is gone")
	}
	x := harness.Must(t)(alice.WithHeader(cred("Authorization", "bearer "+iss.Mint("alice", time.Hour))).Resume(t.Context(), cursor))
	if len(x.Events) == 0 {
		t.Fatalf("alice's refreshed token: %s", x)
	}
}
