package shared

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/buffer"
	"github.com/mcpresume/caddy-mcp-resume/internal/demoserver"
	"github.com/mcpresume/caddy-mcp-resume/internal/mcptest"
	"github.com/mcpresume/caddy-mcp-resume/internal/testnet"
	"github.com/mcpresume/caddy-mcp-resume/tests/harness"
)

// Takeover (issue 22): the replica reading a call's upstream response dies;
// the call's upstream keeps its own events (the official SDKs' event
// stores), so another replica resumes the upstream from the upstream event
// ID stored with the last stored event, into the same proxy stream, with
// the credentials of the client that came back. These tests run the
// official Go SDK server with its MemoryEventStore (streams it never closes
// by itself) and the official TypeScript SDK server and client.

// series is the value of one metric series (name with its labels) on r.
func series(t *testing.T, r *replica, s string) float64 {
	t.Helper()
	m, err := mcptest.ScrapeMetrics(r.admin() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	return m.Series[s]
}

// takenOver checks that r took a stream over: its log line (session,
// stream, this replica and the one before: itself if self) and its count.
// It returns when r logged it.
func takenOver(t *testing.T, r *replica, self bool) time.Time {
	t.Helper()
	var line string
	for _, l := range strings.Split(r.Logs(), "\n") {
		if strings.Contains(l, `"request stream taken over"`) {
			line = l
			break
		}
	}
	if line == "" {
		t.Fatalf("replica %s logged no takeover", r.name)
	}
	var f map[string]any
	if err := json.Unmarshal([]byte(line), &f); err != nil {
		t.Fatalf("takeover log line %q: %v", line, err)
	}
	for _, k := range []string{"session", "stream", "replica", "previous_replica", "upstream_last_event_id"} {
		if f[k] == nil || f[k] == "" {
			t.Errorf("takeover log line lacks %s: %s", k, line)
		}
	}
	if self != (f["replica"] == f["previous_replica"]) {
		t.Errorf("takeover log line: replica and previous_replica (the same: %v, want %v): %s",
			f["replica"] == f["previous_replica"], self, line)
	}
	if v := series(t, r, `caddy_mcp_resume_takeovers_total{outcome="resumed"}`); v < 1 {
		t.Errorf("replica %s: takeovers_total{outcome=resumed} = %v", r.name, v)
	}
	ts, _ := f["ts"].(float64)
	return time.Unix(0, int64(ts*1e9))
}

// noEarlyEviction checks the counter that must stay 0 on every live replica.
func noEarlyEviction(t *testing.T, rs ...*replica) {
	t.Helper()
	for _, r := range rs {
		if v := metric(t, r, "caddy_mcp_resume_events_evicted_before_ack_total"); v != 0 {
			t.Errorf("replica %s: events_evicted_before_ack_total = %v", r.name, v)
		}
	}
}

// waitProduced waits until r's admin API shows a request stream with at
// least head events: the call is under way there.
func waitProduced(t *testing.T, r *replica, head uint64) {
	t.Helper()
	harness.WaitFor(t, 20*time.Second, fmt.Sprintf("a request stream of %d events on %s", head, r.name), func() bool {
		ss, err := mcptest.Sessions(r.admin())
		if err != nil {
			return false
		}
		for _, st := range requestStreams(ss) {
			if st.Head >= head {
				return true
			}
		}
		return false
	})
}

// callEvents splits a raw client's events into the progress values, the
// result's text and the JSON-RPC errors for request id.
func callEvents(t *testing.T, evs []mcptest.Event, id string) (progress []float64, result string, errs []string) {
	t.Helper()
	for _, ev := range evs {
		if ev.Data == "" || ev.Type == "gap" {
			continue
		}
		m, err := mcptest.DecodeMessage(ev.Data)
		if err != nil {
			t.Fatalf("event %s: %v (%q)", ev.ID, err, ev.Data)
		}
		switch {
		case m.Method == "notifications/progress":
			progress = append(progress, m.Params.Progress)
		case string(m.ID) == id && m.Error != nil:
			errs = append(errs, m.Error.Message)
		case string(m.ID) == id:
			var r struct {
				Content []struct{ Text string } `json:"content"`
			}
			json.Unmarshal(m.Result, &r)
			for _, c := range r.Content {
				result += c.Text
			}
		}
	}
	return progress, result, errs
}

// The replica producing a call is SIGKILLed while its client reads it
// there; the client (the Go SDK's, which resumes by itself) comes back on
// the other replica, which takes the upstream read over: every progress
// notification once, in order, and the result.
func TestTakeoverAfterTheProducerIsKilled(t *testing.T) {
	t.Parallel()
	d := deployTakeover(t, 2, "")
	a, b := d.replicas[0], d.replicas[1]
	c := d.client("2025-11-25")
	const n = 30
	var killedAt time.Time
	killed := c.After(5, func() int {
		killedAt = time.Now()
		a.Kill()
		return d.moveTo(b)
	})
	start := time.Now()
	if got := callCount(t, c, n, 200); got != fmt.Sprintf("counted to %d", n) {
		t.Fatalf("result %q", got)
	}
	<-killed
	took := time.Since(start)
	assertOnceInOrder(t, c, n)
	at := takenOver(t, b, false)
	t.Logf("the call took %v (%d x 200 ms), its producer killed after 5 progress notifications; B took it over %v after the kill (lease_ttl 2s)",
		took, n, at.Sub(killedAt).Round(time.Millisecond))
	noEarlyEviction(t, b)
}

// The client's connection is cut first, then its producer is SIGKILLed; no
// client reads the stream while the lease lapses (the sweeper waits
// takeover_wait for one to come back instead of failing the call). The
// client resumes on the other replica with the last event ID it has: the
// rest of the progress notifications once, and the result.
func TestTakeoverWhenTheClientComesBack(t *testing.T) {
	t.Parallel()
	d := deployTakeover(t, 2, "takeover_wait 30s")
	a, b := d.replicas[0], d.replicas[1]
	const n = 20
	// 2025-06-18: no priming event, four progress notifications.
	ca, first := callThenKill(t, a, "2025-06-18", n, 200, 4)
	time.Sleep(3 * 2 * time.Second) // three lease_ttl: the lease lapsed long ago, no client reads

	resp := resume(t, b, "2025-06-18", ca.SessionID, lastID(first))
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("resume on B: %d", resp.StatusCode)
	}
	rest := readThenClose(t, resp, 0)
	wantCounted(t, "the resumed call", n, first, rest)
	takenOver(t, b, false)
	noEarlyEviction(t, b)
}

// The bearer token the call began with expires while its producer is dead;
// the client comes back with a refreshed token (same subject). The store
// keeps no token, so the upstream GET of the takeover carries the one the
// resuming client brought (and the upstream vouched for): the upstream
// accepts it, the call goes on.
func TestTakeoverCarriesTheResumingClientsToken(t *testing.T) {
	t.Parallel()
	iss := mcptest.NewJWTIssuer("https://as.example.test")
	a, b := bearerReplicas(t, iss)
	const n = 25
	viaA, first := bearerCallThenKill(t, a, iss, 4*time.Second, n)
	time.Sleep(5 * time.Second) // the first token has expired; the lease lapsed

	viaB := clientOn(viaA, b).WithHeader(bearer(iss.Mint("alice", time.Minute)))
	resp, err := viaB.Resume(t.Context(), lastID(first))
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("resume on B with the refreshed token: %v %v", err, resp)
	}
	rest := readThenClose(t, resp, 0)
	wantCounted(t, "the resumed call", n, first, rest)
	takenOver(t, b, false)
}

// No client comes back within takeover_wait: the call ends with the
// documented explicit failure (a gap and a JSON-RPC error for the request),
// and a client resuming later gets exactly that.
//
// Its lower bound is lease_ttl + takeover_wait less a renewal period
// (lease_ttl/3): the lease was last renewed up to that long before the
// kill, and the kill's time is taken once it returned (5 s itself was
// seen 12 and 44 ms short). Not parallel, all the same.
func TestTakeoverWaitEndsInTheExplicitFailure(t *testing.T) {
	d := deployTakeover(t, 2, "takeover_wait 3s")
	a, b := d.replicas[0], d.replicas[1]
	ca, first := callThenKill(t, a, "2025-11-25", 40, 200, 3)
	killed := time.Now()
	// lease_ttl (2s) + takeover_wait (3s): the stream fails, on B's sweep.
	harness.WaitFor(t, 20*time.Second, "the orphan failed", func() bool {
		ss, err := mcptest.Sessions(b.admin())
		if err != nil {
			return false
		}
		for _, st := range requestStreams(ss) {
			if st.State == "failed" {
				return true
			}
		}
		return false
	})
	if took, least := time.Since(killed), 5*time.Second-2*time.Second/3; took < least {
		t.Fatalf("the orphan failed %v after the kill: before lease_ttl + takeover_wait less a renewal (%v)", took, least)
	}
	rest := readThenClose(t, resume(t, b, "2025-11-25", ca.SessionID, lastID(first)), 0)
	_, result, errs := callEvents(t, rest, "2")
	if result != "" || len(errs) != 1 || !strings.Contains(errs[0], "lost (upstream_failed)") {
		t.Fatalf("resume after takeover_wait: result %q, errors %q, want one error (lost (upstream_failed))", result, errs)
	}
	if v := series(t, b, `caddy_mcp_resume_takeovers_total{outcome="resumed"}`); v != 0 {
		t.Fatalf("takeovers_total{outcome=resumed} = %v with no client back", v)
	}
}

// An upstream that refuses the resume (the Go SDK's event store purged the
// events after the cursor: 400 "failed to replay events") gets the explicit
// failure on the replica that tried to take over: the client's call fails
// loudly, and no progress notification comes twice.
func TestTakeoverRefusedByTheUpstream(t *testing.T) {
	t.Parallel()
	ns := testnet.NATS(t)
	d := deploy(t, 2, storeNATS(natsURLs(ns), ""), demoserver.Options{EventStore: true, EventStoreMaxBytes: 400})
	a, b := d.replicas[0], d.replicas[1]
	ca, first := callThenKill(t, a, "2025-11-25", 60, 50, 3)
	time.Sleep(2 * time.Second) // the upstream goes on, and forgets what was not read

	rest := readThenClose(t, resume(t, b, "2025-11-25", ca.SessionID, lastID(first)), 0)
	got, result, errs := callParts(t, first, rest)
	if result != "" || len(errs) != 1 || !strings.Contains(errs[0], "lost (upstream_failed)") {
		t.Fatalf("a refused takeover: result %q, errors %q, want one error (lost (upstream_failed))", result, errs)
	}
	if err := mcptest.OnceInOrder(got, len(got)); err != nil {
		t.Fatal(err)
	}
	if v := series(t, b, `caddy_mcp_resume_takeovers_total{outcome="refused"}`); v != 1 {
		t.Fatalf("takeovers_total{outcome=refused} = %v, want 1", v)
	}
}

// A single Caddy with the embedded JetStream store is restarted mid call
// without draining it (SIGKILL: an OOM kill, a crash; or SIGTERM with a
// drain_timeout shorter than the call): the Caddy that starts finds the
// stream in its data directory and, when the client comes back, takes the
// upstream read over from where the store left it.
func TestTakeoverAfterRestartOfTheOnlyReplica(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, store string
		stop        func(*replica) bool
		logged      string // what the stopping replica logs
	}{
		{"killed", "store nats {\n embedded\n lease_ttl 2s\n}", func(r *replica) bool { r.Kill(); return true }, ""},
		{"drain ran out", "store nats {\n embedded\n lease_ttl 2s\n drain_timeout 1s\n}",
			func(r *replica) bool { return r.Terminate(30 * time.Second) }, `"drain timed out`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := deploy(t, 1, tc.store, demoserver.Options{EventStore: true})
			a := d.replicas[0]
			c := d.client("2025-11-25")
			const n = 30
			restarted := c.After(5, func() int {
				if !tc.stop(a) {
					t.Error("the replica did not stop")
				}
				if err := a.Start(); err != nil {
					t.Errorf("restart: %v", err)
				}
				a.waitStoreUp(t, 1)
				return 1
			})
			countThrough(t, c, n, 200, restarted)
			if !strings.Contains(a.Logs(), `"request stream taken over"`) {
				t.Fatal("the restarted replica logged no takeover")
			}
			if !strings.Contains(a.Logs(), tc.logged) {
				t.Fatalf("the stopping replica did not log %s", tc.logged)
			}
			noEarlyEviction(t, a)
		})
	}
}

// The old producer is cut off from NATS (a partition: it keeps running,
// and keeps its upstream connection) for longer than lease_ttl while its
// client moves to the other replica. The lease it cannot renew ends its
// producer role: it lets go of the upstream response, the other replica
// takes the stream over, and when the partition heals the old producer
// stores nothing more into the stream. One producer at a time: every
// progress notification once, none lost, and the result.
func TestTakeoverAcrossAPartitionOfTheProducer(t *testing.T) {
	t.Parallel()
	d, cutOff, real := deployCutOff(t)
	a, b := d.replicas[0], d.replicas[1]

	c := d.client("2025-11-25")
	const n = 40
	healed := c.After(5, func() int {
		cutOff.SetTarget("127.0.0.1:1")
		cut := cutOff.Cut(true)
		d.moveTo(b) // the client resumes on B; A stays up, without NATS
		time.Sleep(3 * 2 * time.Second)
		cutOff.SetTarget(real) // A is back
		a.waitStoreUp(t, 1)
		return cut
	})
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	res, err := c.Session.CallTool(ctx, mcptest.CountParams(n, 250))
	if cut := <-healed; cut == 0 {
		t.Fatal("the relay cut no NATS connection of A")
	}
	if err != nil {
		t.Fatalf("call across the partition: %v", err)
	}
	if got := mcptest.ResultText(res); got != fmt.Sprintf("counted to %d", n) {
		t.Fatalf("result %q", got)
	}
	assertOnceInOrder(t, c, n)
	takenOver(t, b, false)
	if strings.Contains(a.Logs(), `"request stream taken over"`) {
		t.Error("A took the stream back after the partition: two producers")
	}
	// A, back, learns the stream's end from B, and produces nothing.
	var last []buffer.StreamInfo
	callEnded := time.Now()
	ended := mcptest.Eventually(20*time.Second, 100*time.Millisecond, func() bool {
		ss, err := mcptest.Sessions(a.admin())
		if err != nil {
			return false
		}
		last = requestStreams(ss)
		return len(last) == 1 && last[0].State == "complete" && !last[0].Producing
	})
	if !ended {
		t.Errorf("A after the partition: %+v, want the stream complete, produced elsewhere", last)
	}
	t.Logf("A's mirror had the stream's end %v after the call ended", time.Since(callEnded))
	noEarlyEviction(t, a, b)
}

// requestStreams returns the request streams of sessions.
func requestStreams(ss []buffer.SessionInfo) []buffer.StreamInfo {
	var out []buffer.StreamInfo
	for _, s := range ss {
		for _, st := range s.Streams {
			if st.Kind == "request" {
				out = append(out, st)
			}
		}
	}
	return out
}

// The only replica is cut off from NATS for three lease_ttl periods while
// a call runs and its client stays connected, with an upstream that keeps
// its events: its producer stops itself before its lease can lapse (so
// another replica could take over), none does, and when NATS is back the
// replica takes the call over itself, for the client still connected:
// every progress notification once, and the result.
func TestTakeoverByTheSameReplicaAfterAPartition(t *testing.T) {
	t.Parallel()
	a := callAcrossAPartition(t, demoserver.Options{EventStore: true})
	takenOver(t, a, true)
	noEarlyEviction(t, a)
}
