package resume

import (
	"context"
	"crypto/tls"
	"net"
	"net/http"
	"runtime"
	"syscall"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// tcpPair is a real TCP connection on loopback: the server's end and the
// client's, whose receive buffer is as small as the kernel allows when
// small is set, so that what the server writes soon waits in its send queue.
func tcpPair(t *testing.T, small bool) (server, client net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	d := net.Dialer{}
	if small {
		d.Control = func(_, _ string, c syscall.RawConn) error {
			var serr error
			c.Control(func(fd uintptr) { serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 1024) })
			return serr
		}
	}
	client, err = d.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	server, err = ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { server.Close(); client.Close() })
	return server, client
}

// inlineRelays is how many relays the tap began writing itself so far.
func inlineRelays() int64 { return int64(testutil.ToFloat64(relays.WithLabelValues("tap"))) }

func TestSocketOfUnwrapsTLS(t *testing.T) {
	srv, _ := tcpPair(t, false)
	if socketOf(tls.Server(srv, &tls.Config{})) != srv.(syscall.Conn) {
		t.Error("a TLS connection's socket is the TCP connection it wraps")
	}
	type opaque struct{ net.Conn } // a wrapper that says nothing of what it wraps
	if socketOf(opaque{srv}) != nil {
		t.Error("a connection that is not a socket and wraps none it names has none")
	}
}

func TestCanWriteInline(t *testing.T) {
	h := testHandler(t)
	srv, _ := tcpPair(t, false)
	req := func(major int, withConn bool) *http.Request {
		r := post("1")
		r.ProtoMajor = major
		if withConn {
			r = r.WithContext(ConnContext(context.Background(), srv))
		}
		return r
	}
	for _, c := range []struct {
		name     string
		r        *http.Request
		expected bool
	}{
		{"HTTP/1 on a socket with an empty send queue", req(1, true), runtime.GOOS == "linux"},
		{"HTTP/2: streams share the connection's flow control", req(2, true), false},
		{"no connection known (no ConnContext)", req(1, false), false},
	} {
		if got := h.canWriteInline(c.r); got != c.expected {
			t.Errorf("%s: %v, want %v", c.name, got, c.expected)
		}
	}
}
