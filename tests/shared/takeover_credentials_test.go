package shared

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/internal/mcptest"
	"github.com/mcpresume/caddy-mcp-resume/internal/testnet"
	"github.com/mcpresume/caddy-mcp-resume/tests/harness"
)

// The credentials a takeover's upstream GET carries (issue 22): the store
// keeps no token, so the GET carries one a client of the session brought.
// TestTakeoverCarriesTheResumingClientsToken is in takeover_test.go.

// The producer dies mid call; the client's token expired meanwhile, and
// the client does not know it yet (SDK clients refresh on a 401): it
// resumes on B with the token the session is bound to, which the proxy
// answers from the log without asking the upstream (README, bind bearer).
// B's takeover GET carries that expired token: the upstream's 401 must
// not end the call for good (the client never sees the 401 that would make
// it refresh). Either the resume is answered with the 401 (the client
// refreshes and resumes again, and B takes over with the fresh token), or
// the call goes on: every progress notification once, and the result.
func TestTakeoverWithAnExpiredTokenLetsTheClientRefresh(t *testing.T) {
	t.Parallel()
	openBug(t, 22, "the upstream's 401 to a takeover GET with the bound, expired token fails the call for good")
	iss := mcptest.NewJWTIssuer("https://as.example.test")
	a, b := bearerReplicas(t, iss)
	const n = 25
	viaA, first := bearerCallThenKill(t, a, iss, 3*time.Second, n)
	time.Sleep(5 * time.Second) // the token expired; the lease lapsed

	ctx := t.Context()
	viaB := clientOn(viaA, b)
	resp, err := viaB.Resume(ctx, lastID(first)) // the expired token: the client does not know yet
	if err != nil {
		t.Fatal(err)
	}
	refreshed := false
	if resp.StatusCode == http.StatusUnauthorized {
		resp.Body.Close()
		refreshed = true
		viaB.Header = bearer(iss.Mint("alice", time.Minute))
		if resp, err = viaB.Resume(ctx, lastID(first)); err != nil {
			t.Fatal(err)
		}
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("resume on B: %d (refreshed: %v)", resp.StatusCode, refreshed)
	}
	rest := readThenClose(t, resp, 0)
	progress, result, errs := callParts(t, first, rest)
	if len(errs) > 0 || result != fmt.Sprintf("counted to %d", n) {
		t.Fatalf("resume with the token the session is bound to, expired (refreshed after a 401: %v): result %q, errors %q; "+
			"B's takeovers refused %v (the upstream's 401 to the takeover's GET ended the call; the client never got it to refresh)",
			refreshed, result, errs, series(t, b, `caddy_mcp_resume_takeovers_total{outcome="refused"}`))
	}
	if err := mcptest.OnceInOrder(progress, n); err != nil {
		t.Fatal(err)
	}
}

// The only replica is cut off from NATS while a call runs and its client
// stays connected; the token the call began with expires during the cut,
// but the client brought a refreshed one (same subject) on a request of
// the session before it expired. Back, the replica takes its own call back
// (TestTakeoverByTheSameReplicaAfterAPartition): its GET must carry the
// freshest credential a client of the session brought (issue 22, item 2),
// not the call's first POST's expired one, or the upstream's 401 fails a
// call that could go on.
func TestTakeoverByTheSameReplicaUsesTheSessionsFreshestToken(t *testing.T) {
	t.Parallel()
	ns := testnet.NATS(t)
	relay, real := natsRelay(t, ns)
	iss := mcptest.NewJWTIssuer("https://as.example.test")
	d := upstreamBehind(t, iss.Protect)
	a := d.start("r1", storeNATS([]string{"nats://" + relay.Addr()}, ""), true)

	const n = 40
	cl := bearerSession(t, a, iss, 3*time.Second, 60*time.Second)
	ctx := t.Context()
	resp, err := cl.Call(ctx, 2, "count", map[string]any{"n": n, "interval_ms": 250}, "p")
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("call: %v %v", err, resp)
	}
	defer resp.Body.Close()
	first := harness.ReadEvents(t, resp, 3)
	// The client refreshes its token and uses it on the session (a ping).
	fresh := cl.WithHeader(bearer(iss.Mint("alice", time.Minute)))
	pr, err := fresh.Do(ctx, "POST", `{"jsonrpc":"2.0","id":90,"method":"ping"}`, nil)
	x := harness.MustFinish(t, pr, err)
	if x.Status != http.StatusOK {
		t.Fatalf("ping with the refreshed token: %s", x)
	}
	cutOffFromNATS(t, relay, real, a) // the call's first token expires meanwhile

	rest := harness.ReadEvents(t, resp, 0)
	progress, result, errs := callParts(t, first, rest)
	if len(errs) > 0 || result != fmt.Sprintf("counted to %d", n) {
		t.Fatalf("the call taken back after the cut: result %q, errors %q; takeovers refused %v (the takeover's GET carried the call's first, expired token, not the refreshed one the session is bound to now)",
			result, errs, series(t, a, `caddy_mcp_resume_takeovers_total{outcome="refused"}`))
	}
	if err := mcptest.OnceInOrder(progress, n); err != nil {
		t.Fatal(err)
	}
}
