package shared

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/mcpresume/caddy-mcp-resume/internal/demoserver"
	"github.com/mcpresume/caddy-mcp-resume/internal/mcptest"
	"github.com/mcpresume/caddy-mcp-resume/internal/testnet"
	"github.com/mcpresume/caddy-mcp-resume/tests/harness"
)

// Review 30: attacks on the scan / orphan / interest split (every replica
// sweeps what it serves; the sweeper lease holder scans the zone), on real
// Caddy processes, a real nats-server, the demo MCP server and raw or SDK
// clients.

const r30Prefix = "mcpr_default"

// r30KV opens the zone's KV buckets on ns, read-only use by the test.
func r30KV(t *testing.T, ns *server.Server) jetstream.JetStream {
	t.Helper()
	nc, err := nats.Connect(ns.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return js
}

func r30Token(id string) string {
	h := sha256.Sum256([]byte(id))
	return hex.EncodeToString(h[:])[:32]
}

// r30Sweeper is the replica ID holding the sweeper lease ("" if none).
func r30Sweeper(js jetstream.JetStream) string {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	kv, err := js.KeyValue(ctx, r30Prefix+"_META")
	if err != nil {
		return ""
	}
	e, err := kv.Get(ctx, "sweeper")
	if err != nil {
		return ""
	}
	var l struct {
		Replica string `json:"replica"`
	}
	json.Unmarshal(e.Value(), &l)
	return l.Replica
}

// r30LeaseHolder is the replica ID holding a lease of session sid's request
// streams ("" if none).
func r30LeaseHolder(js jetstream.JetStream, sid string) string {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	kv, err := js.KeyValue(ctx, r30Prefix+"_LEASES")
	if err != nil {
		return ""
	}
	w, err := kv.Watch(ctx, r30Token(sid)+".*.*", jetstream.IgnoreDeletes())
	if err != nil {
		return ""
	}
	defer w.Stop()
	holder := ""
	for e := range w.Updates() {
		if e == nil {
			break
		}
		if strings.HasSuffix(e.Key(), ".0") {
			continue
		}
		var l struct {
			Replica string `json:"replica"`
		}
		json.Unmarshal(e.Value(), &l)
		holder = l.Replica
	}
	return holder
}

// r30IDs maps each replica's store ID to the replica: a short call on
// each, whose lease names it.
func r30IDs(t *testing.T, js jetstream.JetStream, rs []*replica) map[string]*replica {
	t.Helper()
	out := make(map[string]*replica)
	for _, r := range rs {
		c := harness.NewSession(t, "http://"+r.addr(), "2025-11-25")
		resp := c.Call(2, "count", map[string]any{"n": 6, "interval_ms": 200})
		harness.ReadEvents(t, resp, 2)
		id := ""
		harness.WaitFor(t, 5*time.Second, "a lease of "+r.name, func() bool {
			id = r30LeaseHolder(js, c.SessionID)
			return id != ""
		})
		harness.ReadEvents(t, resp, 0)
		resp.Body.Close()
		out[id] = r
	}
	return out
}

// r30Outcome is how a client's following of request 2 ended.
type r30Outcome struct {
	parts    [][]mcptest.Event
	statuses []int
	hang     string
}

// r30Follow resumes session sid from last on the replicas pick gives (a
// live one), again after every cut, as an SDK client does, until request 2
// has its result or an error, the resume says 204, or deadline. A resume
// that delivers nothing and does not end in 20 s is a hang.
func r30Follow(t *testing.T, sid, last string, first []mcptest.Event, pick func(i int) *replica, deadline time.Duration) r30Outcome {
	var o r30Outcome
	o.parts = append(o.parts, first)
	stop := time.Now().Add(deadline)
	for i := 0; time.Now().Before(stop); i++ {
		r := pick(i)
		if r == nil {
			time.Sleep(200 * time.Millisecond)
			continue
		}
		c := mcptest.NewClient("http://"+r.addr(), "2025-11-25", &http.Client{})
		c.SessionID = sid
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		resp, err := c.Resume(ctx, last)
		if err != nil {
			cancel()
			time.Sleep(200 * time.Millisecond)
			continue
		}
		o.statuses = append(o.statuses, resp.StatusCode)
		if resp.StatusCode == http.StatusNoContent {
			resp.Body.Close()
			cancel()
			return o
		}
		if resp.StatusCode != http.StatusOK {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			cancel()
			o.hang = fmt.Sprintf("resume on %s: %d %s", r.name, resp.StatusCode, b)
			return o
		}
		evs, rerr := mcptest.ReadEvents(resp.Body, 0, 20*time.Second)
		resp.Body.Close()
		cancel()
		o.parts = append(o.parts, evs)
		_, result, errs := callEvents(t, evs, "2")
		if result != "" || len(errs) > 0 {
			return o
		}
		if len(evs) > 0 {
			last = lastID(evs)
		}
		if rerr != nil && strings.Contains(rerr.Error(), "timed out") && len(evs) == 0 {
			o.hang = fmt.Sprintf("resume on %s from %s: nothing for 20 s", r.name, last)
			return o
		}
		if rerr == nil {
			// The stream's body ended without the call's end: resume again.
			continue
		}
	}
	o.hang = fmt.Sprintf("no end within %v (statuses %v)", deadline, o.statuses)
	return o
}

// r30Alive is the first live replica of rs, from offset i.
func r30Alive(rs []*replica, i int) *replica {
	for k := range rs {
		r := rs[(i+k)%len(rs)]
		if !r.Exited() {
			return r
		}
	}
	return nil
}

// Attack 1. Four replicas, takeover_wait 5s. Calls produced on r1 (the
// sweeper) and r2; both SIGKILLed together while their clients are away.
// One client comes back to r3 at once (before the leases lapse), one to r4
// about when the new sweeper's first scan runs; then the new sweeper is
// SIGKILLed during the takeover wait (the lease moves again); one client
// comes back to the last replica after that. The others never come back:
// their streams must be failed (never left live for good). Every client
// that comes back (or resumes after the failure) gets either the result
// or an explicit failure, each progress once, in order, never a hang.
func TestReview30OrphansAcrossSweeperMoves(t *testing.T) {
	ns := testnet.NATS(t)
	js := r30KV(t, ns)
	d := deploy(t, 4, storeNATS(natsURLs(ns), "takeover_wait 5s"), demoserver.Options{EventStore: true})
	r1, r2, r3, r4 := d.replicas[0], d.replicas[1], d.replicas[2], d.replicas[3]
	ids := r30IDs(t, js, d.replicas)
	if s := ids[r30Sweeper(js)]; s != r1 {
		t.Logf("sweeper at start: %v", s)
	}
	for i := 0; i < 40; i++ { // idle sessions: a scan has some work
		harness.NewSession(t, "http://"+d.replicas[2+i%2].addr(), "2025-11-25")
	}
	type call struct {
		name  string
		sid   string
		first []mcptest.Event
	}
	const n = 75 // 15 s at 200 ms
	var calls []call
	for _, p := range []*replica{r1, r2} {
		for k := 0; k < 4; k++ {
			c, first := callOn(t, p, "2025-11-25", n, 200, 3)
			calls = append(calls, call{fmt.Sprintf("%s#%d", p.name, k), c.SessionID, first})
		}
	}
	r1.Kill()
	r2.Kill()
	killed := time.Now()

	var wg sync.WaitGroup
	outcomes := make([]r30Outcome, len(calls))
	follow := func(i int, after time.Duration, order []*replica) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			time.Sleep(time.Until(killed.Add(after)))
			outcomes[i] = r30Follow(t, calls[i].sid, lastID(calls[i].first), calls[i].first,
				func(k int) *replica { return r30Alive(order, k) }, 90*time.Second)
		}()
	}
	follow(0, 0, []*replica{r3, r4})                     // r1's call, at once, to r3
	follow(4, 2500*time.Millisecond, []*replica{r4, r3}) // r2's call, around the new sweeper's first scan, to r4
	follow(5, 3300*time.Millisecond, []*replica{r3, r4})
	// The new sweeper, killed during the takeover wait.
	var sweeper *replica
	harness.WaitFor(t, 10*time.Second, "a new sweeper", func() bool {
		sweeper = ids[r30Sweeper(js)]
		return sweeper == r3 || sweeper == r4
	})
	t.Logf("new sweeper %s after %v", sweeper.name, time.Since(killed))
	time.Sleep(time.Until(killed.Add(6 * time.Second)))
	sweeper.Kill()
	t.Logf("%s killed at %v", sweeper.name, time.Since(killed))
	last := r3
	if sweeper == r3 {
		last = r4
	}
	follow(1, 10*time.Second, []*replica{last}) // after the lease moved, within a wait counted afresh
	// Calls 2, 3, 6, 7: no client comes back. They must be failed.
	start := time.Now()
	failedAll := false
	for time.Since(start) < 60*time.Second && !failedAll {
		failedAll = true
		for _, i := range []int{2, 3, 6, 7} {
			s, ok, err := mcptest.Session(last.admin(), calls[i].sid)
			if err != nil || !ok {
				failedAll = false
				continue
			}
			for _, st := range s.Streams {
				if st.Num == 1 && st.State == "live" {
					failedAll = false
				}
			}
		}
		if !failedAll {
			time.Sleep(500 * time.Millisecond)
		}
	}
	if !failedAll {
		for _, i := range []int{2, 3, 6, 7} {
			s, ok, err := mcptest.Session(last.admin(), calls[i].sid)
			t.Logf("%s: %+v %v %v", calls[i].name, s.Streams, ok, err)
		}
		t.Errorf("orphans with no client still live %v after the kills (takeover_wait 5s)", time.Since(killed))
	} else {
		t.Logf("orphans failed %v after the kills", time.Since(killed))
	}
	for _, i := range []int{2, 6} {
		follow(i, time.Since(killed), []*replica{last})
	}
	wg.Wait()
	for i, o := range outcomes {
		if o.parts == nil {
			continue
		}
		progress, result, errs := callParts(t, o.parts...)
		t.Logf("%s: statuses %v, %d progress, result %q, errors %q, hang %q", calls[i].name, o.statuses, len(progress), result, errs, o.hang)
		if o.hang != "" {
			t.Errorf("%s: %s", calls[i].name, o.hang)
			continue
		}
		if err := mcptest.OnceInOrder(progress, len(progress)); err != nil {
			t.Errorf("%s: %v", calls[i].name, err)
		}
		if result == "" && len(errs) == 0 {
			t.Errorf("%s: neither result nor error", calls[i].name)
		}
		if result != "" && len(progress) != n {
			t.Errorf("%s: result after %d of %d progress", calls[i].name, len(progress), n)
		}
	}
}

// r30Status sends a request and returns its status and body (0: failed).
func r30Status(c *mcptest.Client, method, body string, extra http.Header) (int, string, http.Header) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := c.Do(ctx, method, body, extra)
	if err != nil {
		return 0, err.Error(), nil
	}
	defer resp.Body.Close()
	// An SSE answer is read for a moment only (it would stay open).
	var b []byte
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		evs, _ := mcptest.ReadEvents(resp.Body, 1, 700*time.Millisecond)
		for _, ev := range evs {
			b = append(b, []byte("event:"+ev.Type+" id:"+ev.ID+" data:"+ev.Data+"\n")...)
		}
	} else {
		b, _ = io.ReadAll(io.LimitReader(resp.Body, 4096))
	}
	return resp.StatusCode, string(b), resp.Header
}

// r30RPCError reports whether body is a JSON-RPC error object.
func r30RPCError(body string) bool {
	var m struct {
		JSONRPC string `json:"jsonrpc"`
		Error   *struct {
			Code    *int   `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
	}
	return json.Unmarshal([]byte(body), &m) == nil && m.JSONRPC == "2.0" && m.Error != nil && m.Error.Code != nil
}

// Attack 2. Hostile requests on three replicas for ~14 s (three scans),
// while sessions are created and deleted concurrently and a call runs:
// malformed, huge, foreign and other sessions' cursors, GETs without a
// session, unknown sessions, DELETEs of unknown and of just-deleted
// sessions, two session headers. None may be a 5xx, a cursor error must be
// a 400 with a JSON-RPC body, and nothing live may be cleared: the call's
// client gets every event once and the result, every kept session still
// answers pings and is listed.
func TestReview30HostileInputDuringScans(t *testing.T) {
	ns := testnet.NATS(t)
	d := deploy(t, 3, storeNATS(natsURLs(ns), ""), demoserver.Options{})
	rs := d.replicas
	var kept []*harness.RawClient
	for i := 0; i < 60; i++ {
		kept = append(kept, harness.NewSession(t, "http://"+rs[i%3].addr(), "2025-11-25"))
	}
	// Another session's cursor, and a deleted session's.
	other, otherEvs := callOn(t, rs[1], "2025-11-25", 3, 50, 0)
	_ = other
	gone, goneEvs := callOn(t, rs[2], "2025-11-25", 3, 50, 0)
	if err := gone.Delete(t.Context()); err != nil {
		t.Fatal(err)
	}
	// The live call: produced on r1, read on r2 (resumed there).
	live, liveFirst := callOn(t, rs[0], "2025-11-25", 70, 200, 2)
	resp := resume(t, rs[1], "2025-11-25", live.SessionID, lastID(liveFirst))
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("resume of the live call: %d", resp.StatusCode)
	}
	var liveRest []mcptest.Event
	var liveErr error
	liveDone := make(chan struct{})
	go func() {
		defer close(liveDone)
		liveRest, liveErr = mcptest.ReadEvents(resp.Body, 0, 40*time.Second)
		resp.Body.Close()
	}()

	stop := make(chan struct{})
	var wg sync.WaitGroup
	var mu sync.Mutex
	var bad []string
	stats := map[string]map[int]int{}
	note := func(what string, code int, body string, want func(int, string) bool) {
		mu.Lock()
		defer mu.Unlock()
		if stats[what] == nil {
			stats[what] = map[int]int{}
		}
		stats[what][code]++
		if !want(code, body) && len(bad) < 40 {
			bad = append(bad, fmt.Sprintf("%s: %d %q", what, code, trunc(body, 300)))
		}
	}
	cursor400 := func(code int, body string) bool { return code == 400 && r30RPCError(body) }
	no5xx := func(code int, body string) bool {
		return code != 0 && code < 500 && !strings.Contains(body, "event:message")
	}
	// Churn: sessions created on one replica, deleted on the next.
	var churned atomic.Int64
	for w := 0; w < 2; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				c := mcptest.NewClient("http://"+rs[(i+w)%3].addr(), "2025-11-25", &http.Client{Timeout: 10 * time.Second})
				if err := c.Initialize(context.Background()); err != nil {
					note("churn initialize", 0, err.Error(), func(int, string) bool { return false })
					continue
				}
				c2 := clientOn(c, rs[(i+w+1)%3])
				var dwg sync.WaitGroup
				for k := 0; k < 2; k++ { // two DELETEs racing, on two replicas
					dwg.Add(1)
					go func(k int) {
						defer dwg.Done()
						cc := c2
						if k == 1 {
							cc = clientOn(c, rs[(i+w+2)%3])
						}
						code, body, _ := r30Status(cc, "DELETE", "", nil)
						note("churn DELETE", code, body, func(code int, _ string) bool { return code == 200 || code == 202 || code == 204 || code == 404 })
					}(k)
				}
				dwg.Wait()
				churned.Add(1)
			}
		}(w)
	}
	huge := strings.Repeat("A", 200_000)
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			r := rs[i%3]
			victim := kept[i%len(kept)]
			v := rawOn(t, r, "2025-11-25", victim.SessionID).Client
			get := func(what, id string, want func(int, string) bool) {
				code, body, _ := r30Status(v, "GET", "", http.Header{"Last-Event-ID": {id}})
				note(what, code, body, want)
			}
			get("garbage cursor", "garbage", cursor400)
			get("huge cursor", huge[:2000+i%5000], cursor400)
			get("other session's cursor", lastID(otherEvs), cursor400)
			get("deleted session's cursor", lastID(goneEvs), cursor400)
			get("live call's cursor on another session", lastID(liveFirst), cursor400)
			// No session at all, and unknown sessions.
			nos := mcptest.NewClient("http://"+r.addr(), "2025-11-25", &http.Client{})
			code, body, _ := r30Status(nos, "GET", "", http.Header{"Last-Event-ID": {lastID(otherEvs)}})
			note("GET without session, other's cursor", code, body, no5xx)
			unk := rawOn(t, r, "2025-11-25", fmt.Sprintf("nosuch-%d", i)).Client
			code, body, _ = r30Status(unk, "GET", "", http.Header{"Last-Event-ID": {lastID(otherEvs)}})
			note("unknown session, other's cursor", code, body, no5xx)
			code, body, _ = r30Status(unk, "DELETE", "", nil)
			note("DELETE unknown session", code, body, no5xx)
			code, body, _ = r30Status(rawOn(t, r, "2025-11-25", gone.SessionID).Client, "DELETE", "", nil)
			note("DELETE deleted session", code, body, no5xx)
			code, body, _ = r30Status(rawOn(t, r, "2025-11-25", gone.SessionID).Client, "GET", "", http.Header{"Last-Event-ID": {lastID(goneEvs)}})
			note("deleted session, own cursor", code, body, no5xx)
			code, body, _ = r30Status(v, "GET", "", http.Header{"Mcp-Session-Id": {victim.SessionID, other.SessionID}})
			note("two session ids", code, body, cursor400)
			code, body, _ = r30Status(rawOn(t, r, "2025-11-25", huge[:100_000]).Client, "GET", "", http.Header{"Last-Event-ID": {lastID(otherEvs)}})
			note("huge session id", code, body, no5xx)
		}
	}()
	time.Sleep(14 * time.Second)
	close(stop)
	wg.Wait()
	<-liveDone
	for what, m := range stats {
		t.Logf("%s: %v", what, m)
	}
	t.Logf("churned %d sessions", churned.Load())
	for _, b := range bad {
		t.Error(b)
	}
	progress, result, errs := callParts(t, liveFirst, liveRest)
	if err := mcptest.OnceInOrder(progress, 70); err != nil || result != "counted to 70" || len(errs) > 0 {
		t.Errorf("the live call: %v, result %q, errors %q, read error %v", err, result, errs, liveErr)
	}
	for i, c := range kept {
		if code := r29Ping(rs[(i+1)%3], c.SessionID, 1000+i); code != http.StatusOK {
			t.Errorf("kept session %d: ping %d", i, code)
		}
	}
	ss, err := mcptest.Sessions(rs[2].admin())
	if err != nil {
		t.Fatal(err)
	}
	have := map[string]bool{}
	for _, s := range ss {
		have[s.ID] = true
	}
	for i, c := range kept {
		if !have[c.SessionID] {
			t.Errorf("kept session %d not listed", i)
		}
	}
	if !have[live.SessionID] {
		t.Errorf("the live call's session not listed")
	}
}

func trunc(s string, n int) string {
	if len(s) > n {
		return s[:n] + "..."
	}
	return s
}

// Attack 3. Bearer-bound sessions (the upstream is the Go SDK behind
// RequireBearerToken with a JWT verifier), three replicas. alice's call is
// produced on r1 (the sweeper), read by alice on r2. For ~12 s (scans run),
// on every replica: mallory's valid token, alice's expired token, a forged
// token, no token, send a resume with alice's cursor, a POST (ping and
// tools/call) and a DELETE. None may be served the log, run a call or end
// the session. Then r1 is SIGKILLed while alice is away; mallory resumes
// on r3 (never served the session) during the takeover wait, at scan
// boundaries: no takeover for her, no events. alice, refreshed, takes the
// call over on r3 and gets every progress once and the result.
func TestReview30SecondCredentialDuringScans(t *testing.T) {
	ns := testnet.NATS(t)
	iss := mcptest.NewJWTIssuer("https://as.example.test")
	d := upstreamBehind(t, iss.Protect)
	store := storeNATS(natsURLs(ns), "takeover_wait 20s")
	var rs []*replica
	for i := 0; i < 3; i++ {
		rs = append(rs, d.start(fmt.Sprintf("r%d", i+1), store, true))
	}
	r1, r2, r3 := rs[0], rs[1], rs[2]
	alice := bearerSession(t, r1, iss, 4*time.Second, 60*time.Second)
	const n = 120 // 36 s at 300 ms
	resp, err := alice.Call(t.Context(), 2, "count", map[string]any{"n": n, "interval_ms": 300}, "p")
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("call: %v %v", err, resp)
	}
	first := readThenClose(t, resp, 3)
	aliceOn2 := clientOn(alice, r2)
	resp, err = aliceOn2.Resume(t.Context(), lastID(first))
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("alice's resume on r2: %v %v", err, resp)
	}
	second := readThenClose(t, resp, 5)
	cursor := lastID(second)

	hostile := map[string]http.Header{
		"mallory":       bearer(iss.Mint("mallory", time.Minute)),
		"alice-expired": bearer(iss.Mint("alice", -time.Second)),
		"forged":        bearer(mcptest.NewJWTIssuer("https://as.example.test").Mint("alice", time.Minute)),
		"none":          {"Authorization": nil},
		"other-issuer":  bearer(mcptest.NewJWTIssuer("https://evil.example.test").Mint("alice", time.Minute)),
	}
	var mu sync.Mutex
	var bad []string
	seen := map[string]map[int]int{}
	check := func(who, what string, code int, body string) {
		mu.Lock()
		defer mu.Unlock()
		k := who + " " + what
		if seen[k] == nil {
			seen[k] = map[int]int{}
		}
		seen[k][code]++
		if (code != 401 && code != 403) || strings.Contains(body, "progress") || strings.Contains(body, "event:") {
			if len(bad) < 30 {
				bad = append(bad, fmt.Sprintf("%s %s: %d %q", who, what, code, trunc(body, 200)))
			}
		}
	}
	attack := func(until time.Time, on []*replica, deletes bool) {
		for i := 0; time.Now().Before(until); i++ {
			r := on[i%len(on)]
			for who, h := range hostile {
				c := clientOn(alice, r).WithHeader(h)
				code, body, _ := r30Status(c, "GET", "", http.Header{"Last-Event-ID": {cursor}})
				check(who, "resume on "+r.name, code, body)
				code, body, _ = r30Status(c, "POST", `{"jsonrpc":"2.0","id":77,"method":"ping"}`, nil)
				check(who, "ping on "+r.name, code, body)
				code, body, _ = r30Status(c, "POST", mcptest.CallBody(78, "count", map[string]any{"n": 2, "interval_ms": 10}, "q"), nil)
				check(who, "call on "+r.name, code, body)
				code, body, _ = r30Status(c, "GET", "", nil)
				check(who, "standalone GET on "+r.name, code, body)
				if deletes {
					code, body, _ = r30Status(c, "DELETE", "", nil)
					check(who, "DELETE on "+r.name, code, body)
				}
			}
		}
	}
	attack(time.Now().Add(12*time.Second), rs, true)
	// The session lives, bound to alice.
	if code := r29Ping(r2, alice.SessionID, 5); code != http.StatusUnauthorized {
		// r29Ping sends no token: the upstream's 401.
		t.Logf("ping without token: %d", code)
	}
	fresh := bearer(iss.Mint("alice", time.Minute))
	code, body, _ := r30Status(clientOn(alice, r3).WithHeader(fresh), "POST", `{"jsonrpc":"2.0","id":90,"method":"ping"}`, nil)
	if code != http.StatusOK {
		t.Fatalf("alice's refreshed token on r3: %d %s", code, body)
	}
	// The producer dies; mallory (and the others) race alice's takeover.
	r1.Kill()
	killed := time.Now()
	attack(killed.Add(9*time.Second), []*replica{r3, r2}, false)
	aliceBack := clientOn(alice, r3).WithHeader(fresh)
	var parts = [][]mcptest.Event{first, second}
	last := cursor
	for k := 0; k < 6; k++ {
		resp, err := aliceBack.Resume(t.Context(), last)
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != http.StatusOK {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			t.Fatalf("alice back on r3: %d %s", resp.StatusCode, b)
		}
		evs, _ := mcptest.ReadEvents(resp.Body, 0, 40*time.Second)
		resp.Body.Close()
		parts = append(parts, evs)
		if _, result, errs := callEvents(t, evs, "2"); result != "" || len(errs) > 0 {
			break
		}
		if len(evs) > 0 {
			last = lastID(evs)
		}
	}
	for k, m := range seen {
		t.Logf("%s: %v", k, m)
	}
	for _, b := range bad {
		t.Error(b)
	}
	progress, result, errs := callParts(t, parts...)
	if err := mcptest.OnceInOrder(progress, n); err != nil || result != fmt.Sprintf("counted to %d", n) || len(errs) > 0 {
		t.Errorf("alice's call after the attacks: %v, result %q, errors %q (%d progress)", err, result, errs, len(progress))
	}
}

// Attack 4. max_sessions 6, session_idle_timeout 3s, three replicas.
// Sessions are made round-robin; some expire (no client), some are
// deleted on another replica than their creator, some kept in use; the
// sessions gauge must converge on every replica to the zone's count, and
// admission must then admit exactly up to the bound again (one more at
// most). Three rounds: no drift.
func TestReview30TallyWithExpiries(t *testing.T) {
	const bound = 6
	d, _, _ := r29Deploy(t, 3, demoserver.Options{}, fmt.Sprintf("max_sessions %d\nsession_idle_timeout 3s", bound))
	rs := d.replicas
	initOn := func(r *replica) *mcptest.Client {
		c := mcptest.NewClient("http://"+r.addr(), "2025-11-25", &http.Client{Timeout: 10 * time.Second})
		if err := c.Initialize(t.Context()); err != nil {
			if strings.Contains(err.Error(), "initialize: 503") {
				return nil
			}
			t.Fatalf("initialize on %s: %v", r.name, err)
		}
		return c
	}
	zone := func() int {
		ss, err := mcptest.Sessions(rs[0].admin())
		if err != nil {
			t.Fatal(err)
		}
		return len(ss)
	}
	converge := func(what string, want func() int) {
		t.Helper()
		for _, r := range rs {
			harness.WaitFor(t, 20*time.Second, fmt.Sprintf("%s: %s's sessions gauge at the zone's count", what, r.name), func() bool {
				return metric(t, r, "caddy_mcp_resume_sessions") == float64(want())
			})
		}
	}
	var keepMu sync.Mutex
	var keep []*mcptest.Client
	stopPing := make(chan struct{})
	var pwg sync.WaitGroup
	pwg.Add(1)
	go func() {
		defer pwg.Done()
		for i := 0; ; i++ {
			select {
			case <-stopPing:
				return
			case <-time.After(400 * time.Millisecond):
			}
			keepMu.Lock()
			list := append([]*mcptest.Client(nil), keep...)
			keepMu.Unlock()
			for k, c := range list {
				r29Ping(rs[(i+k)%3], c.SessionID, 1000+i)
			}
		}
	}()
	defer func() { close(stopPing); pwg.Wait() }()
	for round := 0; round < 3; round++ {
		var made []*mcptest.Client
		for i := 0; len(made) < bound && i < 3*bound; i++ {
			if c := initOn(rs[i%3]); c != nil {
				made = append(made, c)
			}
		}
		if len(made) < bound {
			t.Fatalf("round %d: only %d of %d admitted (zone %d)", round, len(made), bound, zone())
		}
		// Over the bound: refused.
		extra := 0
		for _, r := range rs {
			if c := initOn(r); c != nil {
				extra++
				made = append(made, c)
			}
		}
		if extra > 1 {
			t.Errorf("round %d: %d admitted past the bound", round, extra)
		}
		// Two kept, two deleted on another replica, the rest expire.
		keepMu.Lock()
		keep = append(keep[:0], made[0], made[1])
		keepMu.Unlock()
		for i, c := range made[2:4] {
			if err := clientOn(c, rs[(i+2)%3]).Delete(t.Context()); err != nil {
				t.Fatalf("DELETE: %v", err)
			}
		}
		converge(fmt.Sprintf("round %d after expiry", round), func() int { return 2 })
		// Admission now admits up to the bound again. Each admitted session
		// is kept alive and every replica's count waits for it before the
		// next initialize: a replica that had not yet heard of one made a
		// moment ago on another would admit past the bound (the README's
		// documented margin for initializes at once), which is lag, not the
		// drift this looks for (a CI run under load admitted 6 of 4 so).
		var again []*mcptest.Client
		for i := 0; i < 2*bound; i++ {
			if c := initOn(rs[(i+1)%3]); c != nil {
				again = append(again, c)
				keepMu.Lock()
				keep = append(keep, c)
				keepMu.Unlock()
				converge(fmt.Sprintf("round %d, admitted %d again", round, len(again)), func() int { return 2 + len(again) })
			}
		}
		t.Logf("round %d: admitted %d with 2 held (bound %d), zone %d", round, len(again), bound, zone())
		if len(again) < bound-2 || len(again) > bound-2+1 {
			t.Errorf("round %d: admitted %d with 2 held, want %d (+1)", round, len(again), bound-2)
		}
		for i, c := range again {
			if err := clientOn(c, rs[i%3]).Delete(t.Context()); err != nil {
				t.Fatalf("DELETE: %v", err)
			}
		}
		keepMu.Lock()
		keep = keep[:0]
		keepMu.Unlock()
		converge(fmt.Sprintf("round %d all gone", round), func() int { return 0 })
		if z := zone(); z != 0 {
			t.Fatalf("round %d: zone holds %d", round, z)
		}
	}
}

// Attack 1b. takeover_wait 3s, three replicas, 100 idle sessions (scans
// take a while). Twelve calls produced on r2, which is SIGKILLed while
// their clients are away; the clients come back one every 600 ms from
// 2 s after the kill, alternately to r1 (the sweeper, scanning) and r3
// (never served them): the later ones land around the end of the wait,
// when the scan fails the orphan. Each must get the result (taken over)
// or the explicit failure, every progress once, never a hang; and no
// orphan may stay live.
func TestReview30ComeBackAroundTheWaitsEnd(t *testing.T) {
	ns := testnet.NATS(t)
	d := deploy(t, 3, storeNATS(natsURLs(ns), "takeover_wait 3s"), demoserver.Options{EventStore: true})
	r1, r2, r3 := d.replicas[0], d.replicas[1], d.replicas[2]
	for i := 0; i < 100; i++ {
		harness.NewSession(t, "http://"+d.replicas[i%3].addr(), "2025-11-25")
	}
	type call struct {
		sid   string
		first []mcptest.Event
	}
	const n, k = 60, 12
	var calls []call
	for i := 0; i < k; i++ {
		c, first := callOn(t, r2, "2025-11-25", n, 200, 3)
		calls = append(calls, call{c.SessionID, first})
	}
	r2.Kill()
	killed := time.Now()
	outcomes := make([]r30Outcome, k)
	var wg sync.WaitGroup
	for i := range calls {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			time.Sleep(time.Until(killed.Add(r30Back(i))))
			order := []*replica{r1, r3}
			if i%2 == 1 {
				order = []*replica{r3, r1}
			}
			outcomes[i] = r30Follow(t, calls[i].sid, lastID(calls[i].first), calls[i].first,
				func(j int) *replica { return r30Alive(order, j) }, 60*time.Second)
		}(i)
	}
	wg.Wait()
	taken, failed := 0, 0
	for i, o := range outcomes {
		progress, result, errs := callParts(t, o.parts...)
		t.Logf("call %d (back at %v on %s): statuses %v, %d progress, result %q, errors %q, hang %q",
			i, r30Back(i), map[bool]string{true: "r1", false: "r3"}[i%2 == 0], o.statuses, len(progress), result, errs, o.hang)
		if o.hang != "" {
			t.Errorf("call %d: %s", i, o.hang)
			continue
		}
		if err := mcptest.OnceInOrder(progress, len(progress)); err != nil {
			t.Errorf("call %d: %v", i, err)
		}
		switch {
		case result != "" && len(errs) == 0 && len(progress) == n:
			taken++
		case result == "" && len(errs) == 1:
			failed++
		default:
			t.Errorf("call %d: result %q after %d progress, errors %q", i, result, len(progress), errs)
		}
	}
	t.Logf("%d taken over, %d failed", taken, failed)
	// No orphan left live.
	harness.WaitFor(t, 30*time.Second, "no live request stream left", func() bool {
		ss, err := mcptest.Sessions(r1.admin())
		if err != nil {
			return false
		}
		for _, s := range ss {
			for _, st := range s.Streams {
				if st.Num != 0 && st.State == "live" {
					return false
				}
			}
		}
		return true
	})
}

// r30Back is when the client of call i comes back after the producer's
// death.
func r30Back(i int) time.Duration { return 9*time.Second + time.Duration(i)*350*time.Millisecond }

// Attack 4b. Clock skew between replicas. A sweeper whose clock runs ahead
// (here 10 minutes: an NTP failure) publishes a tally stamped in its
// future, then dies. The next sweeper's tallies are stamped earlier, and
// readTally keeps only a tally at least as new as the one it holds
// (tally.go: t.At >= read.At): every other replica stops following the
// zone's count until the real clock passes the skewed stamp, and counts
// none of its own creations either (only those after read.At count).
// max_sessions 6: no replica may admit more than the bound (plus the
// README's slack for concurrent creations, here none: one at a time).
// The skewed sweeper is simulated by writing its tally (the exact value
// a replica with that clock writes) before killing it.
func TestReview30SkewedSweepersTallyPinsTheCount(t *testing.T) {
	const bound = 6
	ns := testnet.NATS(t)
	js := r30KV(t, ns)
	d := r30Deploy(t, ns, 3, demoserver.Options{}, "", fmt.Sprintf("max_sessions %d", bound))
	r1, r2, r3 := d.replicas[0], d.replicas[1], d.replicas[2]
	ids := r30IDs(t, js, d.replicas)
	if s := ids[r30Sweeper(js)]; s != r1 {
		t.Fatalf("sweeper %v, want r1", s)
	}
	// r1's clock runs 10 minutes ahead: its tally, as it writes it.
	ctx := t.Context()
	kv, err := js.KeyValue(ctx, r30Prefix+"_META")
	if err != nil {
		t.Fatal(err)
	}
	ss, err := mcptest.Sessions(r1.admin())
	if err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(map[string]any{"n": []int{len(ss), 0, 0}, "tombs": 0, "at": time.Now().Add(10 * time.Minute).UnixNano()})
	if _, err := kv.Put(ctx, "tally", b); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second) // r2 and r3 read it (every sweep interval)
	r1.Kill()
	harness.WaitFor(t, 10*time.Second, "a new sweeper", func() bool {
		s := ids[r30Sweeper(js)]
		return s == r2 || s == r3
	})
	sweeper := ids[r30Sweeper(js)]
	victim := r2
	if sweeper == r2 {
		victim = r3
	}
	time.Sleep(6 * time.Second) // the new sweeper scanned and published
	t.Logf("zone holds %d sessions; sweeper %s, other %s", len(ss), sweeper.name, victim.name)
	admitted := 0
	for i := 0; i < 3*bound; i++ {
		r := d.replicas[1+i%2]
		c := mcptest.NewClient("http://"+r.addr(), "2025-11-25", &http.Client{Timeout: 10 * time.Second})
		err := c.Initialize(ctx)
		switch {
		case err == nil:
			admitted++
		case strings.Contains(err.Error(), "initialize: 503"):
		default:
			t.Fatalf("initialize on %s: %v", r.name, err)
		}
		time.Sleep(300 * time.Millisecond)
	}
	all, _ := mcptest.Sessions(sweeper.admin())
	t.Logf("admitted %d one at a time (bound %d, %d held before); zone holds %d; gauges: %s %v, %s %v",
		admitted, bound, len(ss), len(all), sweeper.name, metric(t, sweeper, "caddy_mcp_resume_sessions"),
		victim.name, metric(t, victim, "caddy_mcp_resume_sessions"))
	if len(all) > bound+1 {
		t.Fatalf("max_sessions %d: the zone holds %d sessions, created one at a time", bound, len(all))
	}
}

// r30Deploy is r29Deploy on the NATS server ns, with extra in the store
// block and options in the mcp_resume block.
func r30Deploy(t *testing.T, ns *server.Server, n int, upstream demoserver.Options, extra, options string) *deployment {
	t.Helper()
	d := &deployment{t: t, upstream: harness.StartDemo(t, upstream)}
	for i := 0; i < n; i++ {
		d.replicas = append(d.replicas, d.start(fmt.Sprintf("r%d", i+1), storeNATS(natsURLs(ns), extra)+"\n"+options, true))
	}
	lb, err := mcptest.NewRelay(d.replicas[0].addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lb.Close() })
	d.lb = lb
	return d
}

// Attack 3b. A stolen standalone cursor. alice's session (bearer-bound,
// JWT upstream) has notices on its standalone stream, read on r1. mallory
// has the session ID and a cursor of it, and her own valid token. She
// resumes on r2, which never served the session, again and again while
// r2's connection to NATS is cut for a few seconds and comes back. A
// request whose session look-up failed (taken as unknown: authorize lets
// it through) must not be served alice's log once a later look-up (the
// adoption's "adopted meanwhile") finds the session: every answer must be
// the proxy's 403, the upstream's 401/403/404, or a 503, never alice's
// notices.
func TestReview30StolenCursorAcrossAStoreHiccup(t *testing.T) {
	ns := testnet.NATS(t)
	relay, real := natsRelay(t, ns)
	iss := mcptest.NewJWTIssuer("https://as.example.test")
	d := upstreamBehind(t, iss.Protect)
	r1 := d.start("r1", storeNATS(natsURLs(ns), ""), true)
	r2 := d.start("r2", storeNATS([]string{"nats://" + relay.Addr()}, ""), true)
	alice, notices := aliceWithNotices(t, r1, iss)
	cursor := notices[0].ID
	t.Logf("alice's standalone cursor %s", cursor)

	mallory := clientOn(alice, r2).WithHeader(bearer(iss.Mint("mallory", time.Hour)))
	var mu sync.Mutex
	statuses := map[int]int{}
	var leaks []string
	var one200 string
	var wg sync.WaitGroup
	try := func() {
		defer wg.Done()
		c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		began := time.Now()
		resp, err := mallory.Do(c, "GET", "", http.Header{"Last-Event-ID": {cursor}})
		if err != nil {
			mu.Lock()
			statuses[0]++
			mu.Unlock()
			return
		}
		defer resp.Body.Close()
		var body string
		if resp.StatusCode == http.StatusOK {
			evs, _ := mcptest.ReadEvents(resp.Body, 0, 4*time.Second)
			for _, ev := range evs {
				body += ev.Type + " " + ev.ID + " " + ev.Data + "\n"
			}
			body = fmt.Sprintf("after %v, headers %v:\n%s", time.Since(began), resp.Header, body)
		}
		mu.Lock()
		defer mu.Unlock()
		statuses[resp.StatusCode]++
		if resp.StatusCode == http.StatusOK && one200 == "" {
			one200 = body
		}
		if resp.StatusCode == http.StatusOK && strings.Contains(body, "notice") && len(leaks) < 5 {
			leaks = append(leaks, trunc(body, 600))
		}
	}
	for round := 0; round < 2; round++ {
		relay.SetTarget("127.0.0.1:1")
		relay.Cut(true)
		cut := time.Now()
		for time.Since(cut) < 7*time.Second {
			wg.Add(1)
			go try()
			time.Sleep(100 * time.Millisecond)
		}
		relay.SetTarget(real)
		wg.Wait()
		r2.waitStoreUp(t, 1)
		t.Logf("round %d: mallory's resumes on r2: %v; one 200: %s", round, statuses, trunc(one200, 500))
		if len(leaks) > 0 {
			break
		}
		time.Sleep(3 * time.Second)
	}
	for _, l := range leaks {
		t.Errorf("mallory (another subject's token) was served 200 on alice's session:\n%s", l)
	}
}
