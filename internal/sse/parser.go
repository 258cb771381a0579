// Package sse parses and frames Server-Sent Events (WHATWG HTML §9.2) incrementally.
//
// The parser is fed whatever byte chunks arrive from an upstream response: an
// event may be split across chunks and one chunk may hold several events. Line
// endings may be LF, CRLF or CR, and may themselves be split across chunks.
package sse

import (
	"bytes"
	"errors"
	"strconv"
)

// ErrEventTooLarge is returned when one event (or one unterminated line) grows
// past the parser's size bound.
var ErrEventTooLarge = errors.New("sse: event exceeds size limit")

// DefaultMaxEventBytes bounds one event when Parser.MaxEventBytes is zero.
const DefaultMaxEventBytes = 4 << 20

// keepBuffer is the largest buffer a parser keeps between events: a stream
// that once carried a large event must not hold that much for its life.
const keepBuffer = 64 << 10

// Event is one dispatched SSE event. Data aliases the parser's buffer and is
// only valid until the emit callback returns.
type Event struct {
	ID       string
	HasID    bool
	Type     string // the "event" field; empty means "message"
	Data     []byte // data lines joined with LF, without the trailing LF
	HasData  bool   // at least one data line was seen
	Retry    int64  // reconnection time in ms, when HasRetry
	HasRetry bool
}

// Parser is an incremental SSE parser. The zero value is ready to use.
type Parser struct {
	MaxEventBytes int // bound on one event's field bytes; 0 means DefaultMaxEventBytes

	line    []byte // an unterminated line carried over from the previous chunk
	skipLF  bool   // the previous chunk ended in CR: a leading LF belongs to it
	started bool   // the optional leading BOM has been dealt with
	size    int    // bytes accumulated for the current event
	ev      Event
	data    []byte
}

// Feed parses p and calls emit for every complete event, in order. An error from
// emit stops parsing and is returned. After ErrEventTooLarge the parser must not
// be fed again.
func (p *Parser) Feed(b []byte, emit func(*Event) error) error {
	max := p.MaxEventBytes
	if max <= 0 {
		max = DefaultMaxEventBytes
	}
	// Line ends are found with vectorised IndexByte scans rather than
	// IndexAny's byte loop. lf, the next LF in b (-1: none), is kept across
	// lines, so CR-only input does not rescan the rest of b for every line.
	lf := bytes.IndexByte(b, '\n')
	for len(b) > 0 {
		if p.skipLF {
			p.skipLF = false
			if b[0] == '\n' {
				b, lf = b[1:], bytes.IndexByte(b[1:], '\n')
				continue
			}
		}
		end := len(b) // a CR past the next LF belongs to a later line
		if lf >= 0 {
			end = lf
		}
		i := lf
		if cr := bytes.IndexByte(b[:end], '\r'); cr >= 0 {
			i = cr
		}
		if i < 0 {
			if len(p.line)+len(b)+p.size > max {
				return ErrEventTooLarge
			}
			p.line = append(p.line, b...)
			return nil
		}
		var line []byte
		if len(p.line) > 0 {
			if len(p.line)+i+p.size > max {
				return ErrEventTooLarge
			}
			p.line = append(p.line, b[:i]...)
			line = p.line
		} else {
			line = b[:i]
		}
		if b[i] == '\r' {
			if i+1 < len(b) {
				if b[i+1] == '\n' {
					i++
				}
			} else {
				p.skipLF = true
			}
		}
		b = b[i+1:]
		if lf >= 0 {
			if lf <= i {
				lf = bytes.IndexByte(b, '\n')
			} else {
				lf -= i + 1
			}
		}
		if err := p.processLine(line, max, emit); err != nil {
			return err
		}
		p.line = p.line[:0]
		if cap(p.line) > keepBuffer {
			p.line = nil
		}
	}
	return nil
}

func (p *Parser) processLine(line []byte, max int, emit func(*Event) error) error {
	if p.size+len(line) > max {
		// Checked for every line, comments included, so the outcome does not
		// depend on how the input was chunked (Feed checks partial lines).
		return ErrEventTooLarge
	}
	if !p.started {
		p.started = true
		line = bytes.TrimPrefix(line, []byte("\xEF\xBB\xBF"))
	}
	if len(line) == 0 {
		return p.dispatch(emit)
	}
	if line[0] == ':' {
		return nil // comment, e.g. a keep-alive
	}
	p.size += len(line)
	if p.size > max {
		return ErrEventTooLarge
	}
	field, value := line, []byte(nil)
	if c := bytes.IndexByte(line, ':'); c >= 0 {
		field, value = line[:c], line[c+1:]
		if len(value) > 0 && value[0] == ' ' {
			value = value[1:]
		}
	}
	switch string(field) {
	case "data":
		if p.ev.HasData {
			p.data = append(p.data, '\n')
		}
		p.data = append(p.data, value...)
		p.ev.HasData = true
	case "event":
		p.ev.Type = string(value)
	case "id":
		if bytes.IndexByte(value, 0) < 0 { // the spec ignores ids containing NUL
			p.ev.ID, p.ev.HasID = string(value), true
		}
	case "retry":
		if n, err := strconv.ParseInt(string(value), 10, 64); err == nil && n >= 0 && isDigits(value) {
			p.ev.Retry, p.ev.HasRetry = n, true
		}
	}
	return nil
}

func (p *Parser) dispatch(emit func(*Event) error) error {
	if !p.ev.HasData && !p.ev.HasID && !p.ev.HasRetry && p.ev.Type == "" {
		p.size = 0 // only unknown or ignored fields (if any): nothing to dispatch
		return nil
	}
	p.ev.Data = p.data
	err := emit(&p.ev)
	p.ev = Event{}
	p.data = p.data[:0]
	if cap(p.data) > keepBuffer {
		p.data = nil
	}
	p.size = 0
	return err
}

func isDigits(b []byte) bool {
	for _, c := range b {
		if c < '0' || c > '9' {
			return false
		}
	}
	return len(b) > 0
}

// Finish ends the input: a pending unterminated line is processed and a
// pending event that has data is dispatched, as at a blank line.
func (p *Parser) Finish(emit func(*Event) error) error {
	max := p.MaxEventBytes
	if max <= 0 {
		max = DefaultMaxEventBytes
	}
	if len(p.line) > 0 {
		line := p.line
		p.line = nil
		if err := p.processLine(line, max, emit); err != nil {
			return err
		}
	}
	if !p.ev.HasData {
		p.ev, p.data, p.size = Event{}, p.data[:0], 0
		return nil
	}
	return p.dispatch(emit)
}
