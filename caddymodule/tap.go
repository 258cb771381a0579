package caddymodule

import (
	"bytes"
	"context"
	"io"
	"mime"
	"net/http"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/mcpresume/caddy-mcp-resume/buffer"
	"github.com/mcpresume/caddy-mcp-resume/internal/jsonrpc"
	"github.com/mcpresume/caddy-mcp-resume/internal/sse"
)

// tapWriter is the ResponseWriter handed to the next handler (reverse_proxy)
// for an upstream response that may be tapped. Once tapping, it never touches
// the client: it parses the SSE body into events and appends them to the log,
// blocking while the log is full, and never reports a client error, so the
// upstream read carries on after the client is gone. A relay writes the log to
// the client.
type tapWriter struct {
	*caddyhttp.ResponseWriterWrapper

	// start is called at WriteHeader for a 200 text/event-stream response. It
	// sets up the log (and the client side) and returns the stream to feed, or
	// nil to pass the response through untouched.
	start func(status int) buffer.Stream
	// onStatus, if set, sees every status (e.g. an upstream 404 ends the session).
	onStatus func(status int)

	logger    *zap.Logger
	ctx       context.Context // the detached upstream context; appends block on it
	stream    buffer.Stream
	tapping   bool
	parser    sse.Parser
	pending   map[string]bool // request ids whose response has not been seen
	appendErr error
	dropped   int // events without data (upstream priming, close) not retained
}

func (h *Handler) newTapWriter(w http.ResponseWriter, ctx context.Context, requestIDs []string) *tapWriter {
	t := &tapWriter{ResponseWriterWrapper: &caddyhttp.ResponseWriterWrapper{ResponseWriter: w}, ctx: ctx, logger: h.logger}
	t.parser.MaxEventBytes = int(h.MaxEventBytes)
	if len(requestIDs) > 0 {
		t.pending = make(map[string]bool, len(requestIDs))
		for _, id := range requestIDs {
			t.pending[id] = true
		}
	}
	return t
}

func isEventStream(h http.Header) bool {
	ct, _, _ := mime.ParseMediaType(h.Get("Content-Type"))
	return ct == "text/event-stream"
}

func (t *tapWriter) WriteHeader(status int) {
	if t.onStatus != nil {
		t.onStatus(status)
	}
	if status == http.StatusOK && !t.tapping && t.stream == nil && isEventStream(t.Header()) {
		if s := t.start(status); s != nil {
			t.stream, t.tapping = s, true
			return
		}
	}
	if !t.tapping {
		t.ResponseWriterWrapper.WriteHeader(status)
	}
}

func (t *tapWriter) Write(p []byte) (int, error) {
	if !t.tapping {
		return t.ResponseWriterWrapper.Write(p)
	}
	if t.appendErr != nil {
		return 0, t.appendErr
	}
	if err := t.parser.Feed(p, t.appendEvent); err != nil {
		// reverse_proxy stops reading the upstream and aborts: the stream
		// has failed (a too-large event, a stall, the session's end).
		t.appendErr = err
		return 0, err
	}
	return len(p), nil
}

func (t *tapWriter) appendEvent(ev *sse.Event) error {
	if !ev.HasData || len(ev.Data) == 0 {
		// Upstream priming and close events carry no message; the proxy
		// primes with its own IDs and never closes early.
		t.dropped++
		return nil
	}
	data := make([]byte, 0, sse.FieldsLen(ev)+1) // exact: retained bytes are counted by capacity
	data = sse.AppendFields(data, ev)
	data = append(data, '\n')
	response := false
	if len(t.pending) > 0 {
		answered := func(id []byte) {
			if k := string(bytes.TrimSpace(id)); t.pending[k] {
				delete(t.pending, k)
				response = len(t.pending) == 0
			}
		}
		if d := bytes.TrimLeft(ev.Data, " \t\r\n"); len(d) > 0 && d[0] == '[' {
			jsonrpc.PeekAll(d, func(m jsonrpc.Message) { // a batch (2025-03-26)
				if m.Kind == jsonrpc.Response {
					answered(m.ID)
				}
			})
		} else if id, ok := jsonrpc.PeekResponse(ev.Data); ok {
			answered(id)
		}
	}
	seq, err := t.stream.Append(t.ctx, data, response)
	if c := t.logger.Check(zap.DebugLevel, "event appended"); c != nil {
		c.Write(zap.Uint32("stream", t.stream.Num()), zap.Uint64("seq", seq), zap.Int("bytes", len(data)),
			zap.Bool("response", response), zap.Error(err))
	}
	return err
}

// FlushError implements the flusher that http.ResponseController looks for
// first. While tapping, the relay flushes the client; here there is nothing to do.
func (t *tapWriter) FlushError() error {
	if t.tapping {
		return nil
	}
	return http.NewResponseController(t.ResponseWriterWrapper.ResponseWriter).Flush()
}

// ReadFrom hides ResponseWriterWrapper.ReadFrom, which would bypass Write.
func (t *tapWriter) ReadFrom(r io.Reader) (int64, error) {
	return io.Copy(struct{ io.Writer }{t}, r)
}

// statusWriter passes a response through and reports its status.
type statusWriter struct {
	*caddyhttp.ResponseWriterWrapper
	onStatus func(int)
	done     bool
}

func (s *statusWriter) WriteHeader(status int) {
	if !s.done {
		s.done = true
		s.onStatus(status)
	}
	s.ResponseWriterWrapper.WriteHeader(status)
}

func (s *statusWriter) Write(p []byte) (int, error) {
	if !s.done {
		s.WriteHeader(http.StatusOK)
	}
	return s.ResponseWriterWrapper.Write(p)
}
