package e2e

import (
	"context"
	"net"
	"net/http"
	"net/http/httptrace"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/internal/demoserver"
	"github.com/mcpresume/caddy-mcp-resume/internal/mcptest"
	"github.com/mcpresume/caddy-mcp-resume/tests/harness"
)

// review52Caddy starts Caddy (h1 + h2c) logging at DEBUG into a file.
func review52Caddy(t *testing.T) (*harness.Caddy, string) {
	t.Helper()
	upstream := harness.StartDemo(t, demoserver.Options{})
	c := &harness.Caddy{HTTPPort: harness.CaddyPort(t), AdminPort: harness.CaddyPort(t)}
	harness.NewStoreDir(t)
	logf := filepath.Join(t.TempDir(), "caddy.log")
	err := mcptest.Load(mcptest.Config{
		AdminPort: c.AdminPort, HTTPPort: c.HTTPPort, HTTPSPort: harness.CaddyPort(t),
		LogLevel: "DEBUG\n\t\toutput file " + logf,
		Global:   "servers {\n\t\tprotocols h1 h2c\n\t}",
		Sites:    []mcptest.Site{{Port: c.HTTPPort, Body: mcptest.ResumeRoute(upstream, "")}},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { mcptest.Stop() })
	return c, logf
}

func review52Noise(t *testing.T, logf string) {
	t.Helper()
	b, _ := os.ReadFile(logf)
	var bad []string
	for _, l := range strings.Split(string(b), "\n") {
		ll := strings.ToLower(l)
		if strings.Contains(ll, "panic") || strings.Contains(ll, "hijack") || strings.Contains(ll, "superfluous") ||
			strings.Contains(ll, `"level":"error"`) || strings.Contains(ll, "unexpected") {
			bad = append(bad, l)
		}
	}
	t.Logf("log: %d lines", strings.Count(string(b), "\n"))
	if len(bad) > 0 {
		t.Errorf("log noise (%d lines):\n%s", len(bad), strings.Join(bad[:min(len(bad), 15)], "\n"))
	}
}

// An h2c client cancels calls' streams (and a standalone GET) while other
// calls run on the same connection: the proxy's cut of a gone client
// resets that stream only; the others finish, the connection stays in
// use, and the log shows no panic, hijack or error.
func TestReview52H2CCancelOneStream(t *testing.T) {
	c, logf := review52Caddy(t)
	var p http.Protocols
	p.SetUnencryptedHTTP2(true)
	tr := &http.Transport{Protocols: &p}
	t.Cleanup(tr.CloseIdleConnections)
	var conns atomic.Int32
	tr.DialContext = func(ctx context.Context, n, a string) (net.Conn, error) {
		conns.Add(1)
		return (&net.Dialer{}).DialContext(ctx, n, a)
	}
	for _, version := range []string{"2025-11-25", "2025-06-18"} {
		h2 := harness.NewRawClientOver(t, c.Base(), version, &http.Client{Transport: tr, Timeout: 30 * time.Second})
		h2.Initialize()
		var wg sync.WaitGroup
		for i := range 5 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				// B: a long call that must finish.
				resp, err := h2.Client.Call(context.Background(), 100+i, "count", map[string]any{"n": 6, "interval_ms": 100}, "tok")
				if err != nil {
					t.Errorf("B call: %v", err)
					return
				}
				defer resp.Body.Close()
				evs, err := mcptest.ReadEvents(resp.Body, 0, 20*time.Second)
				if err != nil || len(evs) == 0 || !strings.Contains(evs[len(evs)-1].Data, `"result"`) {
					t.Errorf("%s: B call %d broke: %v, %d events", version, i, err, len(evs))
				}
			}()
			wg.Add(1)
			go func() {
				defer wg.Done()
				// A: cancelled after its first event (or right away, for odd i).
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				resp, err := h2.Client.Call(ctx, 200+i, "count", map[string]any{"n": 20, "interval_ms": 100}, "tok")
				if err != nil {
					t.Errorf("A call: %v", err)
					return
				}
				if i%2 == 0 {
					mcptest.ReadEvents(resp.Body, 1, 5*time.Second)
				}
				cancel()
				resp.Body.Close()
			}()
		}
		wg.Wait()
		// A GET standalone stream cancelled too.
		ctx, cancel := context.WithCancel(context.Background())
		resp, err := h2.Client.Do(ctx, http.MethodGet, "", nil)
		if err == nil {
			time.Sleep(200 * time.Millisecond)
			cancel()
			resp.Body.Close()
		}
		cancel()
		reused := false
		trace := &httptrace.ClientTrace{GotConn: func(i httptrace.GotConnInfo) { reused = i.Reused }}
		r2, err := h2.Client.Call(httptrace.WithClientTrace(context.Background(), trace), 999, "count", map[string]any{"n": 1, "interval_ms": 0}, "tok")
		if err != nil {
			t.Fatalf("after: %v", err)
		}
		evs, err := mcptest.ReadEvents(r2.Body, 0, 20*time.Second)
		r2.Body.Close()
		if err != nil || len(evs) == 0 {
			t.Fatalf("after: %v %d", err, len(evs))
		}
		t.Logf("%s: dials so far %d, last reused %v", version, conns.Load(), reused)
	}
	if n := conns.Load(); n != 1 {
		t.Errorf("h2c client dialed %d connections, want 1", n)
	}
	review52Noise(t, logf)
}
