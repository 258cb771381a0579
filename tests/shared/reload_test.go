package shared

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/internal/demoserver"
	"github.com/mcpresume/caddy-mcp-resume/internal/mcptest"
	"github.com/mcpresume/caddy-mcp-resume/tests/harness"
)

// startOne starts one replica with a short grace period (a reload does not
// wait for the call in flight).
func startOne(t *testing.T, store string) (*replica, string) {
	t.Helper()
	up := harness.StartDemo(t, demoserver.Options{})
	cfg := mcptest.Config{AdminPort: harness.CaddyPort(t), HTTPPort: harness.CaddyPort(t), HTTPSPort: harness.CaddyPort(t),
		Grace: "1s", LogLevel: "INFO",
		Sites: []mcptest.Site{{Port: harness.CaddyPort(t), Body: mcptest.ResumeRoute(up, store)}}}
	p, err := mcptest.StartProcess(caddyBin, t.TempDir(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	r := &replica{Process: p, name: "r1"}
	t.Cleanup(func() {
		if !r.Exited() {
			r.Kill()
		}
		if t.Failed() {
			t.Logf("replica logs:\n%s", r.Logs())
		}
	})
	r.waitStoreUp(t, 1)
	return r, up
}

// reloadTo POSTs r's Caddyfile with store to its admin /load.
func reloadTo(t *testing.T, r *replica, upstream, store string) {
	t.Helper()
	r.Config.Sites[0].Body = mcptest.ResumeRoute(upstream, store)
	resp, err := http.Post(r.admin()+"/load", "text/caddyfile", strings.NewReader(r.Config.Caddyfile()))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("reload: %d", resp.StatusCode)
	}
}

// A reload to another store configuration drains the old zone in the
// background; a stop that comes during that drain waits for it (bounded by
// drain_timeout), so the old zone's call, whose client was cut, ends whole
// and its client gets the result after the restart.
func TestExitWaitsForTheDrainOfAReload(t *testing.T) {
	t.Parallel()
	storeA := "store nats {\n embedded\n drain_timeout 20s\n}"
	storeB := "store nats {\n embedded\n drain_timeout 20s\n lease_ttl 30s\n}"
	r, up := startOne(t, storeA)
	rc := harness.NewSession(t, "http://"+r.addr(), "2025-06-18")
	resp := rc.Call(1, "count", map[string]any{"n": 20, "interval_ms": 300})
	evs := harness.ReadEvents(t, resp, 3)
	resp.Body.Close() // the client is cut: the call goes on detached
	start := time.Now()
	reloadTo(t, r, up, storeB)
	t.Logf("reload took %v", time.Since(start))
	time.Sleep(300 * time.Millisecond)
	start = time.Now()
	if !r.Terminate(45 * time.Second) {
		t.Fatal("no exit")
	}
	took := time.Since(start)
	t.Logf("SIGTERM to exit: %v", took)
	logs := r.Logs()
	if !strings.Contains(logs, `"why":"a reload moved the zone to another store"`) {
		t.Fatalf("the reload did not drain the old zone:\n%s", logs)
	}
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
		t.Fatalf("the call in the old zone's drain lost its result (the exit took %v)", took)
	}
}

// A reload to the store the zone already has, with its defaults spelled
// out (lease_ttl 15s, replicas 1, prefix mcpr_default), keeps the zone: a
// call longer than drain_timeout goes on, and nothing drains.
func TestReloadSpellingOutNATSDefaultsKeepsTheZone(t *testing.T) {
	t.Parallel()
	storeA := "store nats {\n embedded\n drain_timeout 3s\n}"
	storeB := "store nats {\n embedded\n drain_timeout 3s\n lease_ttl 15s\n replicas 1\n prefix mcpr_default\n}"
	r, up := startOne(t, storeA)
	rc := harness.NewSession(t, "http://"+r.addr(), "2025-06-18")
	resp := rc.Call(1, "count", map[string]any{"n": 16, "interval_ms": 500})
	evs := harness.ReadEvents(t, resp, 2)
	reloadTo(t, r, up, storeB)
	more, err := mcptest.ReadEvents(resp.Body, 0, 20*time.Second)
	resp.Body.Close()
	evs = append(evs, more...)
	t.Logf("first response: %d events, %v", len(evs), err)
	for round := 0; round < 3 && !done(evs); round++ {
		rc.Reconnect()
		r2 := rc.Resume(evs[len(evs)-1].ID)
		more, err = mcptest.ReadEvents(r2.Body, 0, 20*time.Second)
		r2.Body.Close()
		t.Logf("resume: %d, %d events, %v", r2.StatusCode, len(more), err)
		evs = append(evs, more...)
	}
	if logs := r.Logs(); strings.Contains(logs, `"draining`) {
		t.Errorf("a reload to the same store drained the zone")
	}
	if !done(evs) {
		t.Fatalf("a reload to the same store (defaults spelled out) cut the call: last event %.300s", evs[len(evs)-1].Data)
	}
}

func done(evs []mcptest.Event) bool {
	return len(evs) > 0 && strings.Contains(evs[len(evs)-1].Data, "counted to 16")
}
