package shared

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/internal/demoserver"
	"github.com/mcpresume/caddy-mcp-resume/internal/mcptest"
	"github.com/mcpresume/caddy-mcp-resume/internal/testnet"
	"github.com/mcpresume/caddy-mcp-resume/tests/harness"
)

// Review 29: each replica sweeps the sessions it serves; the sweeper lease
// holder scans the zone every 5 s and publishes the tally. Attacks on real
// Caddy processes.

// r29Deploy starts replicas sharing one NATS server, with options (after the
// store block) in each mcp_resume block. viaRelay[i] sends replica i's
// NATS connection through a relay the test can cut (nil relay otherwise).
func r29Deploy(t *testing.T, n int, upstream demoserver.Options, options string, viaRelay ...int) (*deployment, []*mcptest.Relay, string) {
	t.Helper()
	ns := testnet.NATS(t)
	relays := make([]*mcptest.Relay, n)
	var real string
	d := &deployment{t: t, upstream: harness.StartDemo(t, upstream)}
	for i := 0; i < n; i++ {
		url := natsURLs(ns)
		for _, j := range viaRelay {
			if j == i {
				var r *mcptest.Relay
				r, real = natsRelay(t, ns)
				relays[i] = r
				url = []string{"nats://" + r.Addr()}
			}
		}
		d.replicas = append(d.replicas, d.start(fmt.Sprintf("r%d", i+1), storeNATS(url, "")+"\n"+options, true))
	}
	lb, err := mcptest.NewRelay(d.replicas[0].addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lb.Close() })
	d.lb = lb
	return d, relays, real
}

// r29Expired reports whether a replica logged the session's end by expiry.
func r29Expired(d *deployment, sid string) string {
	for _, r := range d.replicas {
		for _, line := range strings.Split(r.Logs(), "\n") {
			if strings.Contains(line, sid) && strings.Contains(line, `"session ended"`) && strings.Contains(line, "expired") {
				return r.name + ": " + line
			}
		}
	}
	return ""
}

// r29Ping sends a ping of session sid on r; it reports the status (0: the
// request failed).
func r29Ping(r *replica, sid string, id int) int {
	c := mcptest.NewClient("http://"+r.addr(), "2025-11-25", &http.Client{Timeout: 3 * time.Second})
	c.SessionID = sid
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	resp, err := c.Do(ctx, "POST", fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"ping"}`, id), nil)
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

// Attack 1. The producer (r2, not the sweeper) is SIGKILLed mid-call while
// its client is away; the client resumes at once on r3, which is neither
// the sweeper nor ever served the session. With an upstream that keeps its
// events: every event once, then the result. Without: an explicit failure
// (gap / JSON-RPC error), never silence.
func TestReview29KilledProducerResumedOnStranger(t *testing.T) {
	for _, tc := range []struct {
		name  string
		store bool
	}{{"takeover", true}, {"no-event-store", false}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			d, _, _ := r29Deploy(t, 3, demoserver.Options{EventStore: tc.store}, "")
			r2, r3 := d.replicas[1], d.replicas[2]
			const n = 30
			c, first := callThenKill(t, r2, "2025-11-25", n, 150, 4)
			start := time.Now()
			resp := resume(t, r3, "2025-11-25", c.SessionID, lastID(first))
			if resp.StatusCode != http.StatusOK {
				resp.Body.Close()
				t.Fatalf("resume on r3 right after r2's death: %d", resp.StatusCode)
			}
			rest, rerr := mcptest.ReadEvents(resp.Body, 0, 40*time.Second)
			resp.Body.Close()
			progress, result, errs := callParts(t, first, rest)
			t.Logf("%s: %d events in %v, result %q, errors %q, read error %v", tc.name, len(rest), time.Since(start), result, errs, rerr)
			if err := mcptest.OnceInOrder(progress, len(progress)); err != nil {
				t.Fatal(err)
			}
			if tc.store {
				wantCounted(t, "taken over on r3", n, first, rest)
				return
			}
			if result == "" && len(errs) == 0 {
				t.Fatalf("reader on r3: neither result nor error (read error %v)", rerr)
			}
		})
	}
}

// Attack 1 with the SDK client: it reads the call through the load balancer
// on r2; after 5 progress notifications r2 is SIGKILLed and the balancer
// sends to r3 (never served the session, not the sweeper).
func TestReview29SDKProducerKilledMovedToStranger(t *testing.T) {
	d, _, _ := r29Deploy(t, 3, demoserver.Options{EventStore: true}, "")
	r2, r3 := d.replicas[1], d.replicas[2]
	d.lb.SetTarget(r2.addr())
	c := d.client("2025-11-25")
	const n = 30
	done := c.After(5, func() int {
		r2.Kill()
		return d.moveTo(r3)
	})
	countThrough(t, c, n, 150, done)
}

// Attack 2. A session is used alternately on r1 (the sweeper) and r2 every
// 150 ms, session_idle_timeout 3s; one of them is cut off from NATS for 8s
// (more than 1.1 x the timeout) and comes back. The session must not expire
// while used (same epoch throughout, no expiry logged). Then the client
// goes away: it must expire.
func TestReview29IdleExpiryAcrossACutOff(t *testing.T) {
	for _, cut := range []int{0, 1} {
		t.Run(fmt.Sprintf("cut-r%d", cut+1), func(t *testing.T) {
			t.Parallel()
			d, relays, real := r29Deploy(t, 2, demoserver.Options{}, "session_idle_timeout 3s", cut)
			relay := relays[cut]
			cutR, other := d.replicas[cut], d.replicas[1-cut]
			c := harness.NewSession(t, "http://"+other.addr(), "2025-11-25")
			sid := c.SessionID
			info, ok, err := mcptest.Session(other.admin(), sid)
			if err != nil || !ok {
				t.Fatalf("session on %s: %v %v", other.name, ok, err)
			}
			// cutR serves the session too.
			if code := r29Ping(cutR, sid, 1); code != http.StatusOK {
				t.Fatalf("ping on %s: %d", cutR.name, code)
			}
			stop := make(chan struct{})
			var wg sync.WaitGroup
			var bad atomic.Value
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 2; ; i++ {
					select {
					case <-stop:
						return
					case <-time.After(150 * time.Millisecond):
					}
					r := d.replicas[i%2]
					code := r29Ping(r, sid, i)
					if r == other && code != http.StatusOK {
						bad.Store(fmt.Sprintf("ping %d on %s: %d", i, r.name, code))
					}
				}
			}()
			relay.SetTarget("127.0.0.1:1")
			if relay.Cut(true) == 0 {
				t.Fatal("no NATS connection cut")
			}
			cutR.waitStoreUp(t, 0)
			time.Sleep(8 * time.Second) // the cut-off: longer than 1.1 x the idle timeout
			relay.SetTarget(real)
			cutR.waitStoreUp(t, 1)
			time.Sleep(6 * time.Second) // both serve; the sweeper's scans run (5 s)
			close(stop)
			wg.Wait()
			if v := bad.Load(); v != nil {
				t.Errorf("while in use: %v", v)
			}
			if line := r29Expired(d, sid); line != "" {
				t.Fatalf("a session in use expired: %s", line)
			}
			for _, r := range d.replicas {
				now, ok, err := mcptest.Session(r.admin(), sid)
				if err != nil || !ok || now.Epoch != info.Epoch || now.Origin != info.Origin {
					t.Fatalf("%s after the cut-off: %+v ok %v err %v; first %+v", r.name, now, ok, err, info)
				}
			}
			// Now idle: it must expire within 1.1 x 3s, plus a scan and slack.
			harness.WaitFor(t, 15*time.Second, "the idle session expired", func() bool { return r29Expired(d, sid) != "" })
			for _, r := range d.replicas {
				harness.WaitFor(t, 10*time.Second, "session gone on "+r.name, func() bool {
					_, ok, err := mcptest.Session(r.admin(), sid)
					return err == nil && !ok
				})
			}
		})
	}
}

// Attack 2b. The replica serving an idle session (r2) and the sweeper (r1)
// are SIGKILLed together: r3, which never served it, must take the sweeper
// lease and expire it; its sessions gauge must come to 0.
func TestReview29IdleExpiryAfterServerAndSweeperDie(t *testing.T) {
	d, _, _ := r29Deploy(t, 3, demoserver.Options{}, "session_idle_timeout 3s")
	r1, r2, r3 := d.replicas[0], d.replicas[1], d.replicas[2]
	c := harness.NewSession(t, "http://"+r2.addr(), "2025-11-25")
	// Kept in use (pings on r2) until r3 counts it from a scan's tally.
	ping := 1
	harness.WaitFor(t, 15*time.Second, "r3 counts the session", func() bool {
		ping++
		if code := r29Ping(r2, c.SessionID, ping); code != http.StatusOK {
			t.Fatalf("ping on r2: %d", code)
		}
		return metric(t, r3, "caddy_mcp_resume_sessions") == 1
	})
	if line := r29Expired(d, c.SessionID); line != "" {
		t.Fatalf("expired while pinged: %s", line)
	}
	r1.Kill()
	r2.Kill()
	start := time.Now()
	harness.WaitFor(t, 25*time.Second, "session gone on r3", func() bool {
		_, ok, err := mcptest.Session(r3.admin(), c.SessionID)
		return err == nil && !ok
	})
	harness.WaitFor(t, 15*time.Second, "r3's sessions gauge at 0", func() bool {
		return metric(t, r3, "caddy_mcp_resume_sessions") == 0
	})
	t.Logf("expired and counted %v after the kills", time.Since(start))
}

// Attack 3. max_sessions 6 across 3 replicas: initializes round-robin,
// one after the other (at most one place taken twice), then 12 at once, 4
// per replica: creations admitted at the same moment on several replicas
// all pass (the README's sizing note; review 29 found 12 of 6 taken, where
// the README promised one more at most), but once over the bound no
// replica admits another. Deletions on other replicas than the creators;
// the gauge converges to the zone's count on every replica.
func TestReview29MaxSessionsRoundRobin(t *testing.T) {
	r29MaxSessions(t)
}

func r29MaxSessions(t *testing.T) {
	const bound = 6
	d, _, _ := r29Deploy(t, 3, demoserver.Options{}, fmt.Sprintf("max_sessions %d", bound))
	initOn := func(r *replica) (*mcptest.Client, int) {
		c := mcptest.NewClient("http://"+r.addr(), "2025-11-25", &http.Client{Timeout: 10 * time.Second})
		err := c.Initialize(t.Context())
		switch {
		case err == nil:
			return c, http.StatusOK
		case strings.Contains(err.Error(), "initialize: 503"):
			return nil, http.StatusServiceUnavailable
		}
		t.Fatalf("initialize on %s: %v", r.name, err)
		return nil, 0
	}
	zone := func() int {
		ss, err := mcptest.Sessions(d.replicas[0].admin())
		if err != nil {
			t.Fatal(err)
		}
		return len(ss)
	}
	converge := func(want int) {
		t.Helper()
		for _, r := range d.replicas {
			harness.WaitFor(t, 15*time.Second, fmt.Sprintf("%s's sessions gauge at %d", r.name, want), func() bool {
				return metric(t, r, "caddy_mcp_resume_sessions") == float64(want)
			})
		}
	}
	deleteAll := func(cs []*mcptest.Client, shift int) {
		t.Helper()
		for i, c := range cs {
			r := d.replicas[(i+shift)%3]
			c2 := *c
			c2.URL = "http://" + r.addr() + "/mcp"
			if err := c2.Delete(t.Context()); err != nil {
				t.Fatalf("DELETE on %s: %v", r.name, err)
			}
		}
	}

	for round := 0; round < 3; round++ {
		// One after the other, round-robin.
		var admitted []*mcptest.Client
		for i := 0; i < 2*bound; i++ {
			if c, code := initOn(d.replicas[i%3]); code == http.StatusOK {
				admitted = append(admitted, c)
			} else if len(admitted) < bound {
				t.Fatalf("round %d: initialize %d refused with %d admitted (bound %d)", round, i, len(admitted), bound)
			}
		}
		t.Logf("round %d, sequential: %d admitted, zone holds %d", round, len(admitted), zone())
		if len(admitted) > bound+1 {
			t.Fatalf("round %d: sequential round-robin creations admitted %d, bound %d", round, len(admitted), bound)
		}
		converge(zone())
		deleteAll(admitted, 1)
		converge(0)

		// All at once, 4 per replica.
		var mu sync.Mutex
		var wg sync.WaitGroup
		admitted = nil
		for i := 0; i < 2*bound; i++ {
			wg.Add(1)
			go func(r *replica) {
				defer wg.Done()
				if c, code := initOn(r); code == http.StatusOK {
					mu.Lock()
					admitted = append(admitted, c)
					mu.Unlock()
				}
			}(d.replicas[i%3])
		}
		wg.Wait()
		t.Logf("round %d, concurrent: %d admitted, zone holds %d", round, len(admitted), zone())
		held := zone()
		if len(admitted) < bound {
			t.Fatalf("round %d: concurrent creations on 3 replicas admitted only %d, bound %d", round, len(admitted), bound)
		}
		// Over the bound: no replica admits another.
		for _, r := range d.replicas {
			if c, code := initOn(r); code == http.StatusOK {
				if held2 := zone(); held2 > held {
					t.Fatalf("round %d: %s admitted a session with the zone at %d of %d", round, r.name, held, bound)
				}
				admitted = append(admitted, c) // passed through untapped
			}
		}
		converge(zone())
		deleteAll(admitted, 2)
		converge(0)
	}
}

// Attack 4. The zone holds many idle sessions (so a scan takes a while);
// a call produced on r2 is read on r3; the sweeper (r1) is SIGKILLed, then
// whoever sweeps next, repeatedly, at varied moments; finally r2 (the
// producer, upstream without an event store) dies too. The reader on r3
// must get every event once and an explicit end.
func TestReview29SweepersKilledDuringScans(t *testing.T) {
	d, _, _ := r29Deploy(t, 5, demoserver.Options{}, "")
	r2, r3 := d.replicas[1], d.replicas[2]
	for i := 0; i < 150; i++ {
		harness.NewSession(t, "http://"+d.replicas[i%5].addr(), "2025-11-25")
	}
	c := harness.NewSession(t, "http://"+r2.addr(), "2025-11-25")
	const n = 80
	first := readThenClose(t, c.Call(2, "count", map[string]any{"n": n, "interval_ms": 150}), 3)
	resp := resume(t, r3, "2025-11-25", c.SessionID, lastID(first))
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("resume on r3: %d", resp.StatusCode)
	}
	defer resp.Body.Close()
	var evs []mcptest.Event
	var rerr error
	read := make(chan struct{})
	go func() {
		defer close(read)
		evs, rerr = mcptest.ReadEvents(resp.Body, 0, 60*time.Second)
	}()
	// The sweepers: r1, then r4, then r5 (those not serving the call),
	// each killed a different time into the scan cycle.
	for i, r := range []*replica{d.replicas[0], d.replicas[3], d.replicas[4]} {
		time.Sleep(time.Duration(1300+900*i) * time.Millisecond)
		r.Kill()
	}
	time.Sleep(2 * time.Second)
	r2.Kill()
	start := time.Now()
	<-read
	progress, result, errs := callParts(t, first, evs)
	t.Logf("reader on r3: %d events, ended %v after r2's death, result %q, errors %q, read error %v",
		len(evs), time.Since(start), result, errs, rerr)
	if err := mcptest.OnceInOrder(progress, len(progress)); err != nil {
		t.Fatal(err)
	}
	if result == "" && len(errs) == 0 {
		t.Fatalf("reader on r3 got neither the result nor an error (read error %v)", rerr)
	}
	// r3 alone now: it must scan the zone (sweeper lease) and count it.
	harness.WaitFor(t, 20*time.Second, "r3's sessions gauge counts the zone", func() bool {
		ss, err := mcptest.Sessions(r3.admin())
		return err == nil && metric(t, r3, "caddy_mcp_resume_sessions") == float64(len(ss))
	})
}

// Attack 1c. A session served by four replicas (a ping on each): the
// producer r2 is SIGKILLed mid-call while its client is away (the upstream
// keeps no events: no takeover), so r1 (the sweeper), r3 and r4 all sweep
// the orphan. Its end must be written once: the client, resuming on r4
// after all had time to sweep, gets every progress once, then exactly one
// gap and one error for the call, then the end.
func TestReview29OrphanFailedOnceByAllServers(t *testing.T) {
	d, _, _ := r29Deploy(t, 4, demoserver.Options{}, "")
	r2, r4 := d.replicas[1], d.replicas[3]
	c := harness.NewSession(t, "http://"+r2.addr(), "2025-11-25")
	for i, r := range d.replicas {
		if code := r29Ping(r, c.SessionID, 100+i); code != http.StatusOK {
			t.Fatalf("ping on %s: %d", r.name, code)
		}
	}
	first := readThenClose(t, c.Call(2, "count", map[string]any{"n": 40, "interval_ms": 100}), 5)
	r2.Kill()
	// Until the stream is failed (every replica serving it sweeps it).
	harness.WaitFor(t, 20*time.Second, "the orphan failed", func() bool {
		s, ok, err := mcptest.Session(r4.admin(), c.SessionID)
		if err != nil || !ok {
			return false
		}
		for _, st := range s.Streams {
			if st.Num == 1 && st.State != "live" {
				return true
			}
		}
		return false
	})
	time.Sleep(2 * time.Second) // every replica had sweeps after it
	resp := resume(t, r4, "2025-11-25", c.SessionID, lastID(first))
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("resume on r4: %d", resp.StatusCode)
	}
	rest, rerr := mcptest.ReadEvents(resp.Body, 0, 20*time.Second)
	resp.Body.Close()
	progress, result, errs := callParts(t, first, rest)
	gaps := 0
	for _, ev := range rest {
		if ev.Type == "gap" {
			gaps++
		}
	}
	t.Logf("resume on r4: %d events, %d gaps, result %q, errors %q, read error %v", len(rest), gaps, result, errs, rerr)
	if err := mcptest.OnceInOrder(progress, len(progress)); err != nil {
		t.Fatal(err)
	}
	if rerr != nil || result != "" || len(errs) != 1 || gaps != 1 {
		t.Fatalf("the orphan's end: %d gaps, errors %q, result %q, read error %v (want one gap, one error, the end)", gaps, errs, result, rerr)
	}
	failed := 0.0
	for _, r := range d.replicas {
		if r != r2 {
			m, err := mcptest.ScrapeMetrics(r.admin() + "/metrics")
			if err != nil {
				t.Fatal(err)
			}
			for k, v := range m.Series {
				if strings.HasPrefix(k, "caddy_mcp_resume_streams_failed_total{") && strings.Contains(k, "upstream_failed") {
					failed += v
				}
			}
		}
	}
	if failed != 1 {
		t.Fatalf("streams failed with upstream_failed, summed over the live replicas: %v, want 1", failed)
	}
}

// Attack 2c. session_idle_timeout 3s. The session is made on r2; its
// client then only holds a standalone GET open on r3 (no other request)
// for 9 s, during which r2 (which made it) and r1 (the sweeper) are
// SIGKILLed: a session with a connected client must not expire (r3 and the
// new sweeper judge it). Once the GET is closed it expires.
func TestReview29ConnectedGETOnlyKeepsSession(t *testing.T) {
	d, _, _ := r29Deploy(t, 4, demoserver.Options{}, "session_idle_timeout 3s")
	r1, r2, r3 := d.replicas[0], d.replicas[1], d.replicas[2]
	c := harness.NewSession(t, "http://"+r2.addr(), "2025-11-25")
	g := rawOn(t, r3, "2025-11-25", c.SessionID)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	resp, err := g.Do(ctx, "GET", "", nil)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("standalone GET on r3: %v %v", err, resp)
	}
	ended := make(chan error, 1)
	go func() {
		evs, err := mcptest.ReadEvents(resp.Body, 0, 9*time.Second)
		if err == nil || !strings.Contains(err.Error(), "timed out") {
			err = fmt.Errorf("the GET ended (%v) with %d events: %+v", err, len(evs), evs)
		} else {
			err = nil
		}
		ended <- err
	}()
	time.Sleep(time.Second)
	r1.Kill()
	r2.Kill()
	if err := <-ended; err != nil {
		t.Fatal(err)
	}
	if line := r29Expired(d, c.SessionID); line != "" {
		t.Fatalf("expired while a client was connected: %s", line)
	}
	if _, ok, err := mcptest.Session(r3.admin(), c.SessionID); err != nil || !ok {
		t.Fatalf("session on r3 after 9 s connected: ok %v err %v", ok, err)
	}
	cancel()
	resp.Body.Close()
	harness.WaitFor(t, 20*time.Second, "the session expired once idle", func() bool {
		_, ok, err := mcptest.Session(r3.admin(), c.SessionID)
		return err == nil && !ok
	})
}
