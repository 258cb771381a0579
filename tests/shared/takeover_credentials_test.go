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
// B's takeover GET carries that expired token, and the upstream refuses
// it: that must not end the call for good (the client never saw a 401 to
// make it refresh). B lets the read go, cuts the client (which resumes,
// as SDK clients do on a cut), answers its next resume with the upstream's
// own 401, and once the client refreshed, takes the call over with the
// new token: every progress notification once, and the result.
func TestTakeoverWithAnExpiredTokenLetsTheClientRefresh(t *testing.T) {
	t.Parallel()
	iss := mcptest.NewJWTIssuer("https://as.example.test")
	a, b := bearerReplicas(t, iss)
	const n = 25
	viaA, first := bearerCallThenKill(t, a, iss, 3*time.Second, n)
	time.Sleep(5 * time.Second) // the token expired; the lease lapsed

	ctx := t.Context()
	viaB := clientOn(viaA, b) // the expired token: the client does not know yet
	parts, last, refreshed := [][]mcptest.Event{first}, lastID(first), 0
	var statuses []int
	for {
		if len(statuses) == 6 {
			t.Fatalf("no result after resumes answered %v (refreshed %d times)", statuses, refreshed)
		}
		resp, err := viaB.Resume(ctx, last)
		if err != nil {
			t.Fatal(err)
		}
		statuses = append(statuses, resp.StatusCode)
		if resp.StatusCode == http.StatusUnauthorized {
			if resp.Header.Get("WWW-Authenticate") == "" {
				t.Errorf("the 401 has no WWW-Authenticate: it is not the upstream's")
			}
			resp.Body.Close()
			refreshed++
			viaB.Header = bearer(iss.Mint("alice", time.Minute))
			continue
		}
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("resume on B: %d (statuses %v)", resp.StatusCode, statuses)
		}
		evs, _ := mcptest.ReadEvents(resp.Body, 0, 20*time.Second) // a cut ends it with an error
		resp.Body.Close()
		parts = append(parts, evs)
		if _, result, errs := callEvents(t, evs, "2"); result != "" || len(errs) > 0 {
			break
		}
		if len(evs) > 0 {
			last = lastID(evs)
		}
	}
	t.Logf("resumes answered %v", statuses)
	progress, result, errs := callParts(t, parts...)
	if len(errs) > 0 || result != fmt.Sprintf("counted to %d", n) {
		t.Fatalf("resume with the token the session is bound to, expired (statuses %v): result %q, errors %q; "+
			"B's takeovers refused %v, credential_refused %v", statuses, result, errs,
			series(t, b, `caddy_mcp_resume_takeovers_total{outcome="refused"}`),
			series(t, b, `caddy_mcp_resume_takeovers_total{outcome="credential_refused"}`))
	}
	if refreshed != 1 {
		t.Fatalf("the client refreshed %d times (statuses %v), want once: after the upstream's 401", refreshed, statuses)
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
