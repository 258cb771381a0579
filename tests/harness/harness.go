// Package harness runs the pieces of an end-to-end test for real: Caddy
// in-process with the mcp_resume module, the demo MCP server (official Go
// SDK, no event store) or an mcptest.Upstream on a real socket, and raw
// clients. It wraps internal/mcptest for tests: where the kit returns an
// error, these helpers fail the test, and what they start stops when the
// test ends.
package harness

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"testing"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/buffer"
	"github.com/mcpresume/caddy-mcp-resume/internal/demoserver"
	"github.com/mcpresume/caddy-mcp-resume/internal/mcptest"
	"github.com/mcpresume/caddy-mcp-resume/internal/testnet"
)

// SharedStore reports whether this run of the suite uses the JetStream
// store, for the few answers that differ: a restart loses nothing.
func SharedStore() bool { return mcptest.StoreBlock != "" }

// MemoryStoreOnly skips a test in the JetStream run of a suite: for what
// only the memory store promises (retained_bytes is this process's heap).
func MemoryStoreOnly(t testing.TB, why string) {
	t.Helper()
	if SharedStore() {
		t.Skip("memory store only: " + why)
	}
}

// SharedStoreOnly skips a test in the memory-store leg of a suite, saying
// why; the JetStream leg runs it.
func SharedStoreOnly(t testing.TB, why string) {
	t.Helper()
	if !SharedStore() {
		t.Skip("JetStream store only (its leg of this suite runs it): " + why)
	}
}

// storeDirEnv names the embedded JetStream directory of the Caddy being
// started: a new one per StartCaddy, the same across its reloads.
const storeDirEnv = "MCPR_TEST_STORE_DIR"

// NewStoreDir gives the next Caddy started (in-process or as a process,
// which inherits the environment) a new embedded JetStream directory, in
// the JetStream leg of a suite: the store block of mcptest.ResumeRoute
// names it. StartCaddy calls it; a test that runs Caddy otherwise must.
func NewStoreDir(t testing.TB) {
	t.Helper()
	if SharedStore() {
		os.Setenv(storeDirEnv, t.TempDir())
	}
}

// FreePort returns a loopback TCP port that was free a moment ago.
func FreePort(t testing.TB) int {
	t.Helper()
	p, err := testnet.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// CaddyPort returns a loopback TCP port for a Caddy listener, held for
// this process's life so no other test process's Caddy shares it (see
// testnet.CaddyPort).
func CaddyPort(t testing.TB) int {
	t.Helper()
	p, err := testnet.CaddyPort()
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// Caddy is the in-process Caddy. Only one runs per test process at a time.
type Caddy struct {
	HTTPPort  int
	AdminPort int
}

// Base is the proxy's base URL, e.g. http://127.0.0.1:PORT.
func (c *Caddy) Base() string { return fmt.Sprintf("http://127.0.0.1:%d", c.HTTPPort) }

// Admin is the admin endpoint's base URL.
func (c *Caddy) Admin() string { return fmt.Sprintf("http://localhost:%d", c.AdminPort) }

// StartCaddy loads a Caddyfile site body (what goes inside `:PORT { }`, e.g.
// mcptest.ResumeRoute) into the in-process Caddy and stops Caddy when the
// test ends.
func StartCaddy(t testing.TB, site string) *Caddy {
	t.Helper()
	return StartCaddyWithSites(t, "", site)
}

// StartCaddyWithGlobal is StartCaddy with extra lines in the global options
// block (e.g. `servers { protocols h1 h2c }`).
func StartCaddyWithGlobal(t testing.TB, global, site string) *Caddy {
	t.Helper()
	return StartCaddyWithSites(t, global, site)
}

// StartCaddyWithSites is StartCaddy with more sites on ports of their own.
func StartCaddyWithSites(t testing.TB, global, site string, more ...mcptest.Site) *Caddy {
	t.Helper()
	c := &Caddy{HTTPPort: CaddyPort(t), AdminPort: CaddyPort(t)}
	NewStoreDir(t)
	err := mcptest.Load(mcptest.Config{
		AdminPort: c.AdminPort, HTTPPort: c.HTTPPort, HTTPSPort: CaddyPort(t), Global: global,
		Sites: append([]mcptest.Site{{Port: c.HTTPPort, Body: site}}, more...),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := mcptest.Stop(); err != nil {
			t.Logf("stopping caddy: %v", err)
		}
	})
	return c
}

// Load (re)loads the config, as `caddy reload` does. The old server closes
// its idle keep-alive connections: a client must drop its own (see
// RawClient.Reconnect), or its next POST may fail with EOF.
func (c *Caddy) Load(t testing.TB, site string) {
	t.Helper()
	c.LoadWithGlobal(t, "", site)
}

// LoadWithGlobal is Load with extra lines in the global options block (e.g.
// "metrics" to turn on Caddy's own HTTP metrics).
func (c *Caddy) LoadWithGlobal(t testing.TB, global, site string) {
	t.Helper()
	err := mcptest.Load(mcptest.Config{
		AdminPort: c.AdminPort, HTTPPort: c.HTTPPort, HTTPSPort: CaddyPort(t), Global: global,
		Sites: []mcptest.Site{{Port: c.HTTPPort, Body: site}},
	})
	if err != nil {
		t.Fatal(err)
	}
	c.awaitOldListenerClosed(t)
}

// awaitOldListenerClosed waits until only the new server listens on the
// HTTP port. Caddy's reload returns once the old server's shutdown has
// begun (its own comment: the scheduler may still pause it before it
// closes its listener), and the old and new listen side by side
// (SO_REUSEPORT) until then: a connection the kernel queues on the old
// one is reset as it closes. A test's POST right after a reload failed so
// (a connect reset in a full run; a reset read and an EOF in runs of one
// test just rebuilt). A real client would retry; a test wants the reload
// done. Where listeners cannot be counted (not Linux), it returns at once.
func (c *Caddy) awaitOldListenerClosed(t testing.TB) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(2 * time.Millisecond) {
		n, err := testnet.Listening(c.HTTPPort)
		if err != nil || n <= 1 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the old server still listens on port %d 10 s after the reload (%d listeners)", c.HTTPPort, n)
		}
	}
}

// StopCaddy stops the in-process Caddy, as a process restart would; Load
// starts it again.
func StopCaddy(t testing.TB) {
	t.Helper()
	if err := mcptest.Stop(); err != nil {
		t.Fatalf("stopping caddy: %v", err)
	}
}

// Sessions returns what the admin API (GET /mcp_resume/sessions) shows.
func (c *Caddy) Sessions() ([]buffer.SessionInfo, error) { return mcptest.Sessions(c.Admin()) }

// Metrics scrapes the admin endpoint's /metrics.
func (c *Caddy) Metrics() (mcptest.Metrics, error) {
	return mcptest.ScrapeMetrics(c.Admin() + "/metrics")
}

// StartDemo serves the demo MCP server on a real loopback socket and returns
// its address (host:port).
func StartDemo(t testing.TB, opts demoserver.Options) string {
	t.Helper()
	mux := http.NewServeMux()
	mux.Handle("/mcp", demoserver.New(opts))
	return StartHandler(t, mux)
}

// StartHandler serves h on a real loopback socket and returns host:port.
func StartHandler(t testing.TB, h http.Handler) string {
	t.Helper()
	return StartHandlerSndbuf(t, h, 0)
}

// StartHandlerSndbuf is StartHandler whose accepted connections get the
// given send buffer (see mcptest.Listen).
func StartHandlerSndbuf(t testing.TB, h http.Handler, sndbuf int) string {
	t.Helper()
	l, err := mcptest.Listen(sndbuf)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(h)
	srv.Listener.Close()
	srv.Listener = l
	srv.Start()
	t.Cleanup(func() { closeServer(srv) })
	return l.Addr().String()
}

// closeServer ends a test's upstream when the test is over, without
// waiting for its handlers to end on their own: a call the proxy still
// reads (its client vanished, its stream stalled on a full log) would hold
// srv.Close until the proxy lets go, and a Caddy stopped in-process drains
// its zone's running calls for up to drain_timeout (20 s) before it does.
// The upstream's connections are cut instead, so the handlers' writes fail
// and they return.
func closeServer(srv *httptest.Server) {
	srv.Listener.Close() // no new connections while the open ones are cut
	srv.CloseClientConnections()
	srv.Close()
}

// WaitFor polls cond every 20ms until it holds, and fails the test (saying
// what it waited for) if it does not within timeout.
func WaitFor(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	if !mcptest.Eventually(timeout, 20*time.Millisecond, cond) {
		t.Fatalf("timed out waiting for %s", what)
	}
}

// AdminSessions is c.Sessions for a test's own goroutine.
func (c *Caddy) AdminSessions(t testing.TB) []buffer.SessionInfo {
	t.Helper()
	s, err := c.Sessions()
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// ConnectSDK connects an official Go SDK client (whose connections the
// test can cut) to endpoint within 10s, and closes its session when the
// test ends.
func ConnectSDK(t testing.TB, endpoint, version string) *mcptest.SDKClient {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := mcptest.ConnectSDK(ctx, endpoint, version, 0)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(func() { c.Session.Close() })
	return c
}

// AssertOnceInOrder fails the test unless got is 1..n, each once, in order.
func AssertOnceInOrder(t testing.TB, got []float64, n int) {
	t.Helper()
	if err := mcptest.OnceInOrder(got, n); err != nil {
		t.Fatal(err)
	}
}
