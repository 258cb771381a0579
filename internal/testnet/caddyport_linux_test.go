package testnet

import (
	"context"
	"fmt"
	"net"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// A port CaddyPort returns is taken for plain listeners (another process's
// FreePort or server cannot get it) and free for listeners that set
// SO_REUSEPORT as Caddy's do, on loopback or on every address.
func TestCaddyPortIsHeldForCaddy(t *testing.T) {
	port, err := CaddyPort()
	if err != nil {
		t.Fatal(err)
	}
	for _, addr := range []string{"127.0.0.1", "[::1]", ""} {
		if l, err := net.Listen("tcp", fmt.Sprintf("%s:%d", addr, port)); err == nil {
			l.Close()
			t.Fatalf("a plain listener on %q got held port %d", addr, port)
		}
	}
	reuse := net.ListenConfig{Control: func(_, _ string, c syscall.RawConn) error {
		var err error
		c.Control(func(fd uintptr) { err = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEPORT, 1) })
		return err
	}}
	for _, addr := range []string{fmt.Sprintf("127.0.0.1:%d", port), fmt.Sprintf(":%d", port)} {
		l, err := reuse.Listen(context.Background(), "tcp", addr)
		if err != nil {
			t.Fatalf("a SO_REUSEPORT listener on %s: %v", addr, err)
		}
		l.Close()
	}
	for i := 0; i < 200; i++ {
		p, err := FreePort()
		if err != nil {
			t.Fatal(err)
		}
		if p == port {
			t.Fatalf("FreePort handed out held port %d", port)
		}
	}
}
