package shared

// review21: a reload that renames a zone (test taken from review21, commit d14b4b3).

import (
	"strings"
	"testing"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/internal/demoserver"
	"github.com/mcpresume/caddy-mcp-resume/internal/mcptest"
	"github.com/mcpresume/caddy-mcp-resume/internal/testnet"
	"github.com/mcpresume/caddy-mcp-resume/tests/harness"
)

// A reload that moves a route's mcp_resume to another zone name (here
// "zone other", the same NATS) leaves no configuration holding the old
// zone, and no successor of its name: the lifecycle takes that as
// "released" and closes the zone at once (stop + close), with no drain. A
// call running detached in the old zone is cut, and its client, resuming
// on another replica of the old zone, gets a gap and an error instead of
// the result. A reload to another store of the same name drains; so
// should this one: the README says an old nats zone drains its running
// calls into the shared store until they end.
func TestReloadThatRenamesTheZoneDrainsItsCalls(t *testing.T) {
	ns := testnet.NATS(t)
	d := &deployment{t: t, upstream: harness.StartDemo(t, demoserver.Options{})}
	store := storeNATS(natsURLs(ns), "")
	a := d.start("r1", store, true)
	b := d.start("r2", store, true)
	d.replicas = []*replica{a, b}
	rc := harness.NewSession(t, "http://"+a.addr(), "2025-06-18")
	resp := rc.Call(1, "count", map[string]any{"n": 15, "interval_ms": 200})
	evs := harness.ReadEvents(t, resp, 3)
	resp.Body.Close() // the client is cut: the call goes on detached
	reloadTo(t, a, d.upstream, "zone other\n"+store)
	time.Sleep(4 * time.Second) // the call's 3 s are over
	onB := harness.NewRawClient(t, "http://"+b.addr(), "2025-06-18")
	onB.SessionID = rc.SessionID
	r := onB.Resume(evs[len(evs)-1].ID)
	more, err := mcptest.ReadEvents(r.Body, 0, 20*time.Second)
	r.Body.Close()
	var types []string
	last := ""
	for _, ev := range more {
		types = append(types, ev.Type)
		last = ev.Data
	}
	t.Logf("resume on B: %d, %d events %v, err %v, last %.300s", r.StatusCode, len(more), types, err, last)
	if !strings.Contains(last, "counted to 15") {
		t.Fatalf("the call running in the zone a reload renamed away lost its result (resume on B: %d, last event %.200s); want it drained into the store, as a reload to another store drains", r.StatusCode, last)
	}
}
