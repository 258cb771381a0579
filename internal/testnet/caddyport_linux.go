package testnet

import (
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// CaddyPort returns a loopback TCP port for a Caddy listener, held for the
// life of this process by a socket bound to it (never listening) with
// SO_REUSEPORT. Caddy sets SO_REUSEPORT on its listeners, so a port that
// was merely free a moment ago (FreePort) can be bound by two Caddy
// processes of one user at once, and the kernel then splits connections
// between them: a test talks to another test's Caddy. Held, the port is
// never handed to another process's bind, while Caddy, here or in a child
// process, still binds it.
func CaddyPort() (int, error) {
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return 0, err
	}
	if err := syscall.SetsockoptInt(fd, syscall.SOL_SOCKET, unix.SO_REUSEPORT, 1); err != nil {
		syscall.Close(fd)
		return 0, err
	}
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		syscall.Close(fd)
		return 0, err
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		syscall.Close(fd)
		return 0, err
	}
	heldMu.Lock()
	held = append(held, fd) // kept open until the process exits
	heldMu.Unlock()
	return sa.(*syscall.SockaddrInet4).Port, nil
}

var (
	heldMu sync.Mutex
	held   []int
)
