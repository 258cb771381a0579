package shared

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/mcpresume/caddy-mcp-resume/internal/mcptest"
	"github.com/mcpresume/caddy-mcp-resume/internal/testnet"
	"github.com/mcpresume/caddy-mcp-resume/tests/harness"
)

// r56EventsBytes is what the zone's events streams hold in JetStream.
func r56EventsBytes(t *testing.T, js jetstream.JetStream) (int64, string) {
	t.Helper()
	var total int64
	var names []string
	l := js.ListStreams(context.Background())
	for s := range l.Info() {
		if strings.HasSuffix(s.Config.Name, "_EVENTS") {
			total += int64(s.State.Bytes)
			names = append(names, fmt.Sprintf("%s=%d", s.Config.Name, s.State.Bytes))
		}
	}
	return total, strings.Join(names, ",")
}

// Review 56: max_total_bytes through two real Caddy replicas on one
// nats-server: a full total blocks producers on both, never over-admits,
// and unblocks them once room is freed, by eviction after resume_window
// and by DELETE of a session (on the other replica).
func TestReview56TotalBudgetAcrossReplicas(t *testing.T) {
	t.Parallel()
	ns := testnet.NATS(t)
	nc, err := nats.Connect(ns.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, _ := jetstream.New(nc)

	flood := harness.NewFlood()
	up := harness.StartHandler(t, flood)
	const maxTotal = 2 << 20
	store := storeNATS(natsURLs(ns), "") + "\nmax_total_bytes 2MiB\nmax_session_bytes 2MiB\nmax_stream_bytes 2MiB\nresume_window 3s\nstall_timeout 50s"
	d := deployTo(t, 2, store, up)
	a, b := d.replicas[0], d.replicas[1]
	base := func(r *replica) string { return "http://" + r.addr() }
	session := func(r *replica) *harness.StreamClient {
		cl := harness.NewStreamClient(base(r), "2025-06-18")
		t.Cleanup(cl.Close)
		if err := cl.Init(); err != nil {
			t.Fatal(err)
		}
		return cl
	}
	var maxSeen int64
	check := func(what string) int64 {
		n, names := r56EventsBytes(t, js)
		maxSeen = max(maxSeen, n)
		if n > maxTotal+64<<10 {
			t.Errorf("%s: JetStream holds %d bytes of events (%s), max_total_bytes is %d", what, n, names, maxTotal)
		}
		return n
	}
	on := a
	seq := func() int64 { return int64(metric(t, on, "caddy_mcp_resume_events_enqueued_total")) }
	stalled := func(c *mcptest.Call, what string) int64 {
		t.Helper()
		last, since := seq(), time.Now()
		deadline := time.Now().Add(20 * time.Second)
		for time.Since(since) < 1500*time.Millisecond {
			if time.Now().After(deadline) {
				t.Fatalf("%s: the store never stopped taking events (%d stored)", what, seq())
			}
			time.Sleep(100 * time.Millisecond)
			check(what)
			if w := seq(); w != last {
				last, since = w, time.Now()
			}
		}
		return last
	}
	moves := func(c *mcptest.Call, from int64, within time.Duration, what string) time.Duration {
		t.Helper()
		began := time.Now()
		for time.Since(began) < within {
			check(what)
			if seq() > from+64 {
				return time.Since(began)
			}
			time.Sleep(50 * time.Millisecond)
		}
		t.Fatalf("%s: the store took %d events more in %v", what, seq()-from, within)
		return 0
	}

	// X on A: 1.2 MiB, read to the end (delivered: evicted 3 s later).
	x := session(a)
	sx, err := x.CallStream(1, "flood", harness.FloodArgs(1200, 1024), 20*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var tr harness.Tracker
	if _, err := harness.Drain(x, sx, &tr, 1, 1300, 0); err != nil || tr.Progress != 1200 {
		t.Fatalf("X: %d events, %v", tr.Progress, err)
	}
	delivered := time.Now()
	t.Logf("after X: %d bytes in JetStream", check("after X"))

	// blocked starts a call with no client on r, and waits until it blocks
	// on the total.
	blocked := func(r *replica, what string) (*harness.StreamClient, *mcptest.Call, int64) {
		t.Helper()
		on = r
		c := session(r)
		s, err := c.CallStream(1, "flood", harness.FloodArgs(20000, 1024), 20*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		s.Close()
		f := harness.FloodCall(t, flood, c.SessionID)
		return c, f, stalled(f, what)
	}

	// Y on B: clientless, blocks on the total.
	y, fy, wy := blocked(b, "Y blocked")
	t.Logf("Y blocked at %d bytes written, %v after X's delivery; JetStream %d", wy, time.Since(delivered), check("Y blocked"))
	if time.Since(delivered) > 2500*time.Millisecond {
		t.Logf("warning: Y blocked late")
	}
	took := moves(fy, wy, 10*time.Second, "Y after X's window")
	t.Logf("Y went on %v after it was seen blocked (X's window ends 3 s after its delivery)", took)

	// Z on A: clientless, blocks; then DELETE of Y on B frees the room.
	_, fz, wz := blocked(a, "Z blocked")
	t.Logf("Z blocked at %d bytes; JetStream %d", wz, check("Z blocked"))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := y.Delete(ctx); err != nil {
		t.Fatal(err)
	}
	took = moves(fz, wz, 10*time.Second, "Z after Y's DELETE")
	t.Logf("Z went on %v after Y's DELETE on the other replica", took)
	time.Sleep(time.Second)
	check("end")
	t.Logf("the most JetStream held: %d bytes (max_total_bytes %d)", maxSeen, maxTotal)
}
