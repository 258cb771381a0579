package shared

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/internal/demoserver"
	"github.com/mcpresume/caddy-mcp-resume/internal/mcptest"
)

// listening returns the TCP ports in LISTEN state on this machine.
func listening(t *testing.T) map[int]bool {
	socks, err := mcptest.TCPSockets()
	if err != nil {
		t.Fatal(err)
	}
	out := map[int]bool{}
	for _, s := range socks {
		if s.State == 0x0A {
			out[s.LocalPort] = true
		}
	}
	return out
}

// The embedded JetStream server holds every session's events and the zone
// secret that keys credential fingerprints and epochs, and has no users:
// Caddy talks to it in-process, and it listens on no port another local
// process (another user, a sidecar, the MCP server itself) could reach.
//
// Not parallel: it scans the ports listening on this machine, and the
// other tests' servers would be among them.
func TestEmbeddedNATSListensOnNoPort(t *testing.T) {
	before := listening(t)
	d := deploy(t, 1, "store nats {\n embedded\n}", demoserver.Options{})
	a := d.replicas[0]
	c := d.client("2025-11-25")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := c.Session.CallTool(ctx, mcptest.CountParams(2, 10)); err != nil {
		t.Fatal(err) // the store works: the call went through it
	}
	known := map[int]bool{a.Config.AdminPort: true, a.Config.HTTPPort: true, a.Config.HTTPSPort: true}
	for _, s := range a.Config.Sites {
		known[s.Port] = true
	}
	for p := range listening(t) {
		if before[p] || known[p] {
			continue
		}
		conn, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", p), 300*time.Millisecond)
		if err != nil {
			continue
		}
		conn.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
		line, _ := bufio.NewReader(conn).ReadString('\n')
		conn.Close()
		if strings.HasPrefix(line, "INFO ") {
			t.Errorf("port %d speaks NATS to any local process: %.120s", p, line)
		}
	}
}
