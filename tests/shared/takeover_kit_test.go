package shared

import (
	"fmt"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/internal/demoserver"
	"github.com/mcpresume/caddy-mcp-resume/internal/mcptest"
	"github.com/mcpresume/caddy-mcp-resume/internal/testnet"
	"github.com/mcpresume/caddy-mcp-resume/tests/harness"
	"github.com/nats-io/nats-server/v2/server"
)

// The steps the takeover tests share. Most of them run one sequence: a
// raw session on replica A calls count (request 2) and reads its first
// events; the client goes away and A is killed; lease_ttl (2s) later the
// client comes back on B with the same session and the last event ID it
// has, and reads the rest; the progress notifications of all it read come
// once each, in order, then the result. callEvents, takenOver,
// noEarlyEviction, series and waitProduced are in takeover_test.go.

// deployTakeover starts replicas sharing a NATS server of their own (the
// store block storeNATS with extra) in front of the demo server with its
// event store (the Go SDK's MemoryEventStore): an upstream a takeover can
// resume.
func deployTakeover(t *testing.T, replicas int, extra string) *deployment {
	t.Helper()
	ns := testnet.NATS(t)
	return deploy(t, replicas, storeNATS(natsURLs(ns), extra), demoserver.Options{EventStore: true})
}

// upstreamBehind is a deployment, no replica started yet, whose upstream
// is the demo server with its event store at /mcp behind wrap (bearer
// checks, a replay that resends events).
func upstreamBehind(t *testing.T, wrap func(http.Handler) http.Handler) *deployment {
	mux := http.NewServeMux()
	mux.Handle("/mcp", wrap(demoserver.New(demoserver.Options{EventStore: true})))
	return &deployment{t: t, upstream: harness.StartHandler(t, mux)}
}

// callOn opens a session on r and calls count there as request 2 (n
// progress notifications, one every intervalMS); it reads the response's
// first k events and closes it: the client is away.
func callOn(t *testing.T, r *replica, version string, n, intervalMS, k int) (*harness.RawClient, []mcptest.Event) {
	t.Helper()
	c := harness.NewSession(t, "http://"+r.addr(), version)
	resp := c.Call(2, "count", map[string]any{"n": n, "interval_ms": intervalMS})
	if resp.StatusCode != http.StatusOK {
		resp.Body.Close()
		t.Fatalf("call on %s: %d", r.name, resp.StatusCode)
	}
	return c, readThenClose(t, resp, k)
}

// callThenKill is callOn, then r is SIGKILLed: the call's producer dies
// while its client is away. Its lease lapses lease_ttl later.
func callThenKill(t *testing.T, r *replica, version string, n, intervalMS, k int) (*harness.RawClient, []mcptest.Event) {
	t.Helper()
	c, first := callOn(t, r, version, n, intervalMS, k)
	r.Kill()
	return c, first
}

// rawOn is a client of the session sid on r: the client come back on
// another replica.
func rawOn(t *testing.T, r *replica, version, sid string) *harness.RawClient {
	c := harness.NewRawClient(t, "http://"+r.addr(), version)
	c.SessionID = sid
	return c
}

// resume resumes the session sid on r from lastID (GET with
// Last-Event-ID) and returns the open response, as it is.
func resume(t *testing.T, r *replica, version, sid, lastID string) *http.Response {
	t.Helper()
	return rawOn(t, r, version, sid).Resume(lastID)
}

// readThenClose reads k events of resp (0: to its end) and closes it.
func readThenClose(t *testing.T, resp *http.Response, k int) []mcptest.Event {
	t.Helper()
	defer resp.Body.Close()
	return harness.ReadEvents(t, resp, k)
}

// lastID is the ID of the last of evs: the cursor a client resumes from.
func lastID(evs []mcptest.Event) string { return evs[len(evs)-1].ID }

// callParts splits the events a client read of request 2, in parts (one a
// connection), into the progress values of all the parts, in order, and
// the result's text and the JSON-RPC errors of the last part: the one the
// call ends on.
func callParts(t *testing.T, parts ...[]mcptest.Event) (progress []float64, result string, errs []string) {
	t.Helper()
	for _, evs := range parts {
		p, r, e := callEvents(t, evs, "2")
		progress, result, errs = append(progress, p...), r, e
	}
	return progress, result, errs
}

// wantCounted fails the test unless request 2, read in parts, ended with
// count's result for n and no error, after its n progress notifications
// once each, in order. what names the call in the failure.
func wantCounted(t *testing.T, what string, n int, parts ...[]mcptest.Event) {
	t.Helper()
	progress, result, errs := callParts(t, parts...)
	if len(errs) > 0 || result != fmt.Sprintf("counted to %d", n) {
		t.Fatalf("%s: result %q, errors %q after %d progress notifications", what, result, errs, len(progress))
	}
	if err := mcptest.OnceInOrder(progress, n); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// takeoverLines counts the "request stream taken over" lines r logged.
func takeoverLines(r *replica) int {
	return strings.Count(r.Logs(), `"request stream taken over"`)
}

// bearer is the Authorization header of the bearer token tok.
func bearer(tok string) http.Header { return http.Header{"Authorization": {"Bearer " + tok}} }

// bearerReplicas starts two replicas sharing a NATS server of their own
// in front of the demo server with its event store, behind bearer
// middleware that verifies iss's tokens.
func bearerReplicas(t *testing.T, iss *mcptest.JWTIssuer) (a, b *replica) {
	t.Helper()
	ns := testnet.NATS(t)
	d := upstreamBehind(t, iss.Protect)
	store := storeNATS(natsURLs(ns), "")
	return d.start("r1", store, true), d.start("r2", store, true)
}

// bearerSession opens a session on r as alice, with a token of iss that
// expires after ttl, through a client whose requests time out after
// timeout.
func bearerSession(t *testing.T, r *replica, iss *mcptest.JWTIssuer, ttl, timeout time.Duration) *mcptest.Client {
	t.Helper()
	c := mcptest.NewClient("http://"+r.addr(), "2025-11-25", &http.Client{Timeout: timeout})
	c.Header = bearer(iss.Mint("alice", ttl))
	if err := c.Initialize(t.Context()); err != nil {
		t.Fatal(err)
	}
	return c
}

// bearerCallThenKill opens a bearerSession on r and calls count there as
// request 2 (n progress notifications, one every 300 ms); it reads the
// priming event and three progress notifications, closes the response
// and SIGKILLs r.
func bearerCallThenKill(t *testing.T, r *replica, iss *mcptest.JWTIssuer, ttl time.Duration, n int) (*mcptest.Client, []mcptest.Event) {
	t.Helper()
	c := bearerSession(t, r, iss, ttl, 30*time.Second)
	resp, err := c.Call(t.Context(), 2, "count", map[string]any{"n": n, "interval_ms": 300}, "p")
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("call: %v %v", err, resp)
	}
	first := readThenClose(t, resp, 4)
	r.Kill()
	return c, first
}

// clientOn is a copy of c (session, headers) that sends to r.
func clientOn(c *mcptest.Client, r *replica) *mcptest.Client {
	d := *c
	d.URL = "http://" + r.addr() + "/mcp"
	return &d
}

// countThrough calls count (n progress notifications, one every
// intervalMS) with the SDK client c while what c.After runs (done) kills,
// stops or freezes a replica: it checks the result, waits for done, and
// checks every progress notification came once, in order.
func countThrough(t *testing.T, c *mcptest.SDKClient, n, intervalMS int, done <-chan int) {
	t.Helper()
	if got := callCount(t, c, n, intervalMS); got != fmt.Sprintf("counted to %d", n) {
		t.Fatalf("result %q", got)
	}
	<-done
	assertOnceInOrder(t, c, n)
}

// deployCutOff is deployTakeover of two replicas, A and B, but A reaches
// NATS through relay (natsRelay), which cuts A alone off; the load
// balancer sends to A. real is the address of the NATS server.
func deployCutOff(t *testing.T) (d *deployment, relay *mcptest.Relay, real string) {
	t.Helper()
	ns := testnet.NATS(t)
	relay, real = natsRelay(t, ns)
	d = &deployment{t: t, upstream: harness.StartDemo(t, demoserver.Options{EventStore: true})}
	d.replicas = []*replica{
		d.start("r1", storeNATS([]string{"nats://" + relay.Addr()}, ""), true),
		d.start("r2", storeNATS(natsURLs(ns), ""), true),
	}
	lb, err := mcptest.NewRelay(d.replicas[0].addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lb.Close() })
	d.lb = lb
	return d, relay, real
}

// natsRelay is a relay to ns: a replica whose store URL is the relay's is
// cut off from NATS by cutOffFromNATS. real is the address of ns it
// relays to.
func natsRelay(t *testing.T, ns *server.Server) (relay *mcptest.Relay, real string) {
	t.Helper()
	real = strings.TrimPrefix(ns.ClientURL(), "nats://")
	relay, err := mcptest.NewRelay(real)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { relay.Close() })
	return relay, real
}

// cutOffFromNATS cuts r's connections through relay and keeps r from NATS
// for three lease_ttl (from when r's store is down), then lets the relay
// reach real again.
func cutOffFromNATS(t *testing.T, relay *mcptest.Relay, real string, r *replica) {
	t.Helper()
	relay.SetTarget("127.0.0.1:1")
	if relay.Cut(true) == 0 {
		t.Fatal("the relay cut no NATS connection")
	}
	r.waitStoreUp(t, 0)
	time.Sleep(6 * time.Second) // 3 x lease_ttl (2s)
	relay.SetTarget(real)
}

// openBug skips a test that reproduces a known, open bug (what it shows
// says why), unless MCPR_OPEN_BUGS=1 asks for the open bugs to be run:
// `MCPR_OPEN_BUGS=1 go test -race -run TestName ./tests/shared` reproduces
// one. The suite stays green while the bug is open; the test runs as soon
// as the bug is fixed and its call is removed.
func openBug(t *testing.T, issue int, what string) {
	t.Helper()
	if os.Getenv("MCPR_OPEN_BUGS") != "1" {
		t.Skipf("open bug of issue %d, reproduced with MCPR_OPEN_BUGS=1: %s", issue, what)
	}
}
