package mcptest

import (
	"io"
	"net"
	"sync"
	"sync/atomic"
)

// Relay is a TCP relay whose connections a test can cut, as a dropped
// network path or a restarting upstream would: the proxy dials the relay,
// which dials the upstream and copies both ways. Its target can change, so
// it also serves as a load balancer in front of proxy replicas.
type Relay struct {
	ln       net.Listener
	targets  atomic.Pointer[[]string]
	next     atomic.Uint64
	accepted atomic.Int64
	mu       sync.Mutex
	conns    map[net.Conn]bool
}

// NewRelay listens on a loopback port and forwards to target (host:port).
func NewRelay(target string) (*Relay, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	r := &Relay{ln: ln, conns: make(map[net.Conn]bool)}
	r.SetTarget(target)
	go r.serve()
	return r, nil
}

// SetTarget sends new connections to the targets, in turn; open ones stay
// where they are.
func (r *Relay) SetTarget(targets ...string) { r.targets.Store(&targets) }

// Addr is the relay's host:port.
func (r *Relay) Addr() string { return r.ln.Addr().String() }

// Accepted counts the connections the relay has taken.
func (r *Relay) Accepted() int64 { return r.accepted.Load() }

func (r *Relay) serve() {
	for {
		c, err := r.ln.Accept()
		if err != nil {
			return
		}
		r.accepted.Add(1)
		targets := *r.targets.Load()
		up, err := net.Dial("tcp", targets[int(r.next.Add(1)-1)%len(targets)])
		if err != nil {
			c.Close()
			continue
		}
		r.track(c, up)
		go r.pipe(c, up)
		go r.pipe(up, c)
	}
}

func (r *Relay) track(cs ...net.Conn) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, c := range cs {
		r.conns[c] = true
	}
}

func (r *Relay) pipe(dst, src net.Conn) {
	io.Copy(dst, src)
	dst.Close()
	src.Close()
	r.mu.Lock()
	delete(r.conns, dst)
	delete(r.conns, src)
	r.mu.Unlock()
}

// Cut closes every relayed connection (with reset, as an RST), and returns
// how many it closed; new connections are still relayed.
func (r *Relay) Cut(reset bool) int {
	r.mu.Lock()
	conns := make([]net.Conn, 0, len(r.conns))
	for c := range r.conns {
		conns = append(conns, c)
	}
	r.conns = make(map[net.Conn]bool)
	r.mu.Unlock()
	for _, c := range conns {
		if tc, ok := c.(*net.TCPConn); ok && reset {
			tc.SetLinger(0)
		}
		c.Close()
	}
	return len(conns)
}

// Close stops the relay and cuts what it relays.
func (r *Relay) Close() error {
	err := r.ln.Close()
	r.Cut(false)
	return err
}
