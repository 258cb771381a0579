package shared

import (
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/mcpresume/caddy-mcp-resume/internal/demoserver"
	"github.com/mcpresume/caddy-mcp-resume/internal/mcptest"
	"github.com/mcpresume/caddy-mcp-resume/internal/testnet"
)

// The standalone stream is fed while NATS stops taking the events stream's
// publishes (as when that stream lost its quorum while the buckets kept
// theirs), and the replica is stopped. A shared store takes appends before
// JetStream stored them, so the replica must record the upstream cursor of
// the last event stored, not of the last one appended: the next replica
// asks the upstream for the rest, and the client gets every notice once,
// in order.
func TestStandaloneCursorIsTheLastStoredEvent(t *testing.T) {
	port, err := testnet.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	allow := &server.Permissions{Publish: &server.SubjectPermission{Allow: []string{">"}}, Subscribe: &server.SubjectPermission{Allow: []string{">"}}}
	deny := &server.Permissions{Publish: &server.SubjectPermission{Allow: []string{">"}, Deny: []string{"mcpr_default.ev.>"}}, Subscribe: &server.SubjectPermission{Allow: []string{">"}}}
	opts := func(p *server.Permissions) *server.Options {
		return &server.Options{ServerName: "perm", Host: "127.0.0.1", Port: port, JetStream: true, StoreDir: t.TempDir(),
			NoLog: true, NoSigs: true, MaxPayload: 64 << 20, MaxPending: 64 << 20,
			Users: []*server.User{{Username: "u", Password: "p", Permissions: p}}}
	}
	base := opts(allow)
	ns, err := server.NewServer(base)
	if err != nil {
		t.Fatal(err)
	}
	ns.Start()
	if !ns.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats not ready")
	}
	t.Cleanup(func() { testnet.ShutdownNATS(ns) })
	reloadPerms := func(p *server.Permissions) {
		o := *base
		o.Users = []*server.User{{Username: "u", Password: "p", Permissions: p}}
		if err := ns.ReloadOptions(&o); err != nil {
			t.Fatal(err)
		}
	}
	store := storeNATS(natsURLs(ns), "user u p") + "\nstall_timeout 3s"
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
