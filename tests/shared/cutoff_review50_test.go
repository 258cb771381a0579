package shared

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/internal/demoserver"
	"github.com/mcpresume/caddy-mcp-resume/internal/mcptest"
	"github.com/mcpresume/caddy-mcp-resume/tests/harness"
)

// Review 50. A call runs on replica A; its client drops and comes back on
// replica B, which served the session before (its mirror holds the
// session's record) but is cut off from NATS now. B cannot read the
// stream's record, and answers as if it had none: the client's cursor is
// refused (400 "names no stream of this session") or told its events were
// evicted (a gap, then a response held open that never brings the
// answer), while A still runs the call and the store holds every event.
// What B should say is what it says of any resume it cannot look up: 503,
// retry later. natsstore's Session.Stream took a failed read of the
// stream's record (mirror.lookup) for a record that does not exist, and
// NextStream came from B's stale mirror. Now the glue asks LookupStream,
// which says it could not read: 503.
func TestReview50ResumeOnACutOffReplica(t *testing.T) {
	d, relays, real := r29Deploy(t, 2, demoserver.Options{}, "", 1)
	a, b := d.replicas[0], d.replicas[1]
	const version = "2025-11-25"
	c := harness.NewSession(t, "http://"+b.addr(), version)
	if evs := c.CallToEnd(2, "count", map[string]any{"n": 1, "interval_ms": 10}); len(evs) == 0 {
		t.Fatal("first call on B: no events")
	}

	relays[1].SetTarget("127.0.0.1:1")
	if relays[1].Cut(true) == 0 {
		t.Fatal("the relay cut no NATS connection")
	}
	b.waitStoreUp(t, 0)

	ca := rawOn(t, a, version, c.SessionID)
	resp := ca.Call(3, "count", map[string]any{"n": 15, "interval_ms": 300})
	if resp.StatusCode != http.StatusOK {
		resp.Body.Close()
		t.Fatalf("call on A: %d", resp.StatusCode)
	}
	first := readThenClose(t, resp, 3) // priming, two progress notifications: the client drops
	cursor := lastID(first)

	onB := resume(t, b, version, c.SessionID, cursor)
	status := onB.StatusCode
	var got []mcptest.Event
	var body string
	if status == http.StatusOK {
		got, _ = mcptest.ReadEvents(onB.Body, 0, 3*time.Second) // a hold: read what comes in 3 s
	} else {
		raw, _ := io.ReadAll(onB.Body)
		body = string(raw)
	}
	onB.Body.Close()
	t.Logf("resume on cut-off B: %d %q, events %+v", status, trunc(body, 300), got)

	relays[1].SetTarget(real)
	b.waitStoreUp(t, 1)

	// The call was alive all along: the same cursor on A gets the rest.
	rest := readThenClose(t, resume(t, a, version, c.SessionID, cursor), 0)
	progress, result, errs := callEvents(t, append(first, rest...), "3")
	t.Logf("resumed on A: %d progress, result %q, errors %q", len(progress), result, errs)
	if result != fmt.Sprintf("counted to %d", 15) || len(errs) > 0 {
		t.Fatalf("the call on A: result %q, errors %q", result, errs)
	}

	gap := false
	for _, ev := range got {
		gap = gap || ev.Type == "gap"
	}
	switch {
	case status == http.StatusBadRequest:
		t.Errorf("B refused the cursor of a live call with 400 (%q): an SDK client fails the call, whose answer the store holds", trunc(body, 200))
	case status == http.StatusOK && gap:
		t.Errorf("B told the client its events were lost (%s) while the store held them all", gapSummary(got))
	case status != http.StatusServiceUnavailable:
		t.Errorf("B answered %d, want 503 (retry later)", status)
	}
}

func gapSummary(evs []mcptest.Event) string {
	var b strings.Builder
	for _, ev := range evs {
		if ev.Type == "gap" {
			fmt.Fprintf(&b, "gap %s ", trunc(ev.Data, 200))
		}
	}
	return b.String()
}
