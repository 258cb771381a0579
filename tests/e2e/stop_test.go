package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/internal/demoserver"
	"github.com/mcpresume/caddy-mcp-resume/internal/mcptest"
	"github.com/mcpresume/caddy-mcp-resume/tests/harness"
)

// Stopping Caddy must not wait for detached upstream reads: they are
// cancelled when Caddy starts stopping (with the JetStream store, once its
// drain_timeout passed: a stopping replica drains them into the shared
// store that long, and no longer). This runs the real binary, since
// `caddy stop` exits the process.
func TestStopWithDetachedStreamsIsPrompt(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a caddy binary; skipped in -short mode")
	}
	dir := t.TempDir()
	bin, err := mcptest.BuildCaddy(dir, false)
	if err != nil {
		t.Fatal(err)
	}
	upstream := harness.StartDemo(t, demoserver.Options{})
	httpPort, adminPort := harness.CaddyPort(t), harness.CaddyPort(t)
	harness.NewStoreDir(t) // the JetStream leg's store block names it
	route, limit := mcptest.ResumeRoute(upstream, ""), 20*time.Second
	if harness.SharedStore() {
		// The default drain_timeout (20s) would be the whole limit; a
		// short one shows the drain ends when it says.
		const drain = 2 * time.Second
		route = fmt.Sprintf("\troute /mcp* {\n mcp_resume {\n store nats {\n embedded {env.MCPR_TEST_STORE_DIR}\n drain_timeout %v\n }\n }\n reverse_proxy %s\n }", drain, upstream)
		limit = drain + 10*time.Second
	}
	cfg := filepath.Join(dir, "Caddyfile")
	os.WriteFile(cfg, []byte(fmt.Sprintf(`{
	admin localhost:%d
	http_port %d
	auto_https off
	persist_config off
}
:%d {
%s
}
`, adminPort, httpPort, httpPort, route)), 0o600)
	run := exec.Command(bin, "run", "--config", cfg)
	run.Env = append(os.Environ(), "HOME="+dir, "XDG_CONFIG_HOME="+dir, "XDG_DATA_HOME="+dir)
	if err := run.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- run.Wait() }()
	t.Cleanup(func() { run.Process.Kill() })

	base := fmt.Sprintf("http://127.0.0.1:%d", httpPort)
	probe := harness.NewRawClient(t, base, "")
	harness.WaitFor(t, 20*time.Second, "caddy to listen", func() bool {
		req, _ := probe.HTTP.Get(base + "/")
		if req != nil {
			req.Body.Close()
		}
		return req != nil
	})
	rc := harness.NewSession(t, base, "2025-06-18")
	// Detached streams: the tool runs for a minute; its clients leave.
	for i := 1; i <= 3; i++ {
		startCut(t, rc, i, 120, 1, 500)
	}
	start := time.Now()
	stop := exec.Command(bin, "stop", "--address", fmt.Sprintf("localhost:%d", adminPort))
	stop.Env = run.Env
	if out, err := stop.CombinedOutput(); err != nil {
		t.Fatalf("caddy stop: %v\n%s", err, out)
	}
	select {
	case <-exited:
		t.Logf("caddy exited %v after stop, with 3 detached streams", time.Since(start).Round(time.Millisecond))
	case <-time.After(limit):
		t.Fatalf("caddy did not exit within %v of `caddy stop`: detached streams held it (the tool needs 60s)", limit)
	}
}
