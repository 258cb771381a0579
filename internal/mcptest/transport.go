package mcptest

import (
	"context"
	"net"
	"net/http"
	"sync"
	"syscall"
)

// CuttableTransport is an http.Transport whose connections a test can cut,
// as a flaky network, a load balancer or a Wi-Fi switch would.
type CuttableTransport struct {
	*http.Transport
	conns connSet
}

// NewCuttableTransport returns a transport that dials loopback for real,
// with sockets of the given receive buffer (SO_RCVBUF, set before
// connecting so the advertised window follows it; 0 leaves the kernel's
// autotuning alone).
func NewCuttableTransport(rcvbuf int) *CuttableTransport {
	ct := &CuttableTransport{}
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
			ct.conns.add(c)
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
	c.ct.conns.remove(c.Conn)
	return c.Conn.Close()
}

// Cut closes every open connection: with reset, as an RST (SO_LINGER 0), else
// as a clean FIN. The client sees its streams break and reconnects. It
// returns how many it closed.
func (ct *CuttableTransport) Cut(reset bool) int { return ct.conns.cut(reset) }

// Open returns the number of open connections.
func (ct *CuttableTransport) Open() int { return ct.conns.len() }

// GatedTransport passes requests to Next unless it is held: then new
// requests wait (as behind a network that is down) until Release or their
// context ends.
type GatedTransport struct {
	Next http.RoundTripper

	mu   sync.Mutex
	gate chan struct{} // nil: open
	held int
}

// Hold makes new requests wait.
func (g *GatedTransport) Hold() {
	g.mu.Lock()
	if g.gate == nil {
		g.gate = make(chan struct{})
	}
	g.mu.Unlock()
}

// Release lets waiting and new requests through.
func (g *GatedTransport) Release() {
	g.mu.Lock()
	if g.gate != nil {
		close(g.gate)
		g.gate = nil
	}
	g.mu.Unlock()
}

// Held returns the number of requests that waited at the gate so far.
func (g *GatedTransport) Held() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.held
}

// RoundTrip implements http.RoundTripper.
func (g *GatedTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	g.mu.Lock()
	gate := g.gate
	if gate != nil {
		g.held++
	}
	g.mu.Unlock()
	if gate != nil {
		select {
		case <-gate:
		case <-r.Context().Done():
			return nil, r.Context().Err()
		}
	}
	return g.Next.RoundTrip(r)
}

// Listen listens on a loopback port. With sndbuf > 0 every accepted
// connection gets that send buffer (SO_SNDBUF; the kernel doubles it and
// turns off its autotuning), so the bytes an upstream can park in its own
// kernel buffer while nobody reads are small and known.
func Listen(sndbuf int) (net.Listener, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil || sndbuf <= 0 {
		return l, err
	}
	return &sndbufListener{Listener: l, sndbuf: sndbuf}, nil
}

type sndbufListener struct {
	net.Listener
	sndbuf int
}

func (l *sndbufListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	if tc, ok := c.(*net.TCPConn); ok {
		tc.SetWriteBuffer(l.sndbuf)
	}
	return c, nil
}
