package resume

import (
	"bytes"
	"io"
	"net/http"

	"go.uber.org/zap"
)

// tapWriter is the ResponseWriter handed to the next handler (reverse_proxy)
// for one upstream request of a tap. Once tapping, it never touches the
// client: it parses the SSE body into events and appends them to the log,
// blocking while the log is full, and never reports a client error, so the
// upstream read carries on after the client is gone. The relay writes the
// log to the client.
type tapWriter struct {
	*writerWrapper
	t        *upstreamTap
	start    func(http.Header) bool // at a tappable response: set up the stream (and the client side); false: pass it on
	answered func()                 // if set, called once every request is answered: stop reading
	status   int
	tapping  bool
}

func (tw *tapWriter) WriteHeader(status int) {
	if status < 200 { // informational (103 Early Hints): pass on
		if !tw.tapping && tw.status == 0 {
			tw.writerWrapper.WriteHeader(status)
		}
		return
	}
	if tw.status != 0 {
		return
	}
	tw.status = status
	if tappable(status, tw.Header()) && tw.start(tw.Header()) {
		tw.tapping = true
		return
	}
	if status == http.StatusOK && tw.Header().Get("Content-Encoding") != "" && isEventStreamType(tw.Header()) {
		tw.t.h.logger.Warn("upstream compressed its SSE response although asked not to; passed through untapped",
			zap.String("content_encoding", tw.Header().Get("Content-Encoding")))
		untapped.WithLabelValues("compressed").Inc()
	}
	tw.writerWrapper.WriteHeader(status)
}

func (tw *tapWriter) Write(p []byte) (int, error) {
	if tw.status == 0 {
		tw.WriteHeader(http.StatusOK)
	}
	if !tw.tapping {
		return tw.writerWrapper.Write(p)
	}
	t := tw.t
	if t.failure != nil {
		return 0, t.failure
	}
	err := t.parser.Feed(p, t.onEvent)
	if err == nil {
		err = t.flush() // before p goes back to reverse_proxy
	} else {
		t.flush() // what came before the error goes in; the error is the one to report
	}
	if err != nil {
		// reverse_proxy stops reading the upstream and aborts: the stream
		// cannot go on (a stall, an oversized event, the session's end).
		t.failure = err
		return 0, err
	}
	if tw.answered != nil && len(t.pending) == 0 {
		tw.answered()
	}
	return len(p), nil
}

// FlushError implements the flusher that http.ResponseController looks for
// first. While tapping, the relay flushes the client; here there is nothing to do.
func (tw *tapWriter) FlushError() error {
	if tw.tapping {
		return nil
	}
	return http.NewResponseController(tw.writerWrapper.ResponseWriter).Flush()
}

// ReadFrom hides ResponseWriterWrapper.ReadFrom, which would bypass Write.
func (tw *tapWriter) ReadFrom(r io.Reader) (int64, error) {
	return io.Copy(struct{ io.Writer }{tw}, r)
}

func isEventStreamType(h http.Header) bool {
	return bytes.HasPrefix([]byte(h.Get("Content-Type")), []byte("text/event-stream"))
}

// discardWriter is where a reconnect's response goes when it is not
// tapped: nowhere (the client's response is the relay's).
type discardWriter struct{ h http.Header }

func discard() *discardWriter                        { return &discardWriter{h: http.Header{}} }
func (d *discardWriter) Header() http.Header         { return d.h }
func (d *discardWriter) Write(p []byte) (int, error) { return len(p), nil }
func (d *discardWriter) WriteHeader(int)             {}

// statusWriter passes a response through and reports its status.
type statusWriter struct {
	*writerWrapper
	onStatus func(int)
	done     bool
}

func (s *statusWriter) WriteHeader(status int) {
	if !s.done && status >= 200 {
		s.done = true
		s.onStatus(status)
	}
	s.writerWrapper.WriteHeader(status)
}

func (s *statusWriter) Write(p []byte) (int, error) {
	if !s.done {
		s.WriteHeader(http.StatusOK)
	}
	return s.writerWrapper.Write(p)
}
