package e2e

import (
	"context"
	"fmt"
	"net/http"
	"runtime"
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

// After a restart (memory store: the session is gone from the proxy), the
// client's standalone resume (which adopts the session under a new epoch)
// races a tools/call POST of the same session. Whichever wins, every ID
// the client was given (the gap's, which moves its cursor, and the racing
// call's) resumes: never a 400 that says the ID is not this session's.
func TestAdoptionRacingAPost(t *testing.T) {
	harness.MemoryStoreOnly(t, "adoption after a restart that lost the store")
	for round := 0; round < 6; round++ {
		c, upstream := proxyFor(t, demoserver.Options{}, "")
		rc := harness.NewSession(t, c.Base(), "2025-06-18")
		call := rc.CallToEnd(1, "count", map[string]any{"n": 1, "interval_ms": 1})
		old := call[0].ID
		harness.StopCaddy(t)
		c.Load(t, mcptest.ResumeRoute(upstream, ""))
		rc.Reconnect()
		type res struct {
			evs    []mcptest.Event
			status int
		}
		gapc, callc := make(chan res, 1), make(chan res, 1)
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			r, err := rc.Client.Resume(ctx, old)
			if err != nil {
				gapc <- res{}
				return
			}
			defer r.Body.Close()
			evs, _ := mcptest.ReadEvents(r.Body, 1, 5*time.Second)
			gapc <- res{evs, r.StatusCode}
		}()
		time.Sleep(time.Duration(round) * time.Millisecond)
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			r, err := rc.Client.Call(ctx, 2, "count", map[string]any{"n": 2, "interval_ms": 1}, "tok")
			if err != nil {
				callc <- res{}
				return
			}
			defer r.Body.Close()
			evs, _ := mcptest.ReadEvents(r.Body, 0, 5*time.Second)
			callc <- res{evs, r.StatusCode}
		}()
		gap, cl := <-gapc, <-callc
		if gap.status != 200 || len(gap.evs) == 0 || gap.evs[0].Type != "gap" {
			t.Fatalf("round %d: the resume after the restart got %d %+v, want the proxy_restarted gap", round, gap.status, gap.evs)
		}
		if cl.status != 200 || len(cl.evs) == 0 || !strings.Contains(cl.evs[len(cl.evs)-1].Data, "counted to 2") {
			t.Fatalf("round %d: the call racing the adoption got %d %+v", round, cl.status, cl.evs)
		}
		t.Logf("round %d: before the restart epoch %s; the adoption's gap %s; the racing call's events %v", round, mustParse(t, old).Epoch, gap.evs[0].ID, ids(cl.evs))
		for _, id := range append([]string{gap.evs[0].ID}, ids(cl.evs)...) {
			if id == "" {
				continue
			}
			r := rc.Resume(id)
			r.Body.Close()
			if r.StatusCode != http.StatusOK && r.StatusCode != http.StatusNoContent { // 204: the head of an ended stream
				t.Fatalf("round %d: resuming %s (the adoption's gap, or the racing call's event) got %d", round, id, r.StatusCode)
			}
		}
		harness.StopCaddy(t)
	}
}

func ids(evs []mcptest.Event) []string {
	var out []string
	for _, ev := range evs {
		out = append(out, ev.ID)
	}
	return out
}

// Reloads in a tight loop (a changed keepalive: the zone is kept) while a
// standalone stream and a call run, behind an upstream that allows one GET
// per session: the call's client gets every event once, in order, across
// them; the upstream never sees a second GET of the session; and nothing
// piles up (goroutines come back to where they were).
func TestReloadLoopWithStandaloneAndCalls(t *testing.T) {
	up := &mcptest.OneGET{Next: demoserver.New(demoserver.Options{EventStore: true})}
	upstream := harness.StartHandler(t, up)
	c := harness.StartCaddy(t, mcptest.ResumeRoute(upstream, "keepalive 10s"))
	cl := harness.NewSession(t, c.Base(), "2025-11-25")
	g := cl.Request("GET", "", nil)
	harness.ReadEvents(t, g, 1)
	g.Body.Close()
	harness.WaitFor(t, 10*time.Second, "the upstream GET", func() bool { return up.Open(cl.SessionID) == 1 })
	time.Sleep(500 * time.Millisecond)
	before := runtime.NumGoroutine()
	resp := cl.Call(1, "count", map[string]any{"n": 40, "interval_ms": 50})
	got := make(chan []mcptest.Event, 1)
	go func() {
		evs, _ := mcptest.ReadEvents(resp.Body, 0, 30*time.Second)
		got <- evs
	}()
	for i := 0; i < 30; i++ {
		c.Load(t, mcptest.ResumeRoute(upstream, fmt.Sprintf("keepalive %ds", 10+i%2)))
	}
	evs := <-got
	resp.Body.Close()
	cl.Reconnect()
	if len(evs) == 0 || !strings.Contains(evs[len(evs)-1].Data, "counted to 40") {
		t.Fatalf("the call across 30 reloads: %d events, last %+v", len(evs), evs[len(evs)-1:])
	}
	if _, err := harness.CheckIDs(evs); err != nil {
		t.Fatalf("the call's IDs across the reloads: %v", err)
	}
	gets, lags := up.Counts()
	var after int
	for i := 0; i < 50; i++ {
		time.Sleep(100 * time.Millisecond)
		if after = runtime.NumGoroutine(); after <= before+10 {
			break
		}
	}
	t.Logf("%d events; %d upstream GETs, %d 409; goroutines %d before, %d after", len(evs), gets, len(lags), before, after)
	if len(lags) > 0 || up.Open(cl.SessionID) != 1 {
		t.Errorf("the upstream saw %d conflicting GETs, %d open now; want none, and one", len(lags), up.Open(cl.SessionID))
	}
	if after > before+10 {
		t.Errorf("goroutines: %d before the reloads, %d after", before, after)
	}
}
