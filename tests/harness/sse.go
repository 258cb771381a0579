package harness

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// SSEEvent is one Server-Sent Event as a test looks at it.
type SSEEvent struct {
	ID, Type, Data string
}

// SSEReader reads Server-Sent Events one at a time as they arrive. An event
// is anything with an id, event or data field (an id alone is the priming
// event of 2025-11-25); comments are skipped.
type SSEReader struct {
	br *bufio.Reader

	// Strict holds the stream to what the proxy writes, for tests of its
	// framing: LF line ends only (a CR anywhere is an error), no field but
	// id, event, data and retry (a retry alone makes an event too), and no
	// line or event cut off at the end. Without it the reader is as lenient
	// as a client: CR LF accepted, retry and unknown fields skipped, an
	// unfinished event at the end dropped.
	Strict bool
}

// NewSSEReader reads events from r through a buffer of size bytes, which is
// how much it takes from a connection at a time: tests that count bytes in
// socket queues depend on it.
func NewSSEReader(r io.Reader, size int) *SSEReader {
	return &SSEReader{br: bufio.NewReaderSize(r, size)}
}

// Next returns the next event, or io.EOF once the stream ends.
func (r *SSEReader) Next() (SSEEvent, error) {
	var ev SSEEvent
	var data []string
	has := false
	for {
		line, err := r.br.ReadString('\n')
		if err != nil {
			if err == io.EOF && r.Strict {
				if line != "" {
					return ev, fmt.Errorf("SSE body ends inside a line: %q", line)
				}
				if has {
					return ev, fmt.Errorf("SSE body ends inside an event: %+v", ev)
				}
			}
			return ev, err
		}
		line = line[:len(line)-1]
		if r.Strict && strings.ContainsRune(line, '\r') {
			return ev, fmt.Errorf("CR in a line the proxy wrote: %q", line)
		}
		line = strings.TrimSuffix(line, "\r")
		switch {
		case line == "":
			if has {
				ev.Data = strings.Join(data, "\n")
				return ev, nil
			}
		case strings.HasPrefix(line, ":"):
		case strings.HasPrefix(line, "id:"):
			ev.ID, has = strings.TrimPrefix(strings.TrimPrefix(line, "id:"), " "), true
		case strings.HasPrefix(line, "event:"):
			ev.Type, has = strings.TrimPrefix(strings.TrimPrefix(line, "event:"), " "), true
		case strings.HasPrefix(line, "data:"):
			data = append(data, strings.TrimPrefix(strings.TrimPrefix(line, "data:"), " "))
			has = true
		case strings.HasPrefix(line, "retry:"):
			if r.Strict {
				has = true
			}
		default:
			if r.Strict {
				return ev, fmt.Errorf("unexpected line from the proxy: %q", line)
			}
		}
	}
}

// ReadSSE reads events from an SSE body until n events were read (n 0: until
// the body ends), the body ends, or the timeout passes. Comments are skipped.
func ReadSSE(body io.Reader, n int, timeout time.Duration) ([]SSEEvent, error) {
	type result struct {
		evs []SSEEvent
		err error
	}
	ch := make(chan result, 1)
	go func() {
		r := NewSSEReader(body, 4096)
		var evs []SSEEvent
		for n <= 0 || len(evs) < n {
			ev, err := r.Next()
			if err != nil {
				ch <- result{evs, err}
				return
			}
			evs = append(evs, ev)
		}
		ch <- result{evs, nil}
	}()
	select {
	case r := <-ch:
		if r.err == io.EOF {
			r.err = nil
		}
		return r.evs, r.err
	case <-time.After(timeout):
		return nil, fmt.Errorf("timed out after %v waiting for %d events", timeout, n)
	}
}

// ReadEvents reads n events of a response (0: until the body ends), failing
// the test if that takes over 20s or the body breaks.
func ReadEvents(t testing.TB, resp *http.Response, n int) []SSEEvent {
	t.Helper()
	evs, err := ReadSSE(resp.Body, n, 20*time.Second)
	if err != nil {
		t.Fatalf("reading events: %v (got %d)", err, len(evs))
	}
	return evs
}
