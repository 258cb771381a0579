package natsstore

import (
	"context"
	"testing"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/buffer"
	"github.com/mcpresume/caddy-mcp-resume/internal/testnet"
	"github.com/mcpresume/caddy-mcp-resume/policy"
)

// TestOrphanEvictedWholeStillWaitsForATakeover with a torn last event: the
// producer died between the parts of event 4, after events 1..3 (cursor
// up-3). The client comes back at the head and acknowledges 1..3; the
// eviction finds the floor's event (4) stored, as its first part, and
// purges the messages before it (evict.go, case at != nil) without moving
// the cursor they carried into the record. The torn part carries none, and
// the message before it is gone: hasCursor finds none, and the sweeper
// fails a call a takeover could have resumed from up-3.
func TestReview35OrphanWithATornLastEventKeepsItsCursorAcrossAnEviction(t *testing.T) {
	t.Parallel()
	url := testnet.StockNATS(t).ClientURL()
	mod := func(o *Options) { o.LeaseTTL = time.Second }
	a, b := openAt(t, []string{url}, mod), openAt(t, []string{url}, mod)
	sa, _ := a.CreateSession("sess", buffer.SessionMeta{})
	str, _ := sa.NewStream([]string{"1"}, [32]byte{1})
	if _, err := str.TakeProducer(context.Background()); err != nil {
		t.Fatal(err)
	}
	produceWithCursor(t, str, 1, 3)
	strandFirstPart(t, a, str)
	key, strB := orphanOn(t, a, b, str)
	before, _, _ := b.streams.get(key)
	if !b.hasCursor(key, before) {
		t.Fatal("before the eviction: no cursor found")
	}
	_, r, err := strB.Resume(3, func(policy.StreamView) policy.Resume { return policy.Resume{Kind: policy.Noop, From: 4} })
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	after, _, _ := b.streams.get(key)
	t.Logf("after the resume: floor %d, record cursor %q, tail %+v", strB.View().Floor, after.Upstream, after.Tail)
	if got := strB.UpstreamCursor(); got != "up-3" {
		t.Errorf("the cursor after the eviction: %q, want up-3", got)
	}
	if !b.hasCursor(key, before) {
		t.Error("the sweep's look at the orphan after the eviction found no cursor: it fails the call")
	}
	b.scanNow(t)
	if v := strB.View(); v.State != policy.Live {
		t.Fatalf("after a scan: state %s, want the stream live for a takeover", v.State)
	}
}
