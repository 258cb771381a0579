// Package harness runs the pieces of an end-to-end test for real: Caddy
// in-process with the mcp_resume module, the demo MCP server (official Go
// SDK, no event store) on a real socket, and official-SDK clients whose TCP
// connections a test can cut.
package harness

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	_ "github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	_ "github.com/caddyserver/caddy/v2/modules/standard"

	_ "github.com/mcpresume/caddy-mcp-resume"
	"github.com/mcpresume/caddy-mcp-resume/internal/demoserver"
)

// Main is the TestMain of every package that starts Caddy: it runs the
// tests with Caddy's home, config and data directories in a temporary
// directory (so no test reads or writes the user's), removes that, and exits
// with the tests' code.
func Main(m *testing.M) {
	cleanup := isolate()
	code := m.Run()
	cleanup()
	os.Exit(code)
}

// isolate points Caddy's home, config and data directories at a temporary
// directory; Main calls it before anything starts Caddy.
func isolate() (cleanup func()) {
	dir, err := os.MkdirTemp("", "mcp-resume-test-")
	if err != nil {
		panic(err)
	}
	for _, k := range []string{"HOME", "XDG_CONFIG_HOME", "XDG_DATA_HOME"} {
		os.Setenv(k, dir)
	}
	return func() { os.RemoveAll(dir) }
}

// FreePort returns a loopback TCP port that was free a moment ago.
func FreePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// Caddy is an in-process Caddy. Only one runs per test process at a time.
type Caddy struct {
	HTTPPort  int
	AdminPort int
}

// Base is the proxy's base URL, e.g. http://127.0.0.1:PORT.
func (c *Caddy) Base() string { return fmt.Sprintf("http://127.0.0.1:%d", c.HTTPPort) }

// Admin is the admin endpoint's base URL.
func (c *Caddy) Admin() string { return fmt.Sprintf("http://localhost:%d", c.AdminPort) }

// StartCaddy loads a Caddyfile site body (what goes inside `:PORT { }`) into
// an in-process Caddy, with global options suited to tests, and stops Caddy
// when the test ends.
func StartCaddy(t testing.TB, site string) *Caddy {
	t.Helper()
	c := &Caddy{HTTPPort: FreePort(t), AdminPort: FreePort(t)}
	c.Load(t, site)
	t.Cleanup(func() {
		if err := caddy.Stop(); err != nil {
			t.Logf("stopping caddy: %v", err)
		}
	})
	return c
}

// Load (re)loads the config, as `caddy reload` does.
func (c *Caddy) Load(t testing.TB, site string) {
	t.Helper()
	c.LoadWithGlobal(t, "", site)
}

// LoadWithGlobal is Load with extra lines in the global options block (e.g.
// "metrics" to turn on Caddy's own HTTP metrics).
func (c *Caddy) LoadWithGlobal(t testing.TB, global, site string) {
	t.Helper()
	cfg := fmt.Sprintf(`{
	admin localhost:%d
	http_port %d
	https_port %d
	auto_https off
	persist_config off
	grace_period 1s
	skip_install_trust
	log {
		level ERROR
	}
%s
}
:%d {
%s
}
`, c.AdminPort, c.HTTPPort, FreePort(t), global, c.HTTPPort, site)
	js, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(cfg), nil) // warnings: only "input is not formatted"
	if err != nil {
		t.Fatalf("adapting Caddyfile: %v\n%s", err, cfg)
	}
	if err := caddy.Load(js, true); err != nil {
		t.Fatalf("loading config: %v", err)
	}
	waitListening(t, c.HTTPPort)
}

// Site is a Caddyfile site body (what goes inside `:PORT { }`) as the
// README's typical use has it: on /mcp*, mcp_resume with the given options
// (the lines of its block, "" for none) in front of reverse_proxy to
// upstream (host:port).
func Site(upstream, moduleOptions string) string {
	if moduleOptions != "" {
		moduleOptions = "{\n" + moduleOptions + "\n}"
	}
	return fmt.Sprintf(`	route /mcp* {
		mcp_resume %s
		reverse_proxy %s
	}`, moduleOptions, upstream)
}

func waitListening(t testing.TB, port int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		conn, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		if err == nil {
			conn.Close()
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("nothing listens on port %d", port)
}

// StartDemo serves the demo MCP server on a real loopback socket and returns
// its address (host:port).
func StartDemo(t testing.TB, opts demoserver.Options) string {
	t.Helper()
	mux := http.NewServeMux()
	mux.Handle("/mcp", demoserver.New(opts))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "http://")
}

// CuttableTransport is an http.Transport whose connections a test can cut,
// as a flaky network, a load balancer or a Wi-Fi switch would.
type CuttableTransport struct {
	*http.Transport
	mu    sync.Mutex
	conns map[net.Conn]bool
}

// NewCuttableTransport returns a transport that dials loopback for real.
func NewCuttableTransport() *CuttableTransport { return NewCuttableTransportRcvbuf(0) }

// NewCuttableTransportRcvbuf is NewCuttableTransport whose sockets get the
// given receive buffer (SO_RCVBUF, set before connecting so the advertised
// window follows it; 0 leaves the kernel's autotuning alone).
func NewCuttableTransportRcvbuf(rcvbuf int) *CuttableTransport {
	ct := &CuttableTransport{conns: make(map[net.Conn]bool)}
	d := &net.Dialer{}
	if rcvbuf > 0 {
		d.Control = func(_, _ string, rc syscall.RawConn) error {
			var serr error
			err := rc.Control(func(fd uintptr) {
				serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, rcvbuf)
			})
			if err != nil {
				return err
			}
			return serr
		}
	}
	ct.Transport = &http.Transport{
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			c, err := d.DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			ct.mu.Lock()
			ct.conns[c] = true
			ct.mu.Unlock()
			return &trackedConn{Conn: c, ct: ct}, nil
		},
		DisableCompression: true,
	}
	return ct
}

type trackedConn struct {
	net.Conn
	ct *CuttableTransport
}

func (c *trackedConn) Close() error {
	c.ct.mu.Lock()
	delete(c.ct.conns, c.Conn)
	c.ct.mu.Unlock()
	return c.Conn.Close()
}

// Cut closes every open connection: with reset, as an RST (SO_LINGER 0), else
// as a clean FIN. The client sees its streams break and reconnects.
func (ct *CuttableTransport) Cut(reset bool) int {
	ct.mu.Lock()
	conns := make([]net.Conn, 0, len(ct.conns))
	for c := range ct.conns {
		conns = append(conns, c)
		delete(ct.conns, c)
	}
	ct.mu.Unlock()
	for _, c := range conns {
		if tc, ok := c.(*net.TCPConn); ok && reset {
			tc.SetLinger(0)
		}
		c.Close()
	}
	return len(conns)
}

// Open returns the number of open connections.
func (ct *CuttableTransport) Open() int {
	ct.mu.Lock()
	defer ct.mu.Unlock()
	return len(ct.conns)
}

// StopCaddy stops the in-process Caddy, as a process restart would; Load
// starts it again.
func StopCaddy(t testing.TB) {
	t.Helper()
	if err := caddy.Stop(); err != nil {
		t.Fatalf("stopping caddy: %v", err)
	}
}

// StartHandler serves h on a real loopback socket and returns host:port.
func StartHandler(t testing.TB, h http.Handler) string {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "http://")
}
