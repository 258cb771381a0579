package mcptest

import (
	"net"
	"sync"
)

// connSet is a set of open connections a test can cut: what Relay and
// CuttableTransport have in common.
type connSet struct {
	mu sync.Mutex
	m  map[net.Conn]bool
}

func (s *connSet) add(cs ...net.Conn) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.m == nil {
		s.m = make(map[net.Conn]bool)
	}
	for _, c := range cs {
		s.m[c] = true
	}
}

func (s *connSet) remove(cs ...net.Conn) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range cs {
		delete(s.m, c)
	}
}

func (s *connSet) len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.m)
}

// cut closes every connection of the set, which forgets them: with reset,
// as an RST (SO_LINGER 0), else as a clean FIN. It returns how many it
// closed.
func (s *connSet) cut(reset bool) int {
	s.mu.Lock()
	conns := s.m
	s.m = nil
	s.mu.Unlock()
	for c := range conns {
		if tc, ok := c.(*net.TCPConn); ok && reset {
			tc.SetLinger(0)
		}
		c.Close()
	}
	return len(conns)
}
