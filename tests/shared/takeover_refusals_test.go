package shared

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/internal/demoserver"
	"github.com/mcpresume/caddy-mcp-resume/internal/mcptest"
	"github.com/mcpresume/caddy-mcp-resume/internal/testnet"
	"github.com/mcpresume/caddy-mcp-resume/tests/harness"
)

// Adversarial checks of the credential-refused takeover (review 23): a
// credential the upstream refuses to a resume GET lets the read go; the
// client's next request with it gets the upstream's verdict.

// authGate sits in front of iss.Protect: it counts the upstream GETs that
// resume a stream (Last-Event-ID) and the proxy's pings, and can refuse
// the resume GETs whatever the token (denyGET), as an upstream whose GET
// scope a token lacks does.
type authGate struct {
	resumeGETs, pings atomic.Int64
	denyGET           atomic.Bool
	denyAll           atomic.Bool // 403 to every request with a token
}

func (g *authGate) wrap(iss *mcptest.JWTIssuer) func(http.Handler) http.Handler {
	return func(h http.Handler) http.Handler {
		p := iss.Protect(h)
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if g.denyAll.Load() && r.Header.Get("Authorization") != "" {
				if r.Method == http.MethodGet && r.Header.Get("Last-Event-Id") != "" {
					g.resumeGETs.Add(1)
				}
				w.Header().Set("WWW-Authenticate", `Bearer error="insufficient_scope"`)
				w.WriteHeader(http.StatusForbidden)
				return
			}
			if r.Method == http.MethodGet && r.Header.Get("Last-Event-Id") != "" {
				g.resumeGETs.Add(1)
				if g.denyGET.Load() {
					w.Header().Set("WWW-Authenticate", `Bearer error="insufficient_scope"`)
					w.WriteHeader(http.StatusUnauthorized)
					return
				}
			}
			if r.Method == http.MethodPost {
				b, _ := io.ReadAll(r.Body)
				r.Body = io.NopCloser(bytes.NewReader(b))
				if bytes.Contains(b, []byte("mcp-resume-check")) {
					g.pings.Add(1)
				}
			}
			p.ServeHTTP(w, r)
		})
	}
}

// gatedReplicas is bearerReplicas behind g, with extra in the store block
// and module options after it.
func gatedReplicas(t *testing.T, iss *mcptest.JWTIssuer, g *authGate, extra, options string) (a, b *replica) {
	t.Helper()
	ns := testnet.NATS(t)
	d := upstreamBehind(t, g.wrap(iss))
	store := storeNATS(natsURLs(ns), extra) + "\n" + options
	return d.start("r1", store, true), d.start("r2", store, true)
}

// readPart reads one resume's events until its end (a cut, the stream's
// end) or timeout.
func readPart(resp *http.Response, timeout time.Duration) []mcptest.Event {
	defer resp.Body.Close()
	evs, _ := mcptest.ReadEvents(resp.Body, 0, timeout)
	return evs
}

// resumeLikeAnSDK resumes request 2 of c from last as an SDK client does,
// until the call ends (its result or an error) or for d: a cut stream is
// resumed from the last ID it brought, a 401 makes it call refresh (if
// set) first, every other status is retried after pause. It returns what
// each resume read, the resumes' statuses, and whether the call ended.
func resumeLikeAnSDK(t *testing.T, c *mcptest.Client, last string, refresh func(), d, pause time.Duration) (parts [][]mcptest.Event, statuses []int, ended bool) {
	t.Helper()
	for deadline := time.Now().Add(d); time.Now().Before(deadline); time.Sleep(pause) {
		resp, err := c.Resume(t.Context(), last)
		if err != nil {
			t.Fatal(err)
		}
		statuses = append(statuses, resp.StatusCode)
		switch {
		case resp.StatusCode == http.StatusOK:
			evs := readPart(resp, 5*time.Second)
			parts = append(parts, evs)
			if _, result, errs := callEvents(t, evs, "2"); result != "" || len(errs) > 0 {
				return parts, statuses, true
			}
			if len(evs) > 0 {
				last = lastID(evs)
			}
		case resp.StatusCode == http.StatusUnauthorized && refresh != nil:
			resp.Body.Close()
			refresh()
		default:
			resp.Body.Close()
		}
	}
	return parts, statuses, false
}

// The upstream refuses the takeover's GET (401) but accepts a ping with
// the same, valid token: it is the resume, not the credential, it
// refuses. The call must fail explicitly (gap and -32010) at once, and the
// upstream must not be asked again and again.
func TestRefusedGETRefusedPingAcceptedFailsExplicitly(t *testing.T) {
	t.Parallel()
	iss := mcptest.NewJWTIssuer("https://as.example.test")
	g := &authGate{}
	a, b := gatedReplicas(t, iss, g, "", "")
	viaA, first := bearerCallThenKill(t, a, iss, time.Minute, 25)
	g.denyGET.Store(true)
	time.Sleep(2500 * time.Millisecond) // the lease lapses
	viaB := clientOn(viaA, b)
	begun := time.Now()
	resp, err := viaB.Resume(t.Context(), lastID(first))
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("resume on B: %d", resp.StatusCode)
	}
	rest := readPart(resp, 15*time.Second)
	_, result, errs := callEvents(t, rest, "2")
	if result != "" || len(errs) == 0 {
		t.Fatalf("the upstream refuses the resume but accepts the token: result %q, errors %q after %v; want the explicit failure",
			result, errs, time.Since(begun))
	}
	time.Sleep(2 * time.Second)
	if n := g.resumeGETs.Load(); n > 2 {
		t.Errorf("the upstream got %d resume GETs, want at most 2", n)
	}
	if n := series(t, b, `caddy_mcp_resume_takeovers_total{outcome="credential_refused"}`); n != 0 {
		t.Errorf("credential_refused %v: the credential was accepted", n)
	}
}

// The client never refreshes (it keeps resuming with the expired token):
// the upstream is asked for the resume once, not on every resume; past
// takeover_wait (counted from B's letting go, not the producer's death)
// the call fails explicitly, and a client that then brings a fresh token
// reads the failure (gap and -32010), not a result nor silence.
func TestRefusedNeverRefreshedEndsAtTakeoverWait(t *testing.T) {
	t.Parallel()
	iss := mcptest.NewJWTIssuer("https://as.example.test")
	g := &authGate{}
	a, b := gatedReplicas(t, iss, g, "takeover_wait 5s", "")
	viaA, first := bearerCallThenKill(t, a, iss, 3*time.Second, 100)
	time.Sleep(5 * time.Second) // the token expired; the lease lapsed
	viaB := clientOn(viaA, b)
	parts, statuses, _ := resumeLikeAnSDK(t, viaB, lastID(first), nil, 9*time.Second, 300*time.Millisecond)
	last := lastID(first)
	for _, evs := range parts {
		if len(evs) > 0 {
			last = lastID(evs)
		}
	}
	t.Logf("resumes with the expired token answered %v; upstream resume GETs %d, pings %d", statuses, g.resumeGETs.Load(), g.pings.Load())
	if n := g.resumeGETs.Load(); n > 2 {
		t.Errorf("the upstream got %d resume GETs for one expired token, want 1", n)
	}
	fresh := viaB.WithHeader(bearer(iss.Mint("alice", time.Minute)))
	resp, err := fresh.Resume(t.Context(), last)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		resp.Body.Close()
		t.Fatalf("resume with a fresh token past takeover_wait: %d", resp.StatusCode)
	}
	_, result, errs := callEvents(t, readPart(resp, 10*time.Second), "2")
	if result != "" || len(errs) == 0 {
		t.Fatalf("past takeover_wait: result %q, errors %q; want the explicit failure", result, errs)
	}
}

// The client, cut after B let go of the read, refreshes its token on
// another request of the session (a ping) rather than on its resume: B
// takes the call back with that token (takeBack) before the client
// resumes, and the client then reads the rest. Meanwhile another
// principal's token and no token get nothing of the log.
func TestRefusedRefreshOnAPingTakesTheCallBack(t *testing.T) {
	t.Parallel()
	iss := mcptest.NewJWTIssuer("https://as.example.test")
	g := &authGate{}
	a, b := gatedReplicas(t, iss, g, "", "")
	const n = 25
	viaA, first := bearerCallThenKill(t, a, iss, 3*time.Second, n)
	time.Sleep(5 * time.Second)
	ctx := t.Context()
	viaB := clientOn(viaA, b)
	resp, err := viaB.Resume(ctx, lastID(first))
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("resume with the expired, bound token: %v %v", err, resp)
	}
	cut := readPart(resp, 15*time.Second)
	parts, last := [][]mcptest.Event{first, cut}, lastID(first)
	if len(cut) > 0 {
		last = lastID(cut)
	}
	if !strings.Contains(b.Logs(), "upstream refused the credential a resume of its stream carried") {
		t.Fatalf("B did not log the refused credential")
	}
	for name, h := range map[string]http.Header{"bob's token": bearer(iss.Mint("bob", time.Minute)), "no token": {}} {
		other := viaB.WithHeader(h)
		r, err := other.Resume(ctx, last)
		if err != nil {
			t.Fatal(err)
		}
		r.Body.Close()
		if r.StatusCode == http.StatusOK {
			t.Errorf("resume with %s after the refusal: 200", name)
		}
	}
	fresh := viaB.WithHeader(bearer(iss.Mint("alice", time.Minute)))
	pr, err := fresh.Do(ctx, "POST", `{"jsonrpc":"2.0","id":90,"method":"ping"}`, nil)
	if x := harness.MustFinish(t, pr, err); x.Status != http.StatusOK {
		t.Fatalf("ping with the refreshed token: %s", x)
	}
	harness.WaitFor(t, 10*time.Second, "B takes the call back with the refreshed token", func() bool {
		return takeoverLines(b) >= 2
	})
	r, err := fresh.Resume(ctx, last)
	if err != nil || r.StatusCode != http.StatusOK {
		t.Fatalf("resume with the refreshed token: %v %v", err, r)
	}
	parts = append(parts, readPart(r, 20*time.Second))
	wantCounted(t, "refreshed on a ping", n, parts...)
}

// Under rebind off a refreshed token is another owner: the client can
// never refresh into the call. Letting the read go then only trades the
// explicit failure (gap and -32010, what the client read before this
// change) for 401s and 403s: the client, resuming (and refreshing on a
// 401), must still read the call's end.
func TestRefusedRebindOffStillEndsTheCallExplicitly(t *testing.T) {
	t.Parallel()
	iss := mcptest.NewJWTIssuer("https://as.example.test")
	g := &authGate{}
	a, b := gatedReplicas(t, iss, g, "takeover_wait 5s", "rebind off")
	viaA, first := bearerCallThenKill(t, a, iss, 3*time.Second, 100)
	time.Sleep(5 * time.Second)
	viaB := clientOn(viaA, b)
	refresh := func() { viaB.Header = bearer(iss.Mint("alice", time.Minute)) }
	_, statuses, ended := resumeLikeAnSDK(t, viaB, lastID(first), refresh, 15*time.Second, 500*time.Millisecond)
	if ended {
		t.Logf("statuses %v; the call ended", statuses)
		return
	}
	t.Fatalf("rebind off: the client never read the call's end; resumes answered %v", statuses)
}

// The proxy's own tap (no takeover) follows an upstream that closes the
// call's stream (SEP-1699, close_after); the token expires before the
// reconnect. With the shared store the client is cut, gets the upstream's
// 401, refreshes, and reads the rest; with the memory store (no one could
// take over) the call fails explicitly as before.
func TestRefusedOwnTapCloseAfterWithAnExpiredToken(t *testing.T) {
	t.Parallel()
	for _, shared := range []bool{true, false} {
		t.Run(fmt.Sprintf("shared=%v", shared), func(t *testing.T) {
			t.Parallel()
			iss := mcptest.NewJWTIssuer("https://as.example.test")
			g := &authGate{}
			d := upstreamBehind(t, g.wrap(iss))
			store := ""
			if shared {
				store = storeNATS(natsURLs(testnet.NATS(t)), "")
			}
			a := d.start("r1", store, shared)
			cl := bearerSession(t, a, iss, 2*time.Second, 60*time.Second)
			const n = 10
			ctx := t.Context()
			resp, err := cl.Call(ctx, 2, "count", map[string]any{"n": n, "interval_ms": 200, "close_after": 2, "retry_ms": 3500}, "p")
			if err != nil || resp.StatusCode != http.StatusOK {
				t.Fatalf("call: %v %v", err, resp)
			}
			firstPart := readPart(resp, 20*time.Second)
			parts := [][]mcptest.Event{firstPart}
			_, result, errs := callEvents(t, firstPart, "2")
			if !shared {
				if result != "" || len(errs) == 0 {
					t.Fatalf("memory store: result %q, errors %q; want the explicit failure in the call's response", result, errs)
				}
				return
			}
			if result != "" || len(errs) > 0 {
				t.Fatalf("the call's first response: result %q, errors %q; want a cut the client resumes from", result, errs)
			}
			last := lastID(firstPart)
			var statuses []int
			for result == "" && len(errs) == 0 {
				if len(statuses) == 6 {
					t.Fatalf("no result after resumes answered %v", statuses)
				}
				r, err := cl.Resume(ctx, last)
				if err != nil {
					t.Fatal(err)
				}
				statuses = append(statuses, r.StatusCode)
				if r.StatusCode == http.StatusUnauthorized {
					r.Body.Close()
					cl.Header = bearer(iss.Mint("alice", time.Minute))
					continue
				}
				if r.StatusCode != http.StatusOK {
					r.Body.Close()
					t.Fatalf("resume: %d (statuses %v)", r.StatusCode, statuses)
				}
				evs := readPart(r, 20*time.Second)
				parts = append(parts, evs)
				_, result, errs = callEvents(t, evs, "2")
				if len(evs) > 0 {
					last = lastID(evs)
				}
			}
			t.Logf("resumes answered %v", statuses)
			wantCounted(t, "own tap, token expired before the reconnect", n, parts...)
		})
	}
}

// userToken is the headers of a client under bind_headers X-User: its
// user, and its bearer token.
func userToken(user, tok string) http.Header {
	return http.Header{"Authorization": {"Bearer " + tok}, "X-User": {user}}
}

// resumeRefreshing resumes c from last until request 2 ends, refreshing
// its token (refresh) on a 401, at most six resumes; it returns the parts
// read and the statuses of the resumes.
func resumeRefreshing(t *testing.T, c *mcptest.Client, last string, refresh func() http.Header) ([][]mcptest.Event, []int) {
	t.Helper()
	var parts [][]mcptest.Event
	var statuses []int
	for len(statuses) < 6 {
		resp, err := c.Resume(t.Context(), last)
		if err != nil {
			t.Fatal(err)
		}
		statuses = append(statuses, resp.StatusCode)
		if resp.StatusCode == http.StatusUnauthorized {
			resp.Body.Close()
			c.Header = refresh()
			continue
		}
		if resp.StatusCode != http.StatusOK {
			resp.Body.Close()
			t.Fatalf("resume: %d (statuses %v)", resp.StatusCode, statuses)
		}
		evs := readPart(resp, 20*time.Second)
		parts = append(parts, evs)
		if _, result, errs := callEvents(t, evs, "2"); result != "" || len(errs) > 0 {
			return parts, statuses
		}
		if len(evs) > 0 {
			last = lastID(evs)
		}
	}
	t.Fatalf("no end of the call after resumes answered %v", statuses)
	return nil, nil
}

// Under bind_headers (no bearer in the binding) the credential is the
// upstream's alone; the refused one is still not answered from the log:
// the client gets the upstream's 401, refreshes and the call is taken
// over with the new token. Another user (X-User) with the refused token,
// or with a valid one, gets nothing.
func TestRefusedBindHeadersExpiredTokenTakeover(t *testing.T) {
	t.Parallel()
	iss := mcptest.NewJWTIssuer("https://as.example.test")
	g := &authGate{}
	a, b := gatedReplicas(t, iss, g, "", "bind_headers X-User")
	const n = 25
	cl := mcptest.NewClient("http://"+a.addr(), "2025-11-25", &http.Client{Timeout: 30 * time.Second})
	cl.Header = userToken("alice", iss.Mint("alice", 3*time.Second))
	if err := cl.Initialize(t.Context()); err != nil {
		t.Fatal(err)
	}
	resp, err := cl.Call(t.Context(), 2, "count", map[string]any{"n": n, "interval_ms": 300}, "p")
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("call: %v %v", err, resp)
	}
	first := readThenClose(t, resp, 4)
	a.Kill()
	time.Sleep(5 * time.Second)
	viaB := clientOn(cl, b)
	expired := viaB.Header
	resp, err = viaB.Resume(t.Context(), lastID(first))
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("resume with the expired token: %v %v", err, resp)
	}
	cut := readPart(resp, 15*time.Second)
	last := lastID(first)
	if len(cut) > 0 {
		last = lastID(cut)
	}
	for name, h := range map[string]http.Header{
		"mallory, alice's refused token": {"Authorization": expired["Authorization"], "X-User": {"mallory"}},
		"mallory, a valid token":         userToken("mallory", iss.Mint("alice", time.Minute)),
	} {
		r, err := viaB.WithHeader(h).Resume(t.Context(), last)
		if err != nil {
			t.Fatal(err)
		}
		r.Body.Close()
		if r.StatusCode == http.StatusOK {
			t.Errorf("resume by %s: 200", name)
		}
	}
	parts, statuses := resumeRefreshing(t, viaB, last, func() http.Header {
		return userToken("alice", iss.Mint("alice", time.Minute))
	})
	t.Logf("resumes answered %v", statuses)
	if statuses[0] != http.StatusUnauthorized {
		t.Errorf("the refused token's resume: %d, want the upstream's 401", statuses[0])
	}
	wantCounted(t, "bind_headers, refreshed after the upstream's 401", n, append([][]mcptest.Event{first, cut}, parts...)...)
}

// The refusal is remembered by the replica that met it only: a client cut
// on B that resumes on C with the same expired token makes C ask the
// upstream once too, and no more; the client refreshes on C's 401 and C
// takes the call over.
func TestRefusedClientBouncesToAThirdReplica(t *testing.T) {
	t.Parallel()
	iss := mcptest.NewJWTIssuer("https://as.example.test")
	g := &authGate{}
	ns := testnet.NATS(t)
	d := upstreamBehind(t, g.wrap(iss))
	store := storeNATS(natsURLs(ns), "")
	a, b, c := d.start("r1", store, true), d.start("r2", store, true), d.start("r3", store, true)
	const n = 25
	viaA, first := bearerCallThenKill(t, a, iss, 3*time.Second, n)
	time.Sleep(5 * time.Second)
	viaB := clientOn(viaA, b)
	resp, err := viaB.Resume(t.Context(), lastID(first))
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("resume on B: %v %v", err, resp)
	}
	cutB := readPart(resp, 15*time.Second)
	last := lastID(first)
	if len(cutB) > 0 {
		last = lastID(cutB)
	}
	viaC := clientOn(viaA, c)
	parts, statuses := resumeRefreshing(t, viaC, last, func() http.Header { return bearer(iss.Mint("alice", time.Minute)) })
	t.Logf("resumes on C answered %v; upstream resume GETs %d, pings %d", statuses, g.resumeGETs.Load(), g.pings.Load())
	wantCounted(t, "bounced to C", n, append([][]mcptest.Event{first, cutB}, parts...)...)
	if got := g.resumeGETs.Load(); got > 3 {
		t.Errorf("upstream resume GETs %d, want at most 3 (B's and C's with the expired token, C's with the fresh one)", got)
	}
}

// A standalone GET stream whose upstream closes it (polling servers) once
// the token expired: the proxy's reconnect is refused; the client must not
// be left on a silent stream: it is cut, and its next GET gets the
// upstream's 401 (what makes it refresh).
func TestRefusedStandaloneWithAnExpiredToken(t *testing.T) {
	t.Parallel()
	iss := mcptest.NewJWTIssuer("https://as.example.test")
	mux := http.NewServeMux()
	mux.Handle("/mcp", iss.Protect(demoserver.New(demoserver.Options{EventStore: true, CloseStandaloneAfter: time.Second})))
	d := &deployment{t: t, upstream: harness.StartHandler(t, mux)}
	a := d.start("r1", storeNATS(natsURLs(testnet.NATS(t)), ""), true)
	cl := bearerSession(t, a, iss, 2*time.Second, 60*time.Second)
	resp, err := cl.Do(t.Context(), "GET", "", nil)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("standalone GET: %v %v", err, resp)
	}
	begun := time.Now()
	evs := readPart(resp, 20*time.Second)
	if time.Since(begun) > 15*time.Second {
		t.Fatalf("the client's standalone stream stayed open %v after its token expired and the upstream closed its GET (events %d)", time.Since(begun), len(evs))
	}
	h := http.Header{}
	if len(evs) > 0 && evs[len(evs)-1].ID != "" {
		h.Set("Last-Event-Id", lastID(evs))
	}
	r, err := cl.Do(t.Context(), "GET", "", h)
	if err != nil {
		t.Fatal(err)
	}
	r.Body.Close()
	if r.StatusCode != http.StatusUnauthorized {
		t.Fatalf("the next standalone GET with the expired token: %d, want the upstream's 401", r.StatusCode)
	}
}

// The upstream answers 403 to everything the client's token carries from
// some point on (its grant revoked): no refresh can help. Before review
// 23's change the client's resume read the call's explicit failure (gap
// and -32010) at once; it must still read the call's end, at the latest
// once takeover_wait has passed, not 403s for ever.
func TestRefusedUpstream403ToEverythingStillEndsTheCall(t *testing.T) {
	t.Parallel()
	iss := mcptest.NewJWTIssuer("https://as.example.test")
	g := &authGate{}
	a, b := gatedReplicas(t, iss, g, "takeover_wait 5s", "")
	viaA, first := bearerCallThenKill(t, a, iss, time.Minute, 100)
	g.denyAll.Store(true)
	time.Sleep(3 * time.Second)
	viaB := clientOn(viaA, b)
	_, statuses, ended := resumeLikeAnSDK(t, viaB, lastID(first), nil, 15*time.Second, 500*time.Millisecond)
	if ended {
		t.Logf("statuses %v; the call ended", statuses)
		return
	}
	t.Fatalf("403 to everything: the client never read the call's end; resumes answered %v", statuses)
}

// Two connections of the session resume the same call on B at once with
// the expired token: B asks the upstream for the resume once, both are cut
// (neither hangs on a stream no one produces), and both then get the
// upstream's 401.
func TestRefusedTwoResumesAtOnceWithTheRefusedToken(t *testing.T) {
	t.Parallel()
	iss := mcptest.NewJWTIssuer("https://as.example.test")
	g := &authGate{}
	a, b := gatedReplicas(t, iss, g, "", "")
	viaA, first := bearerCallThenKill(t, a, iss, 3*time.Second, 100)
	time.Sleep(5 * time.Second)
	viaB := clientOn(viaA, b)
	type out struct {
		status int
		took   time.Duration
	}
	outs := make(chan out, 2)
	for range 2 {
		go func() {
			begun := time.Now()
			resp, err := viaB.Resume(t.Context(), lastID(first))
			if err != nil {
				outs <- out{}
				return
			}
			if resp.StatusCode == http.StatusOK {
				readPart(resp, 20*time.Second)
			} else {
				resp.Body.Close()
			}
			outs <- out{resp.StatusCode, time.Since(begun)}
		}()
	}
	for range 2 {
		o := <-outs
		if o.status != http.StatusOK && o.status != http.StatusUnauthorized {
			t.Errorf("a resume: %d", o.status)
		}
		if o.took > 15*time.Second {
			t.Errorf("a resume was not cut: open %v", o.took)
		}
	}
	for range 2 {
		r, err := viaB.Resume(t.Context(), lastID(first))
		if err != nil {
			t.Fatal(err)
		}
		r.Body.Close()
		if r.StatusCode != http.StatusUnauthorized {
			t.Errorf("a resume after the cut: %d, want 401", r.StatusCode)
		}
	}
	if n := g.resumeGETs.Load(); n != 1 {
		t.Errorf("upstream resume GETs %d, want 1", n)
	}
}

// The proxy's own reconnect (an upstream that closes the call's stream)
// carries the session's freshest credential: the client refreshed on a
// ping before its first token expired, so the reconnect after it expired
// is not refused and the call's own response goes on to the result, no
// cut, no 401.
func TestRefusedOwnReconnectCarriesTheFreshestToken(t *testing.T) {
	t.Parallel()
	iss := mcptest.NewJWTIssuer("https://as.example.test")
	g := &authGate{}
	d := upstreamBehind(t, g.wrap(iss))
	a := d.start("r1", storeNATS(natsURLs(testnet.NATS(t)), ""), true)
	cl := bearerSession(t, a, iss, 2*time.Second, 60*time.Second)
	const n = 10
	resp, err := cl.Call(t.Context(), 2, "count", map[string]any{"n": n, "interval_ms": 200, "close_after": 2, "retry_ms": 3500}, "p")
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("call: %v %v", err, resp)
	}
	fresh := cl.WithHeader(bearer(iss.Mint("alice", time.Minute)))
	pr, err := fresh.Do(t.Context(), "POST", `{"jsonrpc":"2.0","id":90,"method":"ping"}`, nil)
	if x := harness.MustFinish(t, pr, err); x.Status != http.StatusOK {
		t.Fatalf("ping with the refreshed token: %s", x)
	}
	wantCounted(t, "own reconnect after a refresh on a ping", n, readPart(resp, 20*time.Second))
	if strings.Contains(a.Logs(), "upstream refused the credential") {
		t.Errorf("the reconnect carried the expired token")
	}
}

// A 2025-06-18 client (no priming events) resumes at the head of the log
// with the expired token; B lets go of the read and cuts it. The cut must
// leave the client something to resume from (an event with an ID): SDK
// clients take a cut stream without one for the call lost (relay.cut).
func TestRefusedCutOfAnOlderVersionAtTheHead(t *testing.T) {
	t.Parallel()
	iss := mcptest.NewJWTIssuer("https://as.example.test")
	g := &authGate{}
	a, b := gatedReplicas(t, iss, g, "", "")
	c := mcptest.NewClient("http://"+a.addr(), "2025-06-18", &http.Client{Timeout: 30 * time.Second})
	c.Header = bearer(iss.Mint("alice", 3*time.Second))
	if err := c.Initialize(t.Context()); err != nil {
		t.Fatal(err)
	}
	resp, err := c.Call(t.Context(), 2, "count", map[string]any{"n": 100, "interval_ms": 300}, "p")
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("call: %v %v", err, resp)
	}
	first := readThenClose(t, resp, 3)
	a.Kill() // before its 4th step: the client read the head
	time.Sleep(5 * time.Second)
	viaB := clientOn(c, b)
	r, err := viaB.Resume(t.Context(), lastID(first))
	if err != nil || r.StatusCode != http.StatusOK {
		t.Fatalf("resume: %v %v", err, r)
	}
	evs := readPart(r, 15*time.Second)
	for _, ev := range evs {
		if ev.ID != "" {
			return
		}
	}
	_, result, errs := callEvents(t, evs, "2")
	t.Fatalf("2025-06-18, resumed at the head with the refused token: B cut the resume with no event ID in it (%d events, result %q, errors %q): an SDK client takes that for the call lost, where it read the explicit failure before",
		len(evs), result, errs)
}
