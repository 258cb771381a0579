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

// Listening counts the listeners on a port, two side by side as a Caddy
// reload has them (SO_REUSEPORT), and not a socket merely holding it.
func TestListeningCountsListenersSideBySide(t *testing.T) {
	port, err := CaddyPort() // held by a bound socket that does not listen
	if err != nil {
		t.Fatal(err)
	}
	count := func(want int) {
		t.Helper()
		if n, err := Listening(port); err != nil || n != want {
			t.Fatalf("Listening(%d) = %d, %v; want %d", port, n, err, want)
		}
	}
	count(0)
	reuse := net.ListenConfig{Control: func(_, _ string, c syscall.RawConn) error {
		var err error
		c.Control(func(fd uintptr) { err = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEPORT, 1) })
		return err
	}}
	old, err := reuse.Listen(context.Background(), "tcp", fmt.Sprintf(":%d", port))
	if err != nil {
		t.Fatal(err)
	}
	count(1)
	cur, err := reuse.Listen(context.Background(), "tcp", fmt.Sprintf(":%d", port))
	if err != nil {
		t.Fatal(err)
	}
	defer cur.Close()
	count(2)
	old.Close()
	count(1)
}
