package shared

import (
	"context"
	"net/http"
	"strings"
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

// In a 5-node cluster with replicas 3, JetStream places each stream and
// bucket on 3 peers of its own: losing two servers can take the events
// stream's (or a bucket's) quorum while others keep theirs. The health
// probe writes to each, so the store is unavailable: store_up shows 0 and
// a new call gets 503 before it reaches the upstream.
func TestQuorumLossOfOneStreamIsUnavailable(t *testing.T) {
	t.Parallel()
	servers := testnet.NATSCluster(t, 5)
	d := deploy(t, 1, storeNATS(natsURLs(servers...), "replicas 3"), demoserver.Options{})
	a := d.replicas[0]
	rc := harness.NewSession(t, "http://"+a.addr(), "2025-06-18")

	nc, err := nats.Connect(strings.Join(natsURLs(servers...), ","))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	peers := func(stream string) map[string]bool {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		s, err := js.Stream(ctx, stream)
		if err != nil {
			t.Fatalf("%s: %v", stream, err)
		}
		ci := s.CachedInfo().Cluster
		out := map[string]bool{ci.Leader: true}
		for _, r := range ci.Replicas {
			out[r.Name] = true
		}
		return out
	}
	meta := peers("KV_mcpr_default_META")
	events := peers("mcpr_default_EVENTS")
	streams := peers("KV_mcpr_default_STREAMS")
	t.Logf("META on %v, EVENTS on %v, STREAMS on %v", meta, events, streams)
	var kill []*server.Server
	for _, target := range []map[string]bool{events, streams} {
		kill = nil
		for _, s := range servers { // a peer of target outside META first
			if target[s.Name()] && !meta[s.Name()] {
				kill = append(kill, s)
				break
			}
		}
		if len(kill) == 0 {
			continue
		}
		for _, s := range servers {
			if target[s.Name()] && s != kill[0] {
				kill = append(kill, s)
				break
			}
		}
		break
	}
	if len(kill) == 0 {
		// JetStream placed EVENTS, STREAMS and META on the same peers this
		// time: take two of them, so every stream loses its quorum at once
		// (the case the 3-node test covers too) rather than test nothing.
		for _, s := range servers {
			if events[s.Name()] && len(kill) < 2 {
				kill = append(kill, s)
			}
		}
	}
	for _, s := range kill {
		t.Logf("shutting down %s", s.Name())
	}
	testnet.ShutdownNATS(kill...)
	// store_up may drop for a moment as the replica's connection moves to
	// a live server; the probe takes two failures in a row (a few seconds)
	// to say the stream cannot store. Wait until it stays down.
	deadline := time.Now().Add(30 * time.Second)
	for down := 0; down < 4; time.Sleep(time.Second) {
		if time.Now().After(deadline) {
			t.Fatal("store_up did not stay 0")
		}
		if metric(t, a, "caddy_mcp_resume_store_up") == 0 {
			down++
		} else {
			down = 0
		}
	}
	rc.Reconnect()
	untapped := metric(t, a, "caddy_mcp_resume_untapped_total")
	assert503(t, rc.Request(http.MethodPost, mcptest.CallBody(2, "count", map[string]any{"n": 2, "interval_ms": 1}, "tok"), nil),
		"the retention store is unavailable; retry later")
	if after := metric(t, a, "caddy_mcp_resume_untapped_total"); after != untapped {
		t.Fatalf("untapped_total moved %v -> %v: a call passed through", untapped, after)
	}
}
