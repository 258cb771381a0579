package resume

import (
	"context"
	"errors"
	"io"
	"net/http"
	"sync"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/buffer"
	"github.com/mcpresume/caddy-mcp-resume/policy"
)

// The relay hand-off. Most streams a tap feeds are short (a call's
// progress and its result, a few hundred bytes, in the time of one
// upstream read), and a goroutine of their own for the relay is a good
// part of what the proxy adds to such a call: its start, its stack grown
// to the depth of Caddy's writers, a wake-up for each event (a sixth of
// the engine's CPU per call in BenchmarkShortCall). So the relay beside a
// tap starts in the tap's goroutine: after each
// append the tap writes what is ready to its client itself. It hands the
// relay to a goroutine of its own as soon as waiting in the tap could
// cost the client or the log anything: when the upstream is quiet for a
// moment (keep-alives, noticing the client gone), when more than a few
// KiB went out this way, or when the read ends any other way than with
// nothing ready or the stream complete. At the tap's end an inline relay
// finishes in the request's goroutine, as relayTo does.
//
// The events that answer the stream's last request are written unflushed:
// they go out with the response's end, a moment later (conforming
// upstreams close the stream after the last answer), in one write with it:
// a system call less, and a client that closes the response as soon as it
// has its answer (the bench's does; the Go SDK's drains it first) finds
// the response ended, and keeps its connection.
// If the end does not follow within flushSoon, the relay's goroutine
// flushes them.
//
// Why the tap never blocks on its client: it writes only to an HTTP/1
// client whose connection's send queue was empty when the response began
// (sendqueue.go), and only a few KiB, which then fit in the send buffer
// whatever the client does. HTTP/2 and HTTP/3 streams share their
// connection's flow control with other streams: there the relay always has
// its goroutine, as it has for a client that left answers unread before
// (one pipelining requests), or where the connection cannot be asked.

const (
	// inlineBytes bounds what the tap writes to its client itself,
	// headers and preamble included.
	inlineBytes = 4 << 10
	// quietHandOff is how long the upstream may send nothing before the
	// relay gets its own goroutine (capped by the keep-alive interval).
	quietHandOff = 200 * time.Millisecond
	// flushSoon bounds how long the last answer waits, unflushed, for the
	// response's end.
	flushSoon = 5 * time.Millisecond
	// headersSoon bounds how long the headers wait for the first events to
	// go out with: a tool that takes longer has them alone.
	headersSoon = time.Millisecond
)

// handOff is the state of the relay beside a tap.
type handOff struct {
	rl    *relay
	ctx   context.Context    // the client's
	ready buffer.ReadyReader // the relay's reader, while the tap writes for it
	quiet time.Duration

	mu      sync.Mutex
	running bool // in a goroutine of its own (or ended in the tap's)
	ended   bool // the client went while the tap wrote
	// unflushed: the tap wrote the last answer without flushing it;
	// headersPending: the response's headers and pre, until the first
	// events flush them (or onQuiet, after headersSoon).
	unflushed, headersPending bool
	left                      int // bytes the tap may still write itself
	timer                     *time.Timer
	done                      chan struct{} // closed when the relay's own goroutine returns
}

// startRelay writes the client's response headers and pre, and relays the
// stream from rd beside the tap; close waits for its end.
func (t *upstreamTap) startRelay(w http.ResponseWriter, rd buffer.Reader, pre []byte, replayUpTo uint64) {
	prepareSSEHeaders(w.Header())
	w.WriteHeader(http.StatusOK)
	rl := t.h.newRelay(w, t.sess, t.stream, rd)
	rl.replayUpTo = replayUpTo
	rl.delivered = rd.Next() - 1
	if t.stream.Kind() == policy.RequestStream {
		// Its producer is this tap, unless this replica lost the stream
		// (cut off from the store past lease_ttl) and no other took it.
		sess, stream := t.sess, t.stream
		rl.takeover = func() bool { return t.h.offerTakeover(t.client, t.next, sess, stream) }
	}
	ho := &handOff{rl: rl, ctx: t.client.Context(), quiet: min(quietHandOff, time.Duration(t.h.Keepalive))}
	t.relay = ho
	ready, ok := rd.(buffer.ReadyReader)
	head := headerSize(w.Header()) // the upstream's headers, which reverse_proxy copied, with the proxy's
	if !ok || head+len(pre) > inlineBytes || !t.h.canWriteInline(t.client) {
		relaysByGoroutine.Inc()
		ho.mu.Lock()
		ho.run(pre, true)
		ho.mu.Unlock()
		return
	}
	ho.ready, ho.left = ready, inlineBytes-head-len(pre)
	relaysByTap.Inc()
	// The headers and pre go out with the first events, if they come
	// within headersSoon (a system call and a client wake-up less), else alone.
	if !rl.put(pre) {
		ho.ended = true
		rd.Close()
		return
	}
	ho.mu.Lock() // onQuiet reads the timer
	ho.headersPending = true
	ho.timer = time.AfterFunc(min(headersSoon, ho.quiet), ho.onQuiet)
	ho.mu.Unlock()
	// What the log holds already (a resume of the standalone stream, an
	// adoption's gap) goes out now, not with the upstream's next event.
	ho.pump(false)
}

// headerSize is what the response's header block takes on the wire, at
// least: its fields, their separators, and the status line and the date
// net/http adds.
func headerSize(h http.Header) int {
	n := 64
	for k, vs := range h {
		for _, v := range vs {
			n += len(k) + len(v) + 4
		}
	}
	return n
}

// pump writes what is ready to the client, in the tap's goroutine, while
// the relay has none of its own; answered: every request of the stream has
// its answer appended.
func (ho *handOff) pump(answered bool) {
	if ho == nil || ho.ready == nil {
		return
	}
	ho.mu.Lock()
	defer ho.mu.Unlock()
	if ho.running || ho.ended {
		return
	}
	for {
		if ho.ctx.Err() != nil {
			// The client went (net/http saw its connection close): what
			// is written now would count as delivered and be lost.
			ho.clientGone()
			return
		}
		b, more, err := ho.ready.ReadReady(ho.rl.dst, ho.left)
		if len(b.Data) > 0 {
			for _, d := range b.Data {
				ho.left -= len(d)
			}
			ho.unflushed = answered
			if !ho.rl.deliver(b, !answered) {
				ho.clientGone()
				return
			}
			ho.headersPending = false // flushed with the events, or with the last answer (unflushed)
		}
		switch {
		case more || err != nil && err != io.EOF && !errors.Is(err, buffer.ErrIdle):
			ho.run(nil, ho.unflushed) // more than the tap may write, or an end the relay answers
			return
		case ho.unflushed:
			ho.timer.Reset(flushSoon)
			return
		case err == io.EOF:
			ho.timer.Stop() // complete: the tap's close ends the relay
			return
		case ho.headersPending: // nothing ready yet: the headers go soon, alone if need be
			ho.timer.Reset(min(headersSoon, ho.quiet))
			return
		case err != nil: // nothing more ready
			ho.timer.Reset(ho.quiet)
			return
		}
	}
}

// clientGone ends the relay the tap wrote for, cut as relay.handle cuts
// for a client gone; ho.mu is held.
func (ho *handOff) clientGone() {
	ho.ended = true
	ho.timer.Stop()
	ho.rl.rd.Close()
	ho.rl.cut()
}

// onQuiet hands the relay over once the upstream was quiet for a while.
func (ho *handOff) onQuiet() {
	ho.mu.Lock()
	defer ho.mu.Unlock()
	if ho.headersPending && !ho.running && !ho.ended {
		// No event came with them: the headers go out alone (the send
		// queue was empty and these are its first bytes: no wait), and
		// the upstream has the rest of the quiet time.
		ho.headersPending = false
		if ho.rl.rc.Flush() != nil {
			ho.clientGone()
			return
		}
		ho.timer.Reset(ho.quiet - min(headersSoon, ho.quiet))
		return
	}
	if !ho.running && !ho.ended {
		ho.run(nil, ho.unflushed)
	}
}

// run gives the relay a goroutine of its own, which first writes pre and
// flushes, if flush (the response's headers, or the last answer the tap
// wrote unflushed, must go out); ho.mu is held.
func (ho *handOff) run(pre []byte, flush bool) {
	flush = flush || ho.headersPending
	ho.running, ho.headersPending = true, false
	if ho.timer != nil {
		ho.timer.Stop()
	}
	ho.done = make(chan struct{})
	go func() {
		defer close(ho.done)
		if !flush || ho.rl.write(pre) {
			ho.rl.run(ho.ctx)
		} else {
			ho.rl.rd.Close()
		}
	}()
}

// finish ends the relay once the tap is done: the rest, in this goroutine,
// if the tap still wrote for it, else the wait for its own.
func (ho *handOff) finish() {
	ho.mu.Lock()
	inline := !ho.running && !ho.ended
	if inline {
		ho.running = true
		ho.timer.Stop()
	}
	ho.mu.Unlock()
	switch {
	case inline:
		ho.rl.run(ho.ctx)
	case ho.done != nil:
		<-ho.done
	}
}
