package shared

import (
	"testing"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/internal/demoserver"
	"github.com/mcpresume/caddy-mcp-resume/internal/mcptest"
	"github.com/mcpresume/caddy-mcp-resume/internal/testnet"
)

// The replica producing the standalone stream is SIGKILLed: it records no
// upstream cursor as it goes. The batches it stored carry the upstream's
// event ID, so the next replica resumes the upstream right after what the
// store holds: every notice arrives once, in order (found by review: the
// next replica asked the upstream from the start, and 30 notices came
// twice).
func TestKillOfTheStandaloneProducerRepeatsNothing(t *testing.T) {
	t.Parallel()
	ns := testnet.NATS(t)
	d := deploy(t, 2, storeNATS(natsURLs(ns), ""), demoserver.Options{EventStore: true})
	a, b := d.replicas[0], d.replicas[1]
	c := d.client("2025-11-25")
	time.Sleep(300 * time.Millisecond) // the client's standalone GET is open on A
	const n = 100
	notify(t, c, n, 50*time.Millisecond)
	mcptest.Eventually(10*time.Second, 10*time.Millisecond, func() bool { return len(c.NoticesSeen()) >= 30 })
	a.Kill()
	seenOnA := len(c.NoticesSeen())
	d.lb.SetTarget(b.addr())
	d.lb.Cut(false)
	mcptest.Eventually(30*time.Second, 50*time.Millisecond, func() bool { return len(c.NoticesSeen()) >= n })
	time.Sleep(time.Second) // anything repeated would have come by now
	got := c.NoticesSeen()
	t.Logf("%d notices before the kill, %d in all", seenOnA, len(got))
	assertNotices(t, got, n)
	if len(got) != n {
		t.Fatalf("%d notices, want %d", len(got), n)
	}
}
