package e2e

import (
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/internal/demoserver"
	"github.com/mcpresume/caddy-mcp-resume/internal/mcptest"
	"github.com/mcpresume/caddy-mcp-resume/tests/harness"
)

// A reload that spells out the store it already has (the default `store
// memory`, or the same `store nats` block with a new drain_timeout, which
// a reload applies in place) keeps the zone: retention and running calls
// go on, as across any other reload.
func TestReloadSpellingOutTheStoreKeepsCalls(t *testing.T) {
	store := "store memory"
	if harness.SharedStore() {
		store = "store nats {\n embedded {env.MCPR_TEST_STORE_DIR}\n drain_timeout 19s\n }"
	}
	reloadDuringCall(t, store)
}

// A reload that moves the zone to another store configuration (here
// lease_ttl) opens a new zone; the old one drains its running calls into
// the same shared store in the background, so a call in flight still ends
// with every event and its result.
func TestReloadChangingTheSharedStoreDrainsCalls(t *testing.T) {
	harness.SharedStoreOnly(t, "the memory store has no options, so no reload can move it to another store")
	reloadDuringCall(t, "store nats {\n embedded {env.MCPR_TEST_STORE_DIR}\n lease_ttl 45s\n }")
}

// reloadDuringCall reloads to a route whose mcp_resume block is store while
// a call is running, and checks that the client gets the whole call: on
// the same response, or after one resume, as SDK clients do.
func reloadDuringCall(t *testing.T, store string) {
	t.Helper()
	c, upstream := proxyFor(t, demoserver.Options{}, "")
	rc := harness.NewSession(t, c.Base(), "2025-06-18")
	resp := rc.Call(1, "count", map[string]any{"n": 15, "interval_ms": 100})
	evs := harness.ReadEvents(t, resp, 3)

	c.Load(t, fmt.Sprintf("\troute /mcp* {\n mcp_resume {\n %s\n }\n reverse_proxy %s\n }", store, upstream))
	more, err := mcptest.ReadEvents(resp.Body, 0, 20*time.Second)
	resp.Body.Close()
	rc.Reconnect()
	evs = append(evs, more...)
	if err != nil || len(evs) < 16 {
		// Cut by the reload: the client resumes from its last event.
		r2 := rc.Resume(evs[len(evs)-1].ID)
		more, err = mcptest.ReadEvents(r2.Body, 0, 20*time.Second)
		r2.Body.Close()
		if err != nil && err != io.EOF {
			t.Fatalf("resume after the reload: %d, %v", r2.StatusCode, err)
		}
		evs = append(evs, more...)
	}
	if len(evs) != 16 || !strings.Contains(evs[15].Data, `"counted to 15"`) {
		t.Fatalf("the call's stream across the reload: %d events, last %+v; want its 16 events and its result", len(evs), evs[len(evs)-1])
	}
	seen := map[string]bool{}
	for _, e := range evs {
		if seen[e.ID] {
			t.Fatalf("event %s came twice", e.ID)
		}
		seen[e.ID] = true
	}
}
