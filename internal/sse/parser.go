// Package sse parses and frames Server-Sent Events (WHATWG HTML §9.2) incrementally.
//
// The parser is fed whatever byte chunks arrive from an upstream response: an
// event may be split across chunks and one chunk may hold several events. Line
// endings may be LF, CRLF or CR, and may themselves be split across chunks.
package sse

import (
	"bytes"
	"errors"
	"math"
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

// Event is one dispatched SSE event. Data and Raw alias the parser's buffer
// or the chunk being fed, and are only valid until the emit callback returns.
type Event struct {
	ID       string
	HasID    bool
	Type     string // the "event" field; empty means "message"
	Data     []byte // data lines joined with LF, without the trailing LF
	HasData  bool   // at least one data line was seen
	Retry    int64  // reconnection time in ms, when HasRetry
	HasRetry bool
	// Raw, when not nil, is what AppendFields writes for the event without
	// its retry field, found as such in the input: the event's "event:" line
	// (if any) and its "data: " lines, contiguous and LF-terminated within
	// one chunk. A proxy that stores that form can take it as it came,
	// instead of re-framing it. Ids, retry fields, comments and other lines
	// may precede the first of them; none may come between.
	Raw []byte
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
	// aliased: ev.Data is a value in the chunk being fed, not in data (a
	// single data line needs no copy); copied into data before Feed returns.
	aliased bool
	// raw is the chunk being fed from the event's first "event:" or "data:"
	// line on, rawLen how much of it the event's lines take, while the event
	// may still have a Raw form; rawBad once it cannot.
	raw    []byte
	rawLen int
	rawBad bool
	typ    string // the last type seen, reused so that a repeated type costs no allocation
}

// Feed parses p and calls emit for every complete event, in order. An error from
// emit stops parsing and is returned. After ErrEventTooLarge the parser must not
// be fed again.
func (p *Parser) Feed(b []byte, emit func(*Event) error) error {
	err := p.feed(b, emit)
	// What aliases b must not outlive this call: the caller reuses b.
	if p.aliased {
		p.data = append(p.data[:0], p.ev.Data...)
		p.aliased = false
	}
	if p.raw != nil {
		p.raw, p.rawBad = nil, true
	}
	return err
}

func (p *Parser) feed(b []byte, emit func(*Event) error) error {
	max := p.MaxEventBytes
	if max <= 0 {
		max = DefaultMaxEventBytes
	}
	// Line ends are found with vectorised IndexByte scans rather than
	// IndexAny's byte loop. lf and cr, the next LF and CR at or after pos
	// (len(b): none), are each found again only once passed, so every byte
	// is scanned once for each; input without CR costs one CR scan in all.
	next := func(c byte, from int) int {
		if i := bytes.IndexByte(b[from:], c); i >= 0 {
			return from + i
		}
		return len(b)
	}
	lf, cr := next('\n', 0), next('\r', 0)
	for pos := 0; pos < len(b); {
		if p.skipLF {
			p.skipLF = false
			if b[pos] == '\n' {
				pos++
				if lf < pos {
					lf = next('\n', pos)
				}
				continue
			}
		}
		i := min(lf, cr)
		if i == len(b) {
			if len(p.line)+len(b)-pos+p.size > max {
				return ErrEventTooLarge
			}
			p.line = append(p.line, b[pos:]...)
			return nil
		}
		var line []byte
		direct := false // line is in b, ended by a lone LF: what Raw takes
		if len(p.line) > 0 {
			if len(p.line)+i-pos+p.size > max {
				return ErrEventTooLarge
			}
			p.line = append(p.line, b[pos:i]...)
			line = p.line
		} else {
			line, direct = b[pos:i], b[i] == '\n'
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
		pos = i + 1
		if lf < pos {
			lf = next('\n', pos)
		}
		if cr < pos {
			cr = next('\r', pos)
		}
		if err := p.processLine(line, direct, max, emit); err != nil {
			return err
		}
		p.line = p.line[:0]
		if cap(p.line) > keepBuffer {
			p.line = nil
		}
	}
	return nil
}

// processLine takes one line without its end; direct says it is in the
// chunk being fed, ended by a lone LF.
func (p *Parser) processLine(line []byte, direct bool, max int, emit func(*Event) error) error {
	if p.size+len(line) > max {
		// Checked for every line, comments included, so the outcome does not
		// depend on how the input was chunked (Feed checks partial lines).
		return ErrEventTooLarge
	}
	if !p.started {
		p.started = true
		if bytes.HasPrefix(line, []byte("\xEF\xBB\xBF")) {
			line, direct = line[3:], false
		}
	}
	if len(line) == 0 {
		return p.dispatch(emit)
	}
	if line[0] == ':' {
		p.notRaw() // comment, e.g. a keep-alive
		return nil
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
		// As AppendFields writes it: "data: " and the value.
		p.rawLine(line, direct && len(value) < len(line)-len("data:"))
		switch {
		case !p.ev.HasData && direct:
			p.ev.Data, p.aliased = value, true // no copy, unless another line follows
		case p.aliased:
			p.data = append(append(append(p.data[:0], p.ev.Data...), '\n'), value...)
			p.aliased = false
		default:
			if p.ev.HasData {
				p.data = append(p.data, '\n')
			}
			p.data = append(p.data, value...)
		}
		p.ev.HasData = true
	case "event":
		if len(value) == 0 {
			p.notRaw() // no type: AppendFields writes no line for it
		} else {
			// As AppendFields writes it: "event: " and the type, first of all.
			p.rawLine(line, direct && p.raw == nil && len(value) < len(line)-len("event:"))
		}
		if string(value) != p.typ {
			p.typ = string(value)
		}
		p.ev.Type = p.typ
	case "id":
		p.notRaw()
		if bytes.IndexByte(value, 0) < 0 { // the spec ignores ids containing NUL
			p.ev.ID, p.ev.HasID = string(value), true
		}
	case "retry":
		p.notRaw()
		if isDigits(value) {
			p.ev.Retry, p.ev.HasRetry = parseRetry(value), true
		}
	default:
		p.notRaw()
	}
	return nil
}

// rawLine extends the event's Raw form by line (a slice of the chunk being
// fed), or ends the chance of one if the line does not qualify.
func (p *Parser) rawLine(line []byte, ok bool) {
	switch {
	case p.rawBad:
	case !ok:
		p.raw, p.rawBad = nil, true
	case p.raw == nil:
		p.raw, p.rawLen = line[:0], len(line)+1 // from the line's start on
	default:
		p.rawLen += len(line) + 1
	}
}

// notRaw notes a line that Raw cannot hold: before the event's fields it is
// simply not part of them; among them it ends the chance of a Raw form.
func (p *Parser) notRaw() {
	if p.raw != nil {
		p.raw, p.rawBad = nil, true
	}
}

func (p *Parser) dispatch(emit func(*Event) error) error {
	if !p.ev.HasData && !p.ev.HasID && !p.ev.HasRetry && p.ev.Type == "" {
		p.resetEvent() // only unknown or ignored fields (if any): nothing to dispatch
		return nil
	}
	if !p.aliased {
		p.ev.Data = p.data
	}
	if p.raw != nil && !p.rawBad && p.ev.HasData {
		p.ev.Raw = p.raw[:p.rawLen]
	}
	err := emit(&p.ev)
	p.resetEvent()
	return err
}

func (p *Parser) resetEvent() {
	p.ev = Event{}
	p.data = p.data[:0]
	if cap(p.data) > keepBuffer {
		p.data = nil
	}
	p.size = 0
	p.aliased, p.raw, p.rawLen, p.rawBad = false, nil, 0, false
}

// parseRetry reads a retry field of ASCII digits. A value beyond int64
// saturates rather than being ignored: the spec takes any digits as the
// reconnection time, and an upstream that wrote an enormous one asked for
// the longest wait, not for the last one it gave.
func parseRetry(b []byte) int64 {
	n, err := strconv.ParseInt(string(b), 10, 64)
	if err != nil {
		return math.MaxInt64 // only digits: the one error is a value out of range
	}
	return n
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
		if err := p.processLine(line, false, max, emit); err != nil {
			return err
		}
	}
	if !p.ev.HasData {
		p.resetEvent()
		return nil
	}
	return p.dispatch(emit)
}
