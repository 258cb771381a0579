package testnet

import (
	"os"
	"strconv"
	"strings"
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
	// On every address (IPv6 and IPv4 at once where the machine has IPv6),
	// as Caddy binds `:PORT`: a plain bind of the port on any address fails.
	port, err := holdPort(syscall.AF_INET6, &syscall.SockaddrInet6{})
	if err != nil {
		port, err = holdPort(syscall.AF_INET, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}})
	}
	return port, err
}

func holdPort(family int, addr syscall.Sockaddr) (int, error) {
	fd, err := syscall.Socket(family, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return 0, err
	}
	if family == syscall.AF_INET6 {
		err = syscall.SetsockoptInt(fd, syscall.IPPROTO_IPV6, syscall.IPV6_V6ONLY, 0)
	}
	if err == nil {
		err = syscall.SetsockoptInt(fd, syscall.SOL_SOCKET, unix.SO_REUSEPORT, 1)
	}
	if err == nil {
		err = syscall.Bind(fd, addr)
	}
	var sa syscall.Sockaddr
	if err == nil {
		sa, err = syscall.Getsockname(fd)
	}
	if err != nil {
		syscall.Close(fd)
		return 0, err
	}
	heldMu.Lock()
	held = append(held, fd) // kept open until the process exits
	heldMu.Unlock()
	switch a := sa.(type) {
	case *syscall.SockaddrInet6:
		return a.Port, nil
	case *syscall.SockaddrInet4:
		return a.Port, nil
	}
	return 0, syscall.EAFNOSUPPORT
}

var (
	heldMu sync.Mutex
	held   []int
)

// Listening counts the sockets listening on TCP port (IPv4 and IPv6), as
// /proc/net shows them: after a Caddy reload, the old server's listener
// stays beside the new one (SO_REUSEPORT) until its shutdown closes it.
func Listening(port int) (int, error) {
	n := 0
	for _, f := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		b, err := os.ReadFile(f)
		if os.IsNotExist(err) {
			continue
		}
		if err != nil {
			return 0, err
		}
		for _, line := range strings.Split(string(b), "\n")[1:] {
			fields := strings.Fields(line)
			if len(fields) < 4 || fields[3] != "0A" { // TCP_LISTEN
				continue
			}
			_, hexPort, ok := strings.Cut(fields[1], ":")
			if p, err := strconv.ParseUint(hexPort, 16, 16); ok && err == nil && int(p) == port {
				n++
			}
		}
	}
	return n, nil
}
