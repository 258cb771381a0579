package ts

// OAuth token rotation with the official TypeScript SDK on both ends
// (oauth_server.mjs, oauth_client.mjs): MCP authorization makes clients send
// short-lived bearer tokens and refresh them on a 401, so a session's
// Authorization changes while it lives, mid call and between calls
// (design.md §11). These tests prove what a user sees:
//
//   - TestOAuthRotation: every call completes with every progress
//     notification once and in order, tokens were refreshed at least twice
//     (during and between calls), a cut after a refresh is resumed with the
//     new token, and the client's DELETE reaches the upstream with a valid
//     token and is answered 2xx. Directly and through plain reverse_proxy
//     this holds today. Through mcp_resume it holds only once sessions are
//     bound to the verified principal instead of the bytes of Authorization:
//     until then every request after the first refresh gets the proxy's 403
//     -32011 "credentials differ from the session's", and the subtests say so.
//
//   - TestOAuthAttacks: against mcp_resume only, raw HTTP with tokens minted
//     by the server's test endpoint: nobody but alice ever gets an event of
//     alice's stream, whatever the credential (bob's valid token, a forged
//     JWT, an expired or wrong-audience token of alice's, none), and a DELETE
//     by anyone else does not end her session; alice's second token (a
//     rotation) resumes her stream. Expectations marked [principal binding]
//     depend on the proxy's new behaviour and fail today.
//
// Timing: tokens live 1.5 s (expires_in 2); calls are 8 progress
// notifications 300 ms apart (2.4 s); the client pings every 250 ms during a
// call, so a ping gets the 401 that makes the SDK refresh mid-call, and
// before the second call it waits until its token expired, so the call's
// POST gets a 401 and a refresh happens between calls. The assertions wait
// on what the processes report, never on sleeps of the test's own.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/internal/mcptest"
	"github.com/mcpresume/caddy-mcp-resume/tests/harness"
)

const (
	oauthTokenTTLMs  = 1500
	oauthCalls       = 2
	oauthN           = 8
	oauthIntervalMs  = 300
	oauthCallTimeout = 8000 // ms; a call takes 2.4 s
)

// upstreamRequest is one line of oauth_server.mjs's request log.
type upstreamRequest struct {
	T           int    `json:"t"`
	Method      string `json:"method"`
	Path        string `json:"path"`
	Session     string `json:"session"`
	RPC         string `json:"rpc"`
	LastEventID string `json:"lastEventId"`
	Auth        string `json:"auth"` // none, valid, expired, bad, wrong-aud, malformed
	Sub         string `json:"sub"`
	TokenID     string `json:"tokenId"`
	Status      int    `json:"status"`
	Closed      bool   `json:"closed"`
}

// oauthServer is a running oauth_server.mjs.
type oauthServer struct {
	Addr string // host:port it listens on

	mu  sync.Mutex
	log []upstreamRequest
}

// Requests returns the requests the server has answered so far.
func (s *oauthServer) Requests() []upstreamRequest {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]upstreamRequest(nil), s.log...)
}

// startOAuthServer runs oauth_server.mjs with args (e.g. --port,
// --public-url) until the test ends.
func startOAuthServer(t *testing.T, args ...string) *oauthServer {
	t.Helper()
	s, err := tryOAuthServer(t, args...)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// oauthBehindCaddy starts oauth_server.mjs (with args) behind a Caddy
// with oauthSite, and returns it with the endpoint clients use. The
// server's port is chosen before Caddy starts (Caddy's upstream) and bound
// after (the server's public URL is Caddy's): one free a moment before may
// be taken meanwhile (an outgoing connection's ephemeral port), so a
// server that cannot listen is started again on another.
func oauthBehindCaddy(t *testing.T, resume bool, args ...string) (*oauthServer, string) {
	t.Helper()
	for try := 1; ; try++ {
		upstream := fmt.Sprintf("127.0.0.1:%d", harness.FreePort(t))
		c := harness.StartCaddy(t, oauthSite(upstream, resume))
		endpoint := c.Base() + "/mcp"
		srv, err := tryOAuthServer(t, append(args, "--port="+strings.TrimPrefix(upstream, "127.0.0.1:"), "--public-url="+endpoint)...)
		if err == nil {
			return srv, endpoint
		}
		if try == 3 {
			t.Fatal(err)
		}
		t.Logf("oauth_server.mjs on %s, try %d: %v", upstream, try, err)
	}
}

// tryOAuthServer is startOAuthServer, reporting a server that did not
// start instead of failing the test.
func tryOAuthServer(t *testing.T, args ...string) (*oauthServer, error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	argv := append([]string{"oauth_server.mjs"}, args...)
	cmd := exec.CommandContext(ctx, "node", argv...)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	s := &oauthServer{}
	port := make(chan string, 1)
	done := make(chan struct{})
	go func() {
		defer close(done)
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			line := sc.Text()
			if p, ok := strings.CutPrefix(line, "listening "); ok {
				port <- p
				continue
			}
			var r upstreamRequest
			if err := json.Unmarshal([]byte(line), &r); err == nil {
				s.mu.Lock()
				s.log = append(s.log, r)
				s.mu.Unlock()
			}
		}
	}()
	var wait sync.Once
	stop := func() {
		wait.Do(func() {
			cancel()
			cmd.Wait()
			<-done
		})
	}
	t.Cleanup(func() {
		stop()
		if e := strings.TrimSpace(stderr.String()); e != "" {
			t.Logf("oauth_server.mjs stderr: %s", e)
		}
	})
	select {
	case p := <-port:
		s.Addr = "127.0.0.1:" + p
		return s, nil
	case <-done: // it exited (its stdout closed) without listening
	case <-time.After(30 * time.Second):
	}
	stop()
	return nil, fmt.Errorf("oauth_server.mjs did not start: %s", stderr.String())
}

// Mint asks the server's test endpoint for an access token: sub's, for
// audience aud ("" is the server's public URL), living expIn (negative:
// already expired), or forged (same claims, bad signature).
func (s *oauthServer) Mint(t *testing.T, sub, aud string, expIn time.Duration, forge bool) string {
	t.Helper()
	req := map[string]any{"sub": sub, "expInMs": expIn.Milliseconds(), "forge": forge}
	if aud != "" {
		req["aud"] = aud
	}
	body, _ := json.Marshal(req)
	resp, err := http.Post("http://"+s.Addr+"/test/mint", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out struct {
		AccessToken string `json:"access_token"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || resp.StatusCode != 200 || out.AccessToken == "" {
		t.Fatalf("mint: %d %v", resp.StatusCode, err)
	}
	return out.AccessToken
}

// oauthSite is the Caddy site in front of the server at upstream: every
// path is proxied (the SDK client discovers /.well-known/* and uses
// /register, /authorize, /token at the resource's origin), with mcp_resume
// on /mcp* only when resume is set.
func oauthSite(upstream string, resume bool) string {
	mcp := mcptest.ProxyRoute(upstream)
	if resume {
		mcp = mcptest.ResumeRoute(upstream, "")
	}
	// handle blocks are exclusive and the path matcher sorts first; a bare
	// route next to reverse_proxy would not be, as handle orders before route.
	return fmt.Sprintf("\thandle /mcp* {\n%s\n\t}\n\thandle {\n\t\treverse_proxy %s\n\t}", mcp, upstream)
}

// oauthReport is what oauth_client.mjs prints.
type oauthReport struct {
	SDKVersion string `json:"sdkVersion"`
	Calls      []struct {
		Progress []float64 `json:"progress"`
		Result   string    `json:"result"`
		Error    string    `json:"error"`
	} `json:"calls"`
	ConnectError   string `json:"connectError"`
	Authorizations int    `json:"authorizations"`
	TokenSaves     []struct {
		T          int    `json:"t"`
		Kind       string `json:"kind"`
		TokenID    string `json:"tokenId"`
		DuringCall int    `json:"duringCall"`
		Phase      string `json:"phase"`
	} `json:"tokenSaves"`
	Refreshes             int `json:"refreshes"`
	RefreshesDuringCalls  int `json:"refreshesDuringCalls"`
	RefreshesBetweenCalls int `json:"refreshesBetweenCalls"`
	Pings                 struct {
		OK     int      `json:"ok"`
		Failed int      `json:"failed"`
		Errors []string `json:"errors"`
	} `json:"pings"`
	Cut struct {
		Done          bool `json:"done"`
		CallIndex     int  `json:"callIndex"`
		AfterProgress int  `json:"afterProgress"`
		Aborted       int  `json:"aborted"`
		SocketsClosed int  `json:"socketsClosed"`
	} `json:"cut"`
	Requests []clientRequest `json:"requests"`
	Delete   struct {
		Status   int    `json:"status"`
		Attempts int    `json:"attempts"`
		Error    string `json:"error"`
	} `json:"delete"`
	TransportErrors []string `json:"transportErrors"`
}

type clientRequest struct {
	T               int    `json:"t"`
	Method          string `json:"method"`
	Path            string `json:"path"`
	RPC             string `json:"rpc"`
	LastEventID     string `json:"lastEventId"`
	TokenID         string `json:"tokenId"`
	Status          int    `json:"status"`
	ContentType     string `json:"contentType"`
	WWWAuthenticate string `json:"wwwAuthenticate"`
	Body            string `json:"body"`
	Error           string `json:"error"`
}

func (r clientRequest) String() string {
	s := fmt.Sprintf("t=%dms %s %s", r.T, r.Method, r.Path)
	if r.RPC != "" {
		s += " " + r.RPC
	}
	if r.LastEventID != "" {
		s += " Last-Event-ID=" + r.LastEventID
	}
	if r.TokenID != "" {
		s += " token=" + r.TokenID
	}
	s += " -> " + strconv.Itoa(r.Status)
	if r.Body != "" {
		s += " " + r.Body
	}
	if r.Error != "" {
		s += " error: " + r.Error
	}
	return s
}

// runOAuthClient runs oauth_client.mjs against endpoint and returns its
// report.
func runOAuthClient(t *testing.T, endpoint string, args ...string) oauthReport {
	t.Helper()
	var r oauthReport
	runScript(t, 90*time.Second, &r, append([]string{"oauth_client.mjs", endpoint,
		fmt.Sprintf("--calls=%d", oauthCalls), fmt.Sprintf("--n=%d", oauthN),
		fmt.Sprintf("--interval-ms=%d", oauthIntervalMs), fmt.Sprintf("--timeout-ms=%d", oauthCallTimeout)}, args...)...)
	return r
}

// proxyRefusals returns the client's requests the proxy itself refused
// with 403 -32011 (no WWW-Authenticate: the upstream's 401/403 carry one).
func proxyRefusals(r oauthReport) []clientRequest {
	var out []clientRequest
	for _, q := range r.Requests {
		if q.Status == http.StatusForbidden && q.WWWAuthenticate == "" && strings.Contains(q.Body, "-32011") {
			out = append(out, q)
		}
	}
	return out
}

// The user story: a TypeScript SDK client whose tokens expire every 1.5 s
// makes two calls of 2.4 s, refreshing during and between them, optionally
// has its connection cut right after a refresh, and ends its session.
func TestOAuthRotation(t *testing.T) {
	nodeReady(t)
	for _, via := range []string{"direct", "reverse_proxy", "mcp_resume"} {
		for _, cut := range []bool{false, true} {
			name := via + "/no_cut"
			if cut {
				name = via + "/cut_after_refresh"
			}
			t.Run(name, func(t *testing.T) {
				testOAuthRotation(t, via, cut)
			})
		}
	}
}

func testOAuthRotation(t *testing.T, via string, cut bool) {
	args := []string{fmt.Sprintf("--token-ttl-ms=%d", oauthTokenTTLMs)}
	// The SDK resumes a POST stream only after an event with an ID. Through
	// mcp_resume every event has one; directly and through reverse_proxy only
	// an upstream with an event store sends IDs, so the cut's controls run
	// the server with the SDK's InMemoryEventStore.
	if cut && via != "mcp_resume" {
		args = append(args, "--event-store")
	}
	var srv *oauthServer
	var endpoint string
	if via == "direct" {
		srv = startOAuthServer(t, append(args, "--port=0")...)
		endpoint = "http://" + srv.Addr + "/mcp"
	} else {
		srv, endpoint = oauthBehindCaddy(t, via == "mcp_resume", args...)
	}

	var clientArgs []string
	if cut {
		clientArgs = append(clientArgs, "--cut-after-refresh")
	}
	r := runOAuthClient(t, endpoint, clientArgs...)

	failed := false
	fail := func(format string, a ...any) {
		t.Helper()
		failed = true
		t.Errorf(format, a...)
	}
	defer func() {
		if !failed {
			return
		}
		var mcp []clientRequest
		for _, q := range r.Requests {
			if q.Path == "/mcp" || q.Status >= 400 {
				mcp = append(mcp, q)
			}
		}
		t.Logf("client's requests to /mcp (and failures), repeats collapsed:%s", collapse(mcp))
		t.Logf("token saves: %+v; pings ok %d, failed %d", r.TokenSaves, r.Pings.OK, r.Pings.Failed)
		t.Logf("transport errors, repeats collapsed:%s", collapse(r.TransportErrors))
	}()

	// Through mcp_resume before sessions are bound to the principal, this is
	// why everything below fails: say it first, once, plainly.
	if refused := proxyRefusals(r); len(refused) > 0 {
		fail("%d requests got the proxy's own 403 -32011 (no WWW-Authenticate) after the token was refreshed; first: %s\n"+
			"  The session is still bound to the bytes of Authorization, so a rotated token locks its owner out.\n"+
			"  Expected to fail until mcp_resume binds sessions to the verified principal (design.md §11).",
			len(refused), refused[0])
	}

	if r.ConnectError != "" {
		t.Fatalf("connect (OAuth flow + initialize) failed: %s", r.ConnectError)
	}
	if r.Authorizations != 1 {
		fail("the client went through the authorization flow %d times, want once (a refresh must not need a new authorization)", r.Authorizations)
	}
	if len(r.Calls) != oauthCalls {
		fail("%d calls reported, want %d", len(r.Calls), oauthCalls)
	}
	want := fmt.Sprintf("counted to %d", oauthN)
	for i, c := range r.Calls {
		if c.Error != "" || c.Result != want {
			fail("call %d: result %q, error %q; want %q", i+1, c.Result, c.Error, want)
		}
		assertOnceInOrder(t, c.Progress, oauthN)
		if len(c.Progress) != oauthN {
			failed = true
		}
	}

	// Tokens really rotated, during a call and between calls.
	if r.RefreshesDuringCalls+r.RefreshesBetweenCalls < 2 || r.RefreshesDuringCalls < 1 || r.RefreshesBetweenCalls < 1 {
		fail("refreshes during calls %d, between calls %d: want at least one of each "+
			"(a client refreshes only on a 401: a request refused otherwise, e.g. the proxy's 403, never gets there)",
			r.RefreshesDuringCalls, r.RefreshesBetweenCalls)
	}

	if cut {
		checkCutResumedWithNewToken(t, r, fail)
	}

	// The DELETE reached the upstream with a valid token and was answered
	// 2xx, and the client saw that answer.
	if r.Delete.Status/100 != 2 {
		fail("the client's DELETE was answered %d (attempts %d, error %q), want 2xx", r.Delete.Status, r.Delete.Attempts, r.Delete.Error)
	}
	var deletes []upstreamRequest
	for _, q := range srv.Requests() {
		if q.Method == http.MethodDelete {
			deletes = append(deletes, q)
		}
	}
	ok := false
	for _, d := range deletes {
		if d.Auth == "valid" && d.Status/100 == 2 && d.Session != "" {
			ok = true
		}
	}
	if !ok {
		fail("no DELETE reached the upstream with a valid token and a 2xx answer; the upstream saw %+v", deletes)
	}
}

// checkCutResumedWithNewToken: the cut landed mid-call after a refresh, and
// the SDK resumed the call's stream with a GET carrying Last-Event-ID and the
// refreshed token, answered 200 text/event-stream.
func checkCutResumedWithNewToken(t *testing.T, r oauthReport, fail func(string, ...any)) {
	t.Helper()
	if !r.Cut.Done {
		fail("the cut did not happen (no refresh while a call's stream was open?): %+v", r.Cut)
		return
	}
	if r.Cut.AfterProgress >= oauthN {
		fail("the cut came after the last progress notification (%+v): nothing was left to resume", r.Cut)
	}
	if r.Cut.Aborted == 0 || r.Cut.SocketsClosed == 0 {
		fail("cut %+v: no open response was aborted or no socket closed", r.Cut)
	}
	// The refresh that armed the cut is the first one made while a call's
	// stream was open; every resume must carry it or a later token, never
	// one from before it.
	var before []string // tokens saved before that refresh
	for _, sv := range r.TokenSaves {
		if sv.Kind == "refresh" && sv.DuringCall == r.Cut.CallIndex {
			break
		}
		before = append(before, sv.TokenID)
	}
	resumed := false
	for _, q := range r.Requests {
		if q.Method != "GET" || q.LastEventID == "" {
			continue
		}
		if slices.Contains(before, q.TokenID) {
			fail("resume %s carried a token from before the refresh", q)
		}
		if q.Status == 200 && strings.HasPrefix(q.ContentType, "text/event-stream") {
			resumed = true
		} else {
			fail("resume answered: %s", q)
		}
	}
	if !resumed {
		fail("the call's stream was not resumed with Last-Event-ID after the cut")
	}
}

// Attacks on a session whose owner rotates tokens, against mcp_resume only,
// with raw HTTP: alice has a session and a finished call whose events the
// proxy retains; other credentials on her session must never be served an
// event of hers, nor end her session.
func TestOAuthAttacks(t *testing.T) {
	nodeReady(t)
	srv, endpoint := oauthBehindCaddy(t, true)

	bearer := func(tok string) http.Header {
		if tok == "" {
			return http.Header{}
		}
		return http.Header{"Authorization": {"Bearer " + tok}}
	}
	const version = "2025-11-25"
	aliceTok := srv.Mint(t, "alice", "", 2*time.Minute, false)
	alice := harness.NewRawClient(t, strings.TrimSuffix(endpoint, "/mcp"), version)
	alice.Header = bearer(aliceTok)
	alice.Initialize()

	// Alice's call: 3 progress notifications ("step i of 3") and "counted to
	// 3". Attackers' calls count to 2, so anything "of 3" or "counted to 3"
	// in an answer to them is alice's.
	evs := alice.CallToEnd(1, "count", map[string]any{"n": 3, "intervalMs": 20})
	if len(evs) < 4 || evs[0].ID == "" || !strings.Contains(evs[len(evs)-1].Data, "counted to 3") {
		t.Fatalf("alice's call: %+v", evs)
	}
	var first string // the first event with an ID that carries data
	for _, ev := range evs {
		if ev.ID != "" && ev.Data != "" {
			first = ev.ID
			break
		}
	}
	isAlices := func(b []byte) bool {
		return bytes.Contains(b, []byte("of 3")) || bytes.Contains(b, []byte("counted to 3"))
	}
	// aliceResumes: alice, with token tok, resumes from her first event and
	// gets the rest of her stream, result included.
	aliceResumes := func(t *testing.T, tok, when string) {
		t.Helper()
		a := alice.Client.WithHeader(bearer(tok))
		resp, err := a.Resume(context.Background(), first)
		if err != nil {
			t.Errorf("%s: alice's resume: %v", when, err)
			return
		}
		defer resp.Body.Close()
		if resp.StatusCode != 200 {
			b, _ := io.ReadAll(resp.Body)
			t.Errorf("%s: alice's resume answered %d %s (WWW-Authenticate %q)", when, resp.StatusCode, b, resp.Header.Get("WWW-Authenticate"))
			return
		}
		got, err := mcptest.ReadEvents(resp.Body, 0, 10*time.Second)
		if err != nil || len(got) == 0 || !strings.Contains(got[len(got)-1].Data, "counted to 3") {
			t.Errorf("%s: alice's resume got %+v (err %v), want the rest of her stream with the result", when, got, err)
		}
	}
	aliceResumes(t, aliceTok, "before the attacks") // the setup works

	attackers := []struct {
		name string
		tok  string
		// wantUpstream401: the answer is the upstream's 401 with its
		// WWW-Authenticate [principal binding]; otherwise a 403 (the proxy's)
		// or whatever the upstream answers, never alice's events.
		wantUpstream401 bool
	}{
		{"bob_valid", srv.Mint(t, "bob", "", 2*time.Minute, false), false},
		{"alice_forged", srv.Mint(t, "alice", "", 2*time.Minute, true), true},
		{"alice_expired", srv.Mint(t, "alice", "", -time.Minute, false), true},
		{"alice_other_audience", srv.Mint(t, "alice", "http://127.0.0.1:1/other/mcp", 2*time.Minute, false), true},
		{"no_credentials", "", true},
	}
	actions := []struct {
		name, method, body string
		extra              http.Header
	}{
		{"POST_tools_call", "POST", mcptest.CallBody(99, "count", map[string]any{"n": 2, "intervalMs": 20}, "tok"), nil},
		{"resume_GET", "GET", "", http.Header{"Last-Event-Id": {first}}},
		{"DELETE", "DELETE", "", nil},
	}
	for _, at := range attackers {
		for _, ac := range actions {
			t.Run(at.name+"/"+ac.name, func(t *testing.T) {
				x := alice.Client.WithHeader(bearer(at.tok))
				ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
				defer cancel()
				resp, err := x.Do(ctx, ac.method, ac.body, ac.extra)
				if err != nil {
					t.Fatal(err)
				}
				// An SSE answer may stay open (a live stream): read what comes
				// within the deadline.
				body, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				www := resp.Header.Get("WWW-Authenticate")
				t.Logf("%s %s with %s: %d %q WWW-Authenticate %q", ac.method, ac.name, at.name, resp.StatusCode, truncate(body, 200), www)

				if isAlices(body) {
					t.Errorf("SECURITY: %s got alice's events: %q", at.name, truncate(body, 400))
				}
				switch {
				case at.wantUpstream401:
					if resp.StatusCode != http.StatusUnauthorized || !strings.Contains(www, "invalid_token") || !strings.Contains(www, "resource_metadata=") {
						t.Errorf("[principal binding] got %d (WWW-Authenticate %q), want the upstream's 401 with its WWW-Authenticate "+
							"(invalid_token, resource_metadata), which makes a client refresh; fails until the proxy asks the upstream about new credentials",
							resp.StatusCode, www)
					}
				case resp.StatusCode/100 == 2 && ac.method != "POST":
					// bob's valid token: the upstream may accept it, but a
					// resume or DELETE of alice's session must not succeed.
					t.Errorf("%s's %s on alice's session answered %d, want 403", at.name, ac.method, resp.StatusCode)
				}
			})
		}
	}

	// No DELETE but alice's own may have reached the upstream and ended
	// the session there.
	for _, q := range srv.Requests() {
		if q.Method == http.MethodDelete && q.Status/100 == 2 {
			t.Errorf("SECURITY: a DELETE by someone else ended alice's session upstream: %+v", q)
		}
	}
	// Her session survived every attempt, with her own token...
	aliceResumes(t, aliceTok, "after the attacks, alice's first token")
	// ... and with a rotated one: alice's second valid token (another jti,
	// same iss and sub) [principal binding].
	rotated := srv.Mint(t, "alice", "", 2*time.Minute, false)
	t.Run("alice_rotated_token_resumes", func(t *testing.T) {
		aliceResumes(t, rotated, "[principal binding] alice's second token")
	})
}

// collapse lists items one a line, a run of equal ones as one with its count.
func collapse[T comparable](items []T) string {
	var b strings.Builder
	for i := 0; i < len(items); {
		j := i + 1
		for j < len(items) && sameEntry(items[j], items[i]) {
			j++
		}
		fmt.Fprintf(&b, "\n  %v", items[i])
		if j-i > 1 {
			fmt.Fprintf(&b, " (×%d)", j-i)
		}
		i = j
	}
	return b.String()
}

// sameEntry: equal, or for client requests, the same but for the time.
func sameEntry[T comparable](a, b T) bool {
	if x, ok := any(a).(clientRequest); ok {
		y := any(b).(clientRequest)
		x.T, y.T = 0, 0
		return x == y
	}
	return a == b
}

func truncate(b []byte, n int) string {
	if len(b) > n {
		return string(b[:n]) + "…"
	}
	return string(b)
}

// What TypeScript SDK 1.32.2 does when a resume GET gets a 401, directly
// against a server that resumes by itself (event store), so that nothing of
// the proxy is involved. _startOrAuthSse answers a 401 with _authThenStart(),
// which refreshes and then opens a GET with resumptionToken undefined: the
// retry after the refresh carries no Last-Event-ID. If that GET succeeds it
// is taken for the standalone stream and the call's stream is never
// resumed (the call times out); only if it fails does the reconnection
// loop of the original resume try again, with Last-Event-ID. Here only the
// call's response is cut, the standalone GET stays open, so the TS server
// answers the ID-less retry 409 ("Only one SSE stream is allowed per
// session") and the SDK recovers on its next attempt.
//
// For the proxy: a resume with an expired token must get the upstream's 401
// (so the client refreshes), and then the SDK sends a GET without
// Last-Event-ID on a session whose standalone stream may be open. If that
// GET is answered 200 (a takeover of the standalone stream) the call is
// lost; a 409 lets the SDK retry with its Last-Event-ID. (With every
// connection cut, the standalone stream's reconnection races with it, and
// the call survives or not by which GET comes first.) This test fails when
// the SDK changes, so that research/mcp-auth.md and the tests above are
// updated.
func TestOAuthSDKResumeAfter401DropsLastEventID(t *testing.T) {
	nodeReady(t)
	srv := startOAuthServer(t, "--port=0", "--event-store", fmt.Sprintf("--token-ttl-ms=%d", oauthTokenTTLMs))
	// No pings, so nothing refreshes before the cut; one call, its response
	// cut at its first progress notification after the token expired.
	r := runOAuthClient(t, "http://"+srv.Addr+"/mcp", "--calls=1", "--ping-ms=0", "--cut-after-expiry", "--cut-only-call", "--timeout-ms=6000")
	if !r.Cut.Done || r.Cut.AfterProgress >= oauthN {
		t.Fatalf("the cut did not land mid-call after the token expired: %+v", r.Cut)
	}
	defer func() {
		if t.Failed() {
			t.Logf("calls %+v; refreshes %d; requests:%s", r.Calls, r.Refreshes, collapse(r.Requests))
		}
	}()
	// The sequence: GET + Last-Event-ID -> 401; refresh; GET without it ->
	// 409; GET + the same Last-Event-ID -> 200.
	var gets []clientRequest
	for _, q := range r.Requests {
		if q.Method == "GET" && q.Path == "/mcp" {
			gets = append(gets, q)
		}
	}
	i := slices.IndexFunc(gets, func(q clientRequest) bool { return q.LastEventID != "" })
	if i < 0 || gets[i].Status != http.StatusUnauthorized {
		t.Fatalf("the first resume was not answered 401 (expired token)")
	}
	id := gets[i].LastEventID
	rest := gets[i+1:]
	if len(rest) < 2 || rest[0].LastEventID != "" || rest[0].Status != http.StatusConflict {
		t.Errorf("SDK %s: the GET after refreshing on the resume's 401 is not an ID-less one answered 409; "+
			"if it now keeps Last-Event-ID, update research/mcp-auth.md and this test", r.SDKVersion)
		return
	}
	if rest[1].LastEventID != id || rest[1].Status != http.StatusOK {
		t.Errorf("after the 409 the SDK did not resume with Last-Event-ID %s: %s", id, rest[1])
	}
	if len(r.Calls) != 1 || r.Calls[0].Error != "" {
		t.Errorf("the call did not survive: %+v", r.Calls)
	} else {
		assertOnceInOrder(t, r.Calls[0].Progress, oauthN)
	}
	t.Logf("resume after the 401: %s; then %s; then %s", gets[i], rest[0], rest[1])
}
