package e2e

import (
	"strings"
	"testing"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/internal/demoserver"
	"github.com/mcpresume/caddy-mcp-resume/internal/mcptest"
	"github.com/mcpresume/caddy-mcp-resume/tests/harness"
)

// A reload that takes mcp_resume off the route (the operator turns the
// module off: plain reverse_proxy from now on) while a client reads a
// call: no configuration holds the zone any more, and the lifecycle closes
// it at once (released: stop + close), cutting the call its client is
// still reading. Plain reverse_proxy lets a request in flight finish
// within the grace period (here 10 s), and so should the module: the
// client should get its result on the connection it has.
func TestReloadThatRemovesTheModuleLetsTheRunningCallFinish(t *testing.T) {
	up := harness.StartDemo(t, demoserver.Options{})
	c := &harness.Caddy{HTTPPort: harness.CaddyPort(t), AdminPort: harness.CaddyPort(t)}
	harness.NewStoreDir(t)
	cfg := func(site string) mcptest.Config {
		return mcptest.Config{AdminPort: c.AdminPort, HTTPPort: c.HTTPPort, HTTPSPort: 0, Grace: "10s",
			Sites: []mcptest.Site{{Port: c.HTTPPort, Body: site}}}
	}
	conf := cfg(mcptest.ResumeRoute(up, ""))
	conf.HTTPSPort = harness.CaddyPort(t)
	if err := mcptest.Load(conf); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { mcptest.Stop() })
	cl := harness.NewSession(t, c.Base(), "2025-06-18")
	resp := cl.Call(1, "count", map[string]any{"n": 8, "interval_ms": 250})
	defer resp.Body.Close()
	got := make(chan []mcptest.Event, 1)
	go func() {
		evs, _ := mcptest.ReadEvents(resp.Body, 0, 20*time.Second)
		got <- evs
	}()
	time.Sleep(500 * time.Millisecond)
	plain := cfg(mcptest.ProxyRoute(up))
	plain.HTTPSPort = conf.HTTPSPort
	if err := mcptest.Load(plain); err != nil {
		t.Fatal(err)
	}
	evs := <-got
	last := ""
	if len(evs) > 0 {
		last = evs[len(evs)-1].Data
	}
	t.Logf("%d events, last %.300s", len(evs), last)
	if !strings.Contains(last, "counted to 8") {
		t.Fatalf("the call a client was reading was cut by the reload that removed mcp_resume (%d events, last %.200s); plain reverse_proxy lets it finish within grace_period", len(evs), last)
	}
}
