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

// The embedded JetStream server holds every session's events and the zone
// secret that keys credential fingerprints and epochs, and has no users:
// Caddy talks to it in-process, and it listens on no port another local
// process (another user, a sidecar, the MCP server itself) could reach.
//
// Only the replica's own listeners are looked at (its open sockets, by
// inode): go test runs other packages' tests beside this one, and their
// NATS servers listen on this machine too.
func TestEmbeddedNATSListensOnNoPort(t *testing.T) {
	d := deploy(t, 1, "store nats {\n embedded\n}", demoserver.Options{})
	a := d.replicas[0]
	c := d.client("2025-11-25")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := c.Session.CallTool(ctx, mcptest.CountParams(2, 10)); err != nil {
		t.Fatal(err) // the store works: the call went through it
	}
	ports, err := mcptest.ListeningPorts(a.Pid())
	if err != nil {
		t.Fatal(err)
	}
	known := map[int]bool{a.Config.AdminPort: true, a.Config.HTTPPort: true, a.Config.HTTPSPort: true}
	for _, s := range a.Config.Sites {
		known[s.Port] = true
		if !ports[s.Port] { // the scan sees the replica's sockets
			t.Fatalf("the replica's listeners %v lack its site's port %d", ports, s.Port)
		}
	}
	// Any other listener is a port the embedded server (or anything else
	// in the replica) opened: an error, whatever it speaks first.
	for p := range ports {
		if known[p] {
			continue
		}
		speaks := "nothing within 300ms"
		if conn, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", p), 300*time.Millisecond); err == nil {
			conn.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
			if line, _ := bufio.NewReader(conn).ReadString('\n'); line != "" {
				speaks = fmt.Sprintf("%.120q", line)
			}
			conn.Close()
		}
		if strings.HasPrefix(speaks, `"INFO `) {
			t.Errorf("port %d speaks NATS to any local process: %s", p, speaks)
		} else {
			t.Errorf("the replica listens on port %d, none of its configured ones (it speaks %s)", p, speaks)
		}
	}
}
