package caddymodule

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"time"

	"go.uber.org/zap"

	"github.com/mcpresume/caddy-mcp-resume/buffer"
	"github.com/mcpresume/caddy-mcp-resume/internal/eventid"
	"github.com/mcpresume/caddy-mcp-resume/internal/jsonrpc"
	"github.com/mcpresume/caddy-mcp-resume/internal/sse"
	"github.com/mcpresume/caddy-mcp-resume/policy"
)

// prepareSSEHeaders sets what every SSE response from the proxy carries. The
// body length is the proxy's business now, and intermediaries must not
// buffer or transform it.
func prepareSSEHeaders(h http.Header) {
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache, no-transform")
	h.Set("X-Accel-Buffering", "no")
	h.Del("Content-Length")
	h.Del("Content-Encoding")
}

// primes reports whether a session's streams start with a priming event:
// only from 2025-11-25 on, since older clients may choke on empty data.
func primes(version string) bool { return version >= "2025-11-25" }

// preamble is written first on every SSE response: a priming event where
// the version allows it, else a comment; either way bytes go out at once, so
// intermediaries release the headers.
func preamble(dst []byte, sess buffer.Session, stream buffer.Stream) []byte {
	if primes(sess.Meta().Version) {
		dst = sse.AppendID(dst, string(eventid.Append(nil, sess.Epoch(), stream.Num(), 0)))
		return append(dst, "data: \n\n"...)
	}
	return sse.AppendComment(dst, "mcp-resume")
}

// relay writes a stream's log to one client, from the reader's position,
// until the stream ends, the client goes, or another connection takes over.
type relay struct {
	h      *Handler
	w      http.ResponseWriter
	rc     *http.ResponseController
	sess   buffer.Session
	stream buffer.Stream
	rd     buffer.Reader
	out    []byte
	// replayUpTo is the stream's head when a resume arrived: events up to
	// it are replays (counted), later ones are live.
	replayUpTo uint64
}

func (h *Handler) newRelay(w http.ResponseWriter, sess buffer.Session, stream buffer.Stream, rd buffer.Reader) *relay {
	return &relay{h: h, w: w, rc: http.NewResponseController(w), sess: sess, stream: stream, rd: rd, out: make([]byte, 0, 4096)}
}

// relayChunk bounds the bytes a relay copies before writing: small events
// go out in one write per batch, large ones straight from the log, so a
// blocked client never pins more than this outside the log's byte bounds.
const relayChunk = 32 << 10

// writeEvents writes a batch with the proxy's IDs and flushes once.
func (rl *relay) writeEvents(evs []buffer.Event, epoch string, num uint32) bool {
	out := rl.out[:0]
	for _, ev := range evs {
		out = append(out, "id: "...)
		out = eventid.Append(out, epoch, num, ev.Seq)
		out = append(out, '\n')
		if len(ev.Data) > relayChunk {
			if _, err := rl.w.Write(out); err != nil {
				return false
			}
			out = out[:0]
			if _, err := rl.w.Write(ev.Data); err != nil {
				return false
			}
			continue
		}
		out = append(out, ev.Data...)
		if len(out) >= relayChunk {
			if _, err := rl.w.Write(out); err != nil {
				return false
			}
			out = out[:0]
		}
	}
	if cap(out) > 2*relayChunk {
		rl.out = nil
	} else {
		rl.out = out[:0]
	}
	return rl.write(out)
}

// write sends b and flushes; false means the client is gone.
func (rl *relay) write(b []byte) bool {
	if _, err := rl.w.Write(b); err != nil {
		return false
	}
	return rl.rc.Flush() == nil
}

func (rl *relay) run(ctx context.Context) {
	defer rl.rd.Close()
	keepalive := time.Duration(rl.h.Keepalive)
	evs := make([]buffer.Event, 0, 64)
	epoch, num := rl.sess.Epoch(), rl.stream.Num()
	for {
		rctx, cancel := context.WithTimeout(ctx, keepalive)
		var err error
		evs, err = rl.rd.Read(rctx, evs[:0])
		cancel()
		if len(evs) > 0 {
			first, last := evs[0].Seq, evs[len(evs)-1].Seq
			ok := rl.writeEvents(evs, epoch, num)
			clear(evs) // keep no payload alive past its eviction
			if !ok {
				return
			}
			rl.rd.Delivered(last)
			if rl.replayUpTo > 0 && first <= rl.replayUpTo {
				replayed.Add(float64(min(last, rl.replayUpTo) - first + 1))
			}
		}
		var failed *buffer.FailedError
		switch {
		case err == nil:
		case ctx.Err() != nil:
			return // the client is gone; the log keeps what it missed
		case errors.Is(err, context.DeadlineExceeded):
			if !rl.write(sse.AppendComment(rl.out[:0], "keepalive")) {
				return
			}
		case err == io.EOF, errors.Is(err, buffer.ErrProducerGone), errors.Is(err, buffer.ErrSessionGone):
			return
		case errors.Is(err, buffer.ErrTakenOver):
			abortClient(rl.w)
			return
		case errors.As(err, &failed):
			rl.writeFailure(failed.Reason)
			return
		default:
			rl.h.logger.Error("relay: unexpected reader error", zap.String("session", rl.sess.ID()),
				zap.Uint32("stream", num), zap.Error(err))
			return
		}
	}
}

// writeFailure tells the client, loudly, that the stream failed: a gap event
// for SSE-aware clients, then what standard MCP clients act on.
func (rl *relay) writeFailure(reason policy.Reason) {
	v := rl.stream.View()
	epoch, num := rl.sess.Epoch(), rl.stream.Num()
	gaps.WithLabelValues(string(reason)).Inc()
	if rl.stream.Kind() == policy.StandaloneStream {
		// Point the client's cursor at the session's new standalone stream;
		// its reconnect then follows live there.
		cursor := eventid.Append(nil, epoch, num, v.Head)
		next, err := rl.sess.Standalone()
		if err != nil {
			return
		}
		nv := next.View()
		moved := eventid.Append(nil, epoch, next.Num(), nv.Head)
		out := appendGapEvent(nil, string(moved), gapInfo{LastEventID: string(cursor), ResumeFrom: string(moved), Reason: reason})
		out = appendDataEvent(out, warning(reason, string(cursor), -1))
		rl.write(out)
		return
	}
	head := eventid.Append(nil, epoch, num, v.Head)
	out := appendGapEvent(nil, string(head), gapInfo{LastEventID: string(head), Reason: reason, Lost: -1})
	if v.ResponseSeq == 0 {
		out = appendPendingErrors(out, rl.stream.RequestIDs(), reason, string(head), -1)
	}
	rl.write(out)
}

// gapInfo is the data of a gap event.
type gapInfo struct {
	LastEventID string        `json:"lastEventId"`
	ResumeFrom  string        `json:"resumeFrom,omitempty"`
	Lost        int64         `json:"lost"` // -1: unknown (the upstream's events after a failure were never seen)
	Reason      policy.Reason `json:"reason"`
}

func appendGapEvent(dst []byte, id string, g gapInfo) []byte {
	data, _ := json.Marshal(g)
	dst = append(dst, "event: gap\n"...)
	dst = sse.AppendID(dst, id)
	dst = sse.AppendData(dst, data)
	return append(dst, '\n')
}

func appendDataEvent(dst, data []byte) []byte {
	dst = sse.AppendData(dst, data)
	return append(dst, '\n')
}

// warning is the notifications/message standard clients surface for a gap.
func warning(reason policy.Reason, lastEventID string, lost int64) []byte {
	return jsonrpc.LogNotification("warning", "mcp_resume", map[string]any{
		"message":     "mcp-resume: events of this stream were lost (" + string(reason) + ")",
		"reason":      reason,
		"lastEventId": lastEventID,
		"lost":        lost,
	})
}

// appendPendingErrors answers each pending request with a JSON-RPC error, so
// a client's call fails now instead of waiting for a response that is gone.
func appendPendingErrors(dst []byte, ids []string, reason policy.Reason, lastEventID string, lost int64) []byte {
	for _, id := range ids {
		body := jsonrpc.ErrorResponse(json.RawMessage(id), jsonrpc.CodeEventsLost,
			"mcp-resume: the response to this request was lost ("+string(reason)+")",
			map[string]any{"reason": reason, "lastEventId": lastEventID, "lost": lost})
		dst = appendDataEvent(dst, body)
	}
	return dst
}

// abortClient cuts a connection that another one took over, so its client
// notices (an abort, not a clean end: older clients only reconnect on errors).
func abortClient(w http.ResponseWriter) {
	if conn, _, err := http.NewResponseController(w).Hijack(); err == nil {
		conn.Close()
	}
}
