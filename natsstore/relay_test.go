package natsstore

import (
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// faultRelay is a TCP relay in front of a NATS server that stands in for a
// bad link: it delays every byte, each way, by delay (0 at first; order is
// kept, nothing is lost: a NATS under load, a congested link), and can
// blip (drop every connection at once, what is in transit lost, new ones
// let through) or cut (drop them and refuse new ones until mend).
type faultRelay struct {
	ln    net.Listener
	delay atomic.Int64
	mu    sync.Mutex
	down  bool
	conns []net.Conn
	// trigger, if set, is called with each chunk NATS sent once it is
	// delivered to the client.
	trigger atomic.Pointer[func([]byte)]
}

func newFaultRelay(t testing.TB, target string) *faultRelay {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &faultRelay{ln: ln}
	t.Cleanup(func() { ln.Close(); r.blip() })
	go func() {
		for {
			in, err := ln.Accept()
			if err != nil {
				return
			}
			r.mu.Lock()
			down := r.down
			r.mu.Unlock()
			if down {
				in.Close()
				continue
			}
			out, err := net.Dial("tcp", target)
			if err != nil {
				in.Close()
				continue
			}
			r.mu.Lock()
			r.conns = append(r.conns, in, out)
			r.mu.Unlock()
			go r.pipe(out, in, false)
			go r.pipe(in, out, true)
		}
	}()
	return r
}

func (r *faultRelay) addr() string { return r.ln.Addr().String() }

// blip drops every connection now.
func (r *faultRelay) blip() {
	r.mu.Lock()
	conns := r.conns
	r.conns = nil
	r.mu.Unlock()
	for _, c := range conns {
		if tc, ok := c.(*net.TCPConn); ok {
			tc.SetLinger(0)
		}
		c.Close()
	}
}

// cut drops every connection and refuses new ones until mend.
func (r *faultRelay) cut() {
	r.mu.Lock()
	r.down = true
	r.mu.Unlock()
	r.blip()
}

func (r *faultRelay) mend() {
	r.mu.Lock()
	r.down = false
	r.mu.Unlock()
}

func (r *faultRelay) pipe(dst, src net.Conn, toClient bool) {
	type chunk struct {
		at time.Time
		b  []byte
	}
	ch := make(chan chunk, 1<<16)
	go func() {
		defer close(ch)
		for {
			buf := make([]byte, 32<<10)
			n, err := src.Read(buf)
			if n > 0 {
				ch <- chunk{time.Now().Add(time.Duration(r.delay.Load())), buf[:n]}
			}
			if err != nil {
				return
			}
		}
	}()
	for c := range ch {
		if d := time.Until(c.at); d > 0 {
			time.Sleep(d)
		}
		if _, err := dst.Write(c.b); err != nil {
			break
		}
		if f := r.trigger.Load(); toClient && f != nil {
			(*f)(c.b)
		}
	}
	dst.Close()
	src.Close()
}

// faultNotes collects, timestamped, what replicas report during a test
// (OnError, hooks), for its failure message.
type faultNotes struct {
	mu    sync.Mutex
	lines []string
}

func (f *faultNotes) note(s string) {
	f.mu.Lock()
	f.lines = append(f.lines, time.Now().Format("05.000")+" "+s)
	f.mu.Unlock()
}

// list is a copy of what was noted so far.
func (f *faultNotes) list() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.lines...)
}
