package natsstore

import (
	"context"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/mcpresume/caddy-mcp-resume/buffer"
	"github.com/mcpresume/caddy-mcp-resume/internal/testnet"
	"github.com/mcpresume/caddy-mcp-resume/policy"
)

// dropCutter relays TCP to target; once armed, the client message holding
// every part is never forwarded and the connection is closed (the client
// reconnects at once): a write lost with its connection.
type dropCutter struct {
	ln      net.Listener
	target  string
	trigger atomic.Pointer[[][]byte]
	fired   atomic.Bool
	mu      sync.Mutex
	conns   []net.Conn
}

func newDropCutter(t *testing.T, target string) *dropCutter {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &dropCutter{ln: ln, target: target}
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

func (r *dropCutter) addr() string { return r.ln.Addr().String() }

func (r *dropCutter) arm(parts ...string) {
	var bs [][]byte
	for _, p := range parts {
		bs = append(bs, []byte(p))
	}
	r.trigger.Store(&bs)
}

func (r *dropCutter) serve() {
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
		go func() {
			buf := make([]byte, 64<<10)
			for {
				n, err := up.Read(buf)
				if n > 0 {
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
		go func() {
			buf := make([]byte, 64<<10)
			for {
				n, err := c.Read(buf)
				if n > 0 {
					chunk := buf[:n]
					if tr := r.trigger.Load(); tr != nil && !r.fired.Load() && containsAll(chunk, *tr) && r.fired.CompareAndSwap(false, true) {
						c.Close()
						up.Close()
						return
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

// Review 42: B's connection drops as its session record's create is sent
// (the write never reaches NATS). CreateSession fails (the request waits
// out opTimeout), and since 1845cb1 its non-ErrKeyExists failure calls
// neither undo nor dropInterest: B keeps, for as long as it lives, an
// interest in a session that was never made.
func TestReview42CreateLostWithItsConnectionLeaksTheInterest(t *testing.T) {
	t.Parallel()
	ns := testnet.NATS(t)
	cut := newDropCutter(t, ns.Addr().String())
	b := openAt(t, []string{"nats://" + cut.addr()})
	const id = "lost-create"
	sh := sessionToken(id)
	cut.arm("HPUB $KV." + b.names.sessions + "." + sh + " ")
	_, err := b.CreateSession(id, buffer.SessionMeta{Origin: policy.Adopted})
	if !cut.fired.Load() {
		t.Fatal("the cutter did not fire")
	}
	if err == nil {
		t.Fatal("the create succeeded")
	}
	t.Logf("create: %v", err)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := b.sessions.kv.Get(ctx, sh); !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Fatalf("the session record: %v (want none)", err)
	}
	time.Sleep(time.Second) // reconnected, interests reloaded
	b.interest.mu.Lock()
	_, kept := b.interest.subs[sh]
	b.interest.mu.Unlock()
	if kept {
		t.Errorf("B keeps an interest in session %s, which was never made", sh)
	}
}
