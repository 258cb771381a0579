package resume

import (
	"context"
	"net"
	"net/http"
	"syscall"
)

// Whether the tap may write to its client itself (handoff.go): only where
// no write can block, whatever the client does. An HTTP/1 connection
// carries one response at a time, so once nothing written before waits in
// the kernel (sent and acknowledged: SIOCOUTQ is 0) and its send buffer is
// at least minSendBuffer, the few KiB the tap writes all fit in the send
// buffer at once, even for a client that reads nothing (one that pipelines
// requests and never reads their answers fills its own receive buffer
// first, then this send queue: from then on its relays get their own
// goroutine). Where the connection cannot be asked (another system, a
// connection that is not a socket), the relay always has its goroutine.

// minSendBuffer is the send buffer a connection needs for inline writes:
// four times what they may bring (inlineBytes), for the kernel's
// per-packet overhead; Linux's default (tcp_wmem) is 16 KiB.
const minSendBuffer = 4 * inlineBytes

type connKey struct{}

// ConnContext is an http.Server ConnContext that keeps each request's
// connection for the engine (Config.ClientConn's default), so that a short
// answer can skip the relay's goroutine. The caddymodule adapter registers
// it on Caddy's servers.
func ConnContext(ctx context.Context, c net.Conn) context.Context {
	return context.WithValue(ctx, connKey{}, c)
}

func connOf(r *http.Request) net.Conn {
	c, _ := r.Context().Value(connKey{}).(net.Conn)
	return c
}

// socketOf returns the socket under c: c itself, or what a TLS connection
// (or another wrapper with NetConn) wraps.
func socketOf(c net.Conn) syscall.Conn {
	for range 4 {
		switch v := c.(type) {
		case syscall.Conn:
			return v
		case interface{ NetConn() net.Conn }:
			c = v.NetConn()
		default:
			return nil
		}
	}
	return nil
}

// canWriteInline reports whether the tap may write r's answer to its client
// itself: an HTTP/1 request on a connection whose send queue is empty.
func (h *Engine) canWriteInline(r *http.Request) bool {
	if r.ProtoMajor != 1 {
		return false // HTTP/2 and 3 streams share their connection's flow control
	}
	c := h.ClientConn(r)
	if c == nil {
		return false
	}
	sc := socketOf(c)
	return sc != nil && sendQueueEmpty(sc)
}
