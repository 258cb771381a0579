package shared

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/internal/mcptest"
	"github.com/mcpresume/caddy-mcp-resume/tests/harness"
)

// A reload that takes mcp_resume off (plain reverse_proxy from now on)
// leaves no zone at all: the old zone drains on its own, bounded by
// drain_timeout, and a stop that comes during that drain waits for it, so
// the call whose client was cut ends whole into the store and its client
// gets the result once mcp_resume is back.
func TestExitWaitsForTheDrainOfAReloadThatRemovedTheModule(t *testing.T) {
	t.Parallel()
	store := "store nats {\n embedded\n drain_timeout 20s\n}"
	r, up := startOne(t, store)
	rc := harness.NewSession(t, "http://"+r.addr(), "2025-06-18")
	resp := rc.Call(1, "count", map[string]any{"n": 20, "interval_ms": 300})
	evs := harness.ReadEvents(t, resp, 3)
	resp.Body.Close() // the client is cut: the call goes on detached
	r.Config.Sites[0].Body = mcptest.ProxyRoute(up)
	lr, err := http.Post(r.admin()+"/load", "text/caddyfile", strings.NewReader(r.Config.Caddyfile()))
	if err != nil {
		t.Fatal(err)
	}
	lr.Body.Close()
	if lr.StatusCode != 200 {
		t.Fatalf("reload: %d", lr.StatusCode)
	}
	time.Sleep(300 * time.Millisecond)
	start := time.Now()
	if !r.Terminate(45 * time.Second) {
		t.Fatal("no exit")
	}
	took := time.Since(start)
	t.Logf("SIGTERM to exit: %v", took)
	if logs := r.Logs(); !strings.Contains(logs, `"why":"a reload left no handler in the zone"`) {
		t.Fatalf("the reload did not drain the old zone:\n%s", logs)
	}
	r.Config.Sites[0].Body = mcptest.ResumeRoute(up, store)
	if err := r.Start(); err != nil {
		t.Fatal(err)
	}
	r.waitStoreUp(t, 1)
	rc.Reconnect()
	r2 := rc.Resume(evs[len(evs)-1].ID)
	more, err := mcptest.ReadEvents(r2.Body, 0, 40*time.Second)
	r2.Body.Close()
	last := ""
	if len(more) > 0 {
		last = more[len(more)-1].Data
	}
	t.Logf("resume: %d, %d events, err %v, last %.300s", r2.StatusCode, len(more), err, last)
	if !strings.Contains(last, "counted to 20") {
		t.Fatalf("the call in the removed zone's drain lost its result (the exit took %v)", took)
	}
}
