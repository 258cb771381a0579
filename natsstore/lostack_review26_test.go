package natsstore

import (
	"bytes"
	"context"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/buffer"
	"github.com/mcpresume/caddy-mcp-resume/internal/testnet"
	"github.com/mcpresume/caddy-mcp-resume/policy"
)

// ackCutter is a TCP relay in front of a NATS server that, once armed,
// forwards the first client message containing trigger to the server and
// then drops everything the server sends back on that connection and cuts
// it: the write is stored, its acknowledgement is lost (a network blip at
// the wrong moment). Later connections pass untouched. With dropWrite set
// before it is armed, the message is not forwarded at all: a write lost
// with its connection.
type ackCutter struct {
	ln        net.Listener
	target    string
	dropWrite bool
	trigger   atomic.Pointer[[][]byte]
	fired     atomic.Bool
	mu        sync.Mutex
	conns     []net.Conn
}

func newAckCutter(t *testing.T, target string) *ackCutter {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &ackCutter{ln: ln, target: target}
	t.Cleanup(func() {
		ln.Close()
		r.mu.Lock()
		for _, c := range r.conns {
			c.Close()
		}
		r.mu.Unlock()
	})
	go r.serve()
	return r
}

func (r *ackCutter) addr() string { return r.ln.Addr().String() }

// arm makes the next client message holding every one of parts the one
// whose acknowledgement is lost.
func (r *ackCutter) arm(parts ...string) {
	var bs [][]byte
	for _, p := range parts {
		bs = append(bs, []byte(p))
	}
	r.trigger.Store(&bs)
}

func containsAll(b []byte, parts [][]byte) bool {
	for _, p := range parts {
		if !bytes.Contains(b, p) {
			return false
		}
	}
	return true
}

func (r *ackCutter) serve() {
	for {
		c, err := r.ln.Accept()
		if err != nil {
			return
		}
		up, err := net.Dial("tcp", r.target)
		if err != nil {
			c.Close()
			continue
		}
		r.mu.Lock()
		r.conns = append(r.conns, c, up)
		r.mu.Unlock()
		var mute atomic.Bool
		go func() { // server -> client
			buf := make([]byte, 64<<10)
			for {
				n, err := up.Read(buf)
				if n > 0 && !mute.Load() {
					if _, werr := c.Write(buf[:n]); werr != nil {
						return
					}
				}
				if err != nil {
					c.Close()
					return
				}
			}
		}()
		go func() { // client -> server
			buf := make([]byte, 64<<10)
			var tail []byte
			for {
				n, err := c.Read(buf)
				if n > 0 {
					chunk := buf[:n]
					if tr := r.trigger.Load(); tr != nil && !r.fired.Load() {
						look := append(tail, chunk...)
						if containsAll(look, *tr) && r.fired.CompareAndSwap(false, true) {
							if r.dropWrite {
								c.Close()
								up.Close()
								return
							}
							mute.Store(true) // nothing more reaches the client: the ack is lost
							up.Write(chunk)
							go func() {
								time.Sleep(300 * time.Millisecond) // the server stores it
								c.Close()
								up.Close()
							}()
							continue
						}
						if len(look) > 4096 {
							look = look[len(look)-4096:]
						}
						tail = append(tail[:0], look...)
					}
					if _, werr := up.Write(chunk); werr != nil {
						return
					}
				}
				if err != nil {
					up.Close()
					return
				}
			}
		}()
	}
}

// Review 26: a write whose acknowledgement is lost is never notified.
// A serves a session (it created it); B, which reaches NATS through a
// relay, DELETEs it; the session record's purge is stored but B's
// connection drops before the acknowledgement (B reconnects at once; A's
// connection never drops). B's retry finds the record gone and gives up
// without publishing the notification, and nothing else will tell A: A
// is not the sweeper (no whole-bucket watch), it did not reconnect (no
// reload), and session records are never read again. With whole-bucket
// watches (main), A's watch brought the purge and A ended its handle.
// Expected: within a few seconds A no longer serves the session that KV no
// longer holds.
func TestReview26DeleteWhoseAckIsLostLeavesTheSessionAliveElsewhere(t *testing.T) {
	t.Parallel()
	ns := testnet.NATS(t)
	urls := []string{ns.ClientURL()}
	sweeper := openAt(t, urls) // opened first: it sweeps
	a := openAt(t, urls)
	cut := newAckCutter(t, ns.Addr().String())
	b := openAt(t, []string{"nats://" + cut.addr()})
	if a.sweeps() || b.sweeps() {
		t.Fatal("A or B sweeps")
	}
	const id = "victim"
	sa, err := a.CreateSession(id, buffer.SessionMeta{Version: "2025-06-18"})
	if err != nil {
		t.Fatal(err)
	}
	_ = sa
	sessionOn(t, b, id)

	cut.arm("HPUB $KV." + b.names.sessions + "." + sessionToken(id) + " ")
	deleted := b.Delete(id, policy.ReasonDeleted)
	if !cut.fired.Load() {
		t.Fatal("the relay never saw the session record's purge")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := sweeper.sessions.kv.Get(ctx, sessionToken(id)); err == nil {
		t.Fatal("the purge was not stored (the test did not lose only the acknowledgement)")
	}
	t.Logf("B's Delete returned %v; the session record is gone from KV", deleted)
	waitUntil(t, "the sweeper to see the session gone", 5*time.Second, func() bool { _, ok := sweeper.Session(id); return !ok })
	gone := func() bool { _, ok := a.Session(id); return !ok }
	for deadline := time.Now().Add(3 * time.Second); !gone() && time.Now().Before(deadline); {
		time.Sleep(5 * time.Millisecond)
	}
	if !gone() {
		t.Errorf("A still serves session %q 3 s after its record was deleted from KV (B's Delete returned %v): "+
			"its deletion was never notified, and nothing makes A read the record again", id, deleted)
	}
	if s, ok := a.Session(id); ok {
		if _, err := s.NewStream([]string{"9"}, [32]byte{9}); err == nil {
			t.Errorf("A even opened a new stream of the deleted session")
		}
	}
}
