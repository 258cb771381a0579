package shared

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/internal/demoserver"
	"github.com/mcpresume/caddy-mcp-resume/internal/mcptest"
	"github.com/mcpresume/caddy-mcp-resume/internal/testnet"
	"github.com/mcpresume/caddy-mcp-resume/tests/harness"
)

// Review 32: attacks on adef03e (a session the store could not read gets
// 503; a serving path that finds a session authorization did not see
// authorizes again) and 5b258de (tallies newer by KV revision).

// aliceWithNotices opens alice's session on r (JWT upstream), reads six
// notices of its standalone stream, and returns the client and notices.
func aliceWithNotices(t *testing.T, r *replica, iss *mcptest.JWTIssuer) (*mcptest.Client, []mcptest.Event) {
	t.Helper()
	alice := bearerSession(t, r, iss, 10*time.Minute, 60*time.Second)
	ctx := t.Context()
	g, err := alice.Do(ctx, "GET", "", nil)
	if err != nil || g.StatusCode != http.StatusOK {
		t.Fatalf("alice's GET: %v %v", err, g)
	}
	resp, err := alice.Call(ctx, 2, "notify", map[string]any{"n": 6, "interval_ms": 50}, "")
	if err != nil {
		t.Fatal(err)
	}
	harness.ReadEvents(t, resp, 0)
	resp.Body.Close()
	var notices []mcptest.Event
	for len(notices) < 6 {
		evs, err := mcptest.ReadEvents(g.Body, 1, 10*time.Second)
		if err != nil {
			t.Fatalf("alice's notices: %v (%d)", err, len(notices))
		}
		if strings.Contains(evs[0].Data, "notice") {
			notices = append(notices, evs[0])
		}
	}
	g.Body.Close()
	return alice, notices
}

// Attack 1. alice's session lives on r1; r2 (never served it) reaches NATS
// through a relay, which is cut. While cut: mallory's valid token, alice's
// expired token, no token, and alice's own valid token (and a rotated one)
// send on r2 a resume with alice's cursor, a standalone GET, a ping, a
// tools/call and a DELETE. Nothing may be served or run for the others
// (503, 401, 403 only); alice gets 503 with Retry-After and a JSON-RPC
// error. Then NATS comes back: the others get 401/403, never the log;
// alice's 503 ends within a few seconds of store_up 1 and her resume on
// r2 gets the notices she missed, with her old and her rotated token.
func TestReview32SecondCredentialWhileCutAndAfter(t *testing.T) {
	ns := testnet.NATS(t)
	relay, real := natsRelay(t, ns)
	iss := mcptest.NewJWTIssuer("https://as.example.test")
	d := upstreamBehind(t, iss.Protect)
	r1 := d.start("r1", storeNATS(natsURLs(ns), ""), true)
	r2 := d.start("r2", storeNATS([]string{"nats://" + relay.Addr()}, ""), true)
	alice, notices := aliceWithNotices(t, r1, iss)
	cursor := notices[0].ID

	others := map[string]http.Header{
		"mallory":       bearer(iss.Mint("mallory", time.Hour)),
		"alice-expired": bearer(iss.Mint("alice", -time.Second)),
		"none":          {"Authorization": nil},
	}
	owners := map[string]http.Header{
		"alice":         alice.Header,
		"alice-rotated": bearer(iss.Mint("alice", time.Hour)),
	}
	var mu sync.Mutex
	var bad []string
	stats := map[string]map[int]int{}
	note := func(phase, who, what string, code int, body string, hdr http.Header, ok func(int, string, http.Header) bool) {
		mu.Lock()
		defer mu.Unlock()
		k := phase + " " + who + " " + what
		if stats[k] == nil {
			stats[k] = map[int]int{}
		}
		stats[k][code]++
		if !ok(code, body, hdr) && len(bad) < 40 {
			bad = append(bad, fmt.Sprintf("%s: %d %q", k, code, trunc(body, 300)))
		}
	}
	leak := func(body string) bool {
		return strings.Contains(body, "notice") || strings.Contains(body, "progress") || strings.Contains(body, "event:")
	}
	refused := func(code int, body string, _ http.Header) bool {
		return (code == 401 || code == 403 || code == 503) && !leak(body)
	}
	refusedUp := func(code int, body string, _ http.Header) bool {
		return (code == 401 || code == 403) && !leak(body)
	}
	unavailable := func(code int, body string, h http.Header) bool {
		return code == 503 && r30RPCError(body) && h.Get("Retry-After") != ""
	}
	type req struct {
		what, method, body string
		extra              http.Header
	}
	reqs := []req{
		{"resume", "GET", "", http.Header{"Last-Event-ID": {cursor}}},
		{"standalone GET", "GET", "", nil},
		{"ping", "POST", `{"jsonrpc":"2.0","id":77,"method":"ping"}`, nil},
		{"call", "POST", mcptest.CallBody(78, "count", map[string]any{"n": 2, "interval_ms": 10}, "q"), nil},
		{"DELETE", "DELETE", "", nil},
	}
	round := func(phase string, creds map[string]http.Header, ok func(int, string, http.Header) bool, skipDelete bool) {
		var wg sync.WaitGroup
		for who, h := range creds {
			for _, q := range reqs {
				if skipDelete && q.method == "DELETE" {
					continue
				}
				wg.Add(1)
				go func() {
					defer wg.Done()
					c := clientOn(alice, r2).WithHeader(h)
					code, body, hdr := r30Status(c, q.method, q.body, q.extra)
					note(phase, who, q.what, code, body, hdr, ok)
				}()
			}
		}
		wg.Wait()
	}

	relay.SetTarget("127.0.0.1:1")
	relay.Cut(true)
	// At once (the store may not know yet), then once it is down.
	round("cut-early", others, refused, false)
	r2.waitStoreUp(t, 0)
	round("cut", others, refused, false)
	round("cut-owner", owners, func(code int, body string, h http.Header) bool {
		return unavailable(code, body, h)
	}, true)
	relay.SetTarget(real)
	// Right after: the attackers race the reconnection.
	round("back-early", others, refused, false)
	r2.waitStoreUp(t, 1)
	up := time.Now()
	round("back", others, refusedUp, false)
	// alice's 503 must end.
	for who, h := range owners {
		var got []mcptest.Event
		var last string
		for time.Since(up) < 15*time.Second {
			c := clientOn(alice, r2).WithHeader(h)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			resp, err := c.Resume(ctx, cursor)
			if err != nil {
				last = err.Error()
				cancel()
				time.Sleep(200 * time.Millisecond)
				continue
			}
			if resp.StatusCode != http.StatusOK {
				last = fmt.Sprint(resp.StatusCode)
				resp.Body.Close()
				cancel()
				time.Sleep(200 * time.Millisecond)
				continue
			}
			got, _ = mcptest.ReadResumed(resp.Body, cursor, 5, 5*time.Second)
			resp.Body.Close()
			cancel()
			break
		}
		n := 0
		for _, ev := range got {
			if strings.Contains(ev.Data, "notice") {
				n++
			}
		}
		t.Logf("%s's resume on r2 after NATS came back: %d notices, %v after store_up 1 (last failure %s)", who, n, time.Since(up), last)
		if n != 5 {
			t.Errorf("%s locked out of her session on r2 after NATS came back: %d of 5 notices (last failure %s)", who, n, last)
		}
	}
	if code, body, _ := r30Status(clientOn(alice, r1), "POST", `{"jsonrpc":"2.0","id":90,"method":"ping"}`, nil); code != 200 {
		t.Errorf("alice's session after the attacks: ping %d %s", code, trunc(body, 200))
	}
	for k, m := range stats {
		t.Logf("%s: %v", k, m)
	}
	for _, b := range bad {
		t.Error(b)
	}
}

// Attack 2. max_sessions 6, three replicas, the zone full. NATS restarts
// with an empty store directory (data lost): every replica recreates the
// zone at its own moment (zone.reset: revision and poll forgotten). One
// client makes sessions one at a time, round-robin across the replicas,
// from the restart on: the zone, now empty, must take the bound again
// (nobody locked out) and no more than one over it (README's slack is for
// concurrent initializes only). A replica's first tally reading after its
// reset is taken as made "now" (tally.go readTally, polled == 0): its
// creations between its reset and that reading are no longer counted.
func TestReview32TallyAfterDataLossOneAtATime(t *testing.T) {
	const bound = 6
	n := r27NATS(t, t.TempDir())
	d := &deployment{t: t, upstream: harness.StartDemo(t, demoserver.Options{})}
	for i := 0; i < 3; i++ {
		d.replicas = append(d.replicas, d.start(fmt.Sprintf("r%d", i+1), storeNATS([]string{n.url}, "")+fmt.Sprintf("\nmax_sessions %d", bound), true))
	}
	rs := d.replicas
	initOn := func(r *replica, timeout time.Duration) (bool, error) {
		c := mcptest.NewClient("http://"+r.addr(), "2025-11-25", &http.Client{Timeout: timeout})
		err := c.Initialize(t.Context())
		if err == nil {
			return true, nil
		}
		if strings.Contains(err.Error(), "initialize: 503") {
			return false, nil
		}
		return false, err
	}
	for i := 0; i < bound; i++ {
		if ok, err := initOn(rs[i%3], 10*time.Second); !ok {
			t.Fatalf("filling: %v", err)
		}
	}
	time.Sleep(6 * time.Second) // a scan published the full count
	if ok, _ := initOn(rs[1], 10*time.Second); ok {
		t.Fatalf("a 7th session admitted before the loss")
	}
	n.restart(t, t.TempDir(), 500*time.Millisecond)
	restarted := time.Now()
	stop := make(chan struct{})
	var admitted [3]int
	var firstAdmit [3]time.Duration
	var errs int
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			k := i % 3
			ok, err := initOn(rs[k], 3*time.Second)
			if ok {
				if admitted[k] == 0 {
					firstAdmit[k] = time.Since(restarted)
				}
				admitted[k]++
			} else if err != nil {
				errs++
			}
		}
	}()
	for _, r := range rs {
		harness.WaitFor(t, 60*time.Second, "replica "+r.name+" to count the lost data", func() bool {
			m, err := mcptest.ScrapeMetrics(r.admin() + "/metrics")
			if err != nil {
				return false
			}
			v, _ := m.Sum("caddy_mcp_resume_store_data_lost_total")
			return v >= 1
		})
	}
	recovered := time.Since(restarted)
	time.Sleep(12 * time.Second) // two scans past the last recovery
	close(stop)
	<-done
	total := admitted[0] + admitted[1] + admitted[2]
	ss, err := mcptest.Sessions(rs[0].admin())
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("all recovered %v after the restart; admitted one at a time %v (first at %v), %d failed otherwise; zone holds %d",
		recovered, admitted, firstAdmit, errs, len(ss))
	if total > bound+1 {
		t.Errorf("max_sessions %d after NATS lost its data: %d sessions admitted one at a time (per replica %v)", bound, total, admitted)
	}
	if total < bound {
		t.Errorf("max_sessions %d after NATS lost its data: only %d admitted into an empty zone (locked out)", bound, total)
	}
}
