package shared

import (
	"testing"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/internal/demoserver"
	"github.com/mcpresume/caddy-mcp-resume/internal/mcptest"
)

// The standalone stream is fed while NATS stops taking the events stream's
// publishes (as when that stream lost its quorum while the buckets kept
// theirs), and the replica is stopped. A shared store takes appends before
// JetStream stored them, so the replica must record the upstream cursor of
// the last event stored, not of the last one appended: the next replica
// asks the upstream for the rest, and the client gets every notice once,
// in order.
func TestStandaloneCursorIsTheLastStoredEvent(t *testing.T) {
	t.Parallel()
	// A nats-server process whose user loses, on a reload, the right to
	// publish to the events stream. (An in-process server reloaded while
	// it answers requests trips the race detector inside nats-server.)
	conf := func(deny string) string {
		return `max_payload: 64MB
max_pending: 64MB
authorization {
	users = [{user: u, password: p, permissions: {publish: {allow: [">"]` + deny + `}, subscribe: {allow: [">"]}}}]
}
`
	}
	const allow, deny = "", `, deny: ["mcpr_default.ev.>"]`
	ns := startNATSProcessWith(t, conf(allow))
	reloadPerms := func(which string) { ns.reload(conf(which)) }
	store := storeNATS([]string{ns.url()}, "user u p") + "\nstall_timeout 3s"
	d := deploy(t, 2, store, demoserver.Options{EventStore: true})
	a, b := d.replicas[0], d.replicas[1]
	c := d.client("2025-11-25")
	time.Sleep(300 * time.Millisecond) // the client's standalone GET is open on A
	const n = 100
	notify(t, c, n, 50*time.Millisecond)
	time.Sleep(time.Second)
	reloadPerms(deny) // the events stream takes no more publishes; the KV buckets do
	time.Sleep(1500 * time.Millisecond)
	seenOnA := len(c.NoticesSeen())
	t.Logf("store_up on A while its events are refused: %v", metric(t, a, "caddy_mcp_resume_store_up"))
	if !a.Terminate(45 * time.Second) {
		t.Fatal("A did not stop")
	}
	// The client's standalone GET retries meanwhile; it reaches B once B
	// can store again (until then B refuses it, rightly).
	reloadPerms(allow)
	b.waitStoreUp(t, 1)
	d.lb.SetTarget(b.addr())
	mcptest.Eventually(20*time.Second, 50*time.Millisecond, func() bool { return len(c.NoticesSeen()) >= n })
	time.Sleep(500 * time.Millisecond)
	got := c.NoticesSeen()
	t.Logf("%d notices before the stop, %d in all", seenOnA, len(got))
	assertNotices(t, got, n)
	if len(got) < n {
		t.Fatalf("only %d of %d notices", len(got), n)
	}
}
