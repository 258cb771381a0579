package mcptest

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"time"
)

// Event is one Server-Sent Event.
type Event struct {
	ID, Type, Data string
}

// RawEvent is an Event whose fields are views into an SSEReader's
// buffers, valid until its next call.
type RawEvent struct {
	ID, Type, Data []byte
}

// SSEReader reads Server-Sent Events one at a time as they arrive. An event
// is anything with an id, event or data field (an id alone is the priming
// event of 2025-11-25); comments are skipped.
type SSEReader struct {
	// Strict holds the stream to what the proxy writes, for tests of its
	// framing: LF line ends only (a CR anywhere is an error), no field but
	// id, event, data and retry (a retry alone makes an event too), and no
	// line or event cut off at the end. Without it the reader is as lenient
	// as a client: CR LF accepted, retry and unknown fields skipped, an
	// unfinished event at the end dropped.
	Strict bool

	br            *bufio.Reader
	line          []byte // a line longer than br's buffer
	id, typ, data []byte
}

// NewSSEReader reads events from r through a buffer of size bytes, which is
// how much it takes from a connection at a time: tests that count bytes in
// socket queues depend on it.
func NewSSEReader(r io.Reader, size int) *SSEReader {
	return &SSEReader{br: bufio.NewReaderSize(r, size)}
}

// Next returns the next event, or io.EOF once the stream ends.
func (r *SSEReader) Next() (Event, error) {
	ev, err := r.NextRaw()
	return Event{ID: string(ev.ID), Type: string(ev.Type), Data: string(ev.Data)}, err
}

// NextRaw is Next without a copy of the event, for a reader that must not
// allocate per event (the benchmark's client is measured with the proxy).
func (r *SSEReader) NextRaw() (RawEvent, error) {
	r.id, r.typ, r.data = r.id[:0], r.typ[:0], r.data[:0]
	has, hasData := false, false
	event := func() RawEvent { return RawEvent{ID: r.id, Type: r.typ, Data: r.data} }
	for {
		line, err := r.readLine()
		if err != nil {
			if err == io.EOF && r.Strict {
				if len(line) > 0 {
					return event(), fmt.Errorf("SSE body ends inside a line: %q", line)
				}
				if has {
					return event(), fmt.Errorf("SSE body ends inside an event: id %q event %q data %q", r.id, r.typ, r.data)
				}
			}
			return event(), err
		}
		if r.Strict && bytes.IndexByte(line, '\r') >= 0 {
			return event(), fmt.Errorf("CR in a line the proxy wrote: %q", line)
		}
		line = bytes.TrimSuffix(line, []byte("\r"))
		name, value, field := bytes.Cut(line, []byte(":"))
		value = bytes.TrimPrefix(value, []byte(" "))
		switch {
		case len(line) == 0:
			if has {
				return event(), nil
			}
		case !field: // a line without a colon: no field the proxy writes
			if r.Strict {
				return event(), fmt.Errorf("unexpected line from the proxy: %q", line)
			}
		case len(name) == 0: // a comment
		case string(name) == "id":
			r.id, has = append(r.id[:0], value...), true
		case string(name) == "event":
			r.typ, has = append(r.typ[:0], value...), true
		case string(name) == "data":
			if hasData {
				r.data = append(r.data, '\n')
			}
			r.data = append(r.data, value...)
			has, hasData = true, true
		case string(name) == "retry":
			has = has || r.Strict
		case r.Strict:
			return event(), fmt.Errorf("unexpected line from the proxy: %q", line)
		}
	}
}

// readLine returns the next line without its LF, or what is left of the
// body with io.EOF. The line is valid until the next call.
func (r *SSEReader) readLine() ([]byte, error) {
	b, err := r.br.ReadSlice('\n')
	if errors.Is(err, bufio.ErrBufferFull) {
		r.line = append(r.line[:0], b...)
		for errors.Is(err, bufio.ErrBufferFull) {
			b, err = r.br.ReadSlice('\n')
			r.line = append(r.line, b...)
		}
		b = r.line
	}
	if err != nil {
		return b, err
	}
	return b[:len(b)-1], nil
}

// ReadEvents reads events from an SSE body until n were read (n 0: until the
// body ends), the body ends, or the timeout passes. The end of the body is
// not an error. With n > 0 it takes no byte past the n-th event, so that
// another ReadEvents on the same body carries on where this one stopped.
func ReadEvents(body io.Reader, n int, timeout time.Duration) ([]Event, error) {
	type result struct {
		evs []Event
		err error
	}
	ch := make(chan result, 1)
	if n > 0 {
		body = oneByteReader{body}
	}
	go func() {
		r := NewSSEReader(body, 4096)
		var evs []Event
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

// AfterPosition returns the events of a resume from lastID without the
// client's own position it begins with (a priming event at lastID, for
// 2025-11-25 sessions): what it replays and relays.
func AfterPosition(evs []Event, lastID string) []Event {
	if len(evs) > 0 && evs[0].ID == lastID && evs[0].Data == "" {
		return evs[1:]
	}
	return evs
}

// ReadResumed is ReadEvents for a resume from lastID: n events (0: to the
// end) after the client's own position it may begin with (AfterPosition).
func ReadResumed(body io.Reader, lastID string, n int, timeout time.Duration) ([]Event, error) {
	first, err := ReadEvents(body, 1, timeout)
	if err != nil || len(first) == 0 {
		return first, err
	}
	if len(AfterPosition(first, lastID)) == 0 {
		return ReadEvents(body, n, timeout)
	}
	if n == 1 {
		return first, nil
	}
	rest, err := ReadEvents(body, max(n-1, 0), timeout)
	return append(first, rest...), err
}

// oneByteReader reads a byte at a time: a bufio.Reader over it stops at the
// line end it looks for instead of reading ahead.
type oneByteReader struct{ r io.Reader }

func (o oneByteReader) Read(p []byte) (int, error) { return o.r.Read(p[:min(len(p), 1)]) }
