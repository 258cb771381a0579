package shared

import (
	"testing"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/internal/demoserver"
	"github.com/mcpresume/caddy-mcp-resume/internal/mcptest"
	"github.com/mcpresume/caddy-mcp-resume/internal/testnet"
)

// The standalone stream's upstream read is paused by backpressure (its log
// holds a window's worth of delivered notifications) when its replica is
// stopped: the drain ends standalone reads at once. The event being
// appended must not be lost: the upstream cursor the next replica resumes
// from is the last event the store took, not the last one the tap read
// (found by review: notice 52 of 120 went missing, silently).
func TestDrainKeepsTheStandaloneEventBeingAppended(t *testing.T) {
	t.Parallel()
	ns := testnet.NATS(t)
	store := storeNATS(natsURLs(ns), "") + "\nmax_stream_bytes 8KiB\nmax_event_bytes 2KiB"
	d := deploy(t, 2, store, demoserver.Options{EventStore: true})
	a, b := d.replicas[0], d.replicas[1]
	c := d.client("2025-11-25")
	time.Sleep(300 * time.Millisecond) // the client's standalone GET is open on A
	const n = 120
	notify(t, c, n, 20*time.Millisecond)
	time.Sleep(3 * time.Second) // the log is full of delivered notices: A's upstream read waits for room
	seenOnA := len(c.NoticesSeen())
	if seenOnA >= n {
		t.Fatalf("the standalone log never filled (%d notices)", seenOnA)
	}
	d.lb.SetTarget(b.addr())
	if !a.Terminate(45 * time.Second) {
		t.Fatal("A did not stop")
	}
	mcptest.Eventually(10*time.Second, 50*time.Millisecond, func() bool { return len(c.NoticesSeen()) >= n })
	time.Sleep(500 * time.Millisecond)
	got := c.NoticesSeen()
	t.Logf("%d notices on A before the stop, %d in all (the rest waits for the window: backpressure)", seenOnA, len(got))
	// What arrived must be notices 1, 2, 3, ... with none skipped.
	assertNotices(t, got, n)
}
