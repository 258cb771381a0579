package mcptest

import (
	"io"
	"net"
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
	conns    connSet
}

// NewRelay listens on a loopback port and forwards to target (host:port).
func NewRelay(target string) (*Relay, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	r := &Relay{ln: ln}
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
		r.conns.add(c, up)
		go r.pipe(c, up)
		go r.pipe(up, c)
	}
}

func (r *Relay) pipe(dst, src net.Conn) {
	io.Copy(dst, src)
	dst.Close()
	src.Close()
	r.conns.remove(dst, src)
}

// Cut closes every relayed connection (with reset, as an RST), and returns
// how many it closed; new connections are still relayed.
func (r *Relay) Cut(reset bool) int { return r.conns.cut(reset) }

// Close stops the relay and cuts what it relays.
func (r *Relay) Close() error {
	err := r.ln.Close()
	r.Cut(false)
	return err
}
