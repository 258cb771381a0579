// Package jsonrpc peeks at JSON-RPC 2.0 messages as MCP carries them: enough to
// route and account for them, without decoding payloads the proxy only relays.
package jsonrpc

import (
	"bytes"
	"encoding/json"
)

// Kind classifies a message by its top-level members.
type Kind uint8

const (
	Invalid      Kind = iota // not a JSON object with a recognisable shape
	Request                  // method and id
	Notification             // method, no id
	Response                 // id and result or error, no method
)

func (k Kind) String() string {
	return [...]string{"invalid", "request", "notification", "response"}[k]
}

// Message is what Peek found at the top level of one message. ID and Method
// alias the input.
type Message struct {
	Kind   Kind
	ID     []byte // raw JSON of the id member, e.g. `7` or `"a"`; nil if absent or null
	Method []byte // raw JSON string of the method member, quotes included
}

// Peek scans the top level of one JSON object and reports its kind. It skips
// member values without decoding them, so its cost is one pass over the bytes.
// It does not validate JSON beyond what it needs; invalid input yields Invalid.
func Peek(data []byte) Message { return peek(data, false) }

// PeekResponse reports the id of a response, stopping at the first top-level
// method member: a message with a method is no response, and SDKs put method
// near the front, so notifications (most of a stream) cost a few bytes, not a
// pass over their payload. It never reports a response Peek would not.
func PeekResponse(data []byte) (id []byte, ok bool) {
	// The notifications SDKs write (compact JSON, "jsonrpc" then "method",
	// or "method" first) are known by their first bytes: the scan would stop
	// at that method member too (a string value: a notification, or invalid
	// if it never ends), so no scan is needed.
	if bytes.HasPrefix(data, notificationPrefix) || bytes.HasPrefix(data, methodFirstPrefix) {
		return nil, false
	}
	m := peek(data, true)
	return m.ID, m.Kind == Response
}

var (
	notificationPrefix = []byte(`{"jsonrpc":"2.0","method":"`)
	methodFirstPrefix  = []byte(`{"method":"`)
)

func peek(data []byte, stopAtMethod bool) Message {
	var m Message
	s := scanner{b: data}
	s.ws()
	if !s.eat('{') {
		return m
	}
	var hasResult, hasError, hasMethod bool
	s.ws()
	if s.eat('}') {
		return m
	}
	for {
		s.ws()
		key, ok := s.str()
		if !ok {
			return Message{}
		}
		s.ws()
		if !s.eat(':') {
			return Message{}
		}
		s.ws()
		start := s.i
		if !s.value(0) {
			return Message{}
		}
		val := s.b[start:s.i]
		name, ok := keyName(key)
		if !ok {
			return Message{}
		}
		// A repeated member replaces the earlier one, as in encoding/json
		// and JSON.parse, so the proxy reads what the peer reads.
		switch string(name) {
		case "id":
			m.ID = nil
			if !bytes.Equal(val, []byte("null")) {
				m.ID = val
			}
		case "method":
			m.Method, hasMethod = nil, false
			if len(val) > 0 && val[0] == '"' {
				m.Method, hasMethod = val, true
				if stopAtMethod {
					return Message{Kind: Notification, Method: val}
				}
			}
		case "result":
			hasResult = true
		case "error":
			hasError = true
		}
		s.ws()
		if s.eat(',') {
			continue
		}
		if s.eat('}') {
			break
		}
		return Message{}
	}
	switch {
	case hasMethod && m.ID != nil:
		m.Kind = Request
	case hasMethod:
		m.Kind = Notification
	case (hasResult || hasError) && (m.ID != nil || hasError):
		m.Kind = Response
	}
	return m
}

// keyName returns a member name without its quotes, decoding escapes (rare,
// so only then does it allocate): `"\u0069d"` names the same member as `"id"`.
func keyName(key []byte) ([]byte, bool) {
	name := key[1 : len(key)-1]
	if bytes.IndexByte(name, '\\') < 0 {
		return name, true
	}
	var k string
	if json.Unmarshal(key, &k) != nil {
		return nil, false
	}
	return []byte(k), true
}

// PeekAll calls fn for the message in data, or for each element when data is
// a batch (a JSON array, allowed by MCP 2025-03-26).
func PeekAll(data []byte, fn func(Message)) {
	s := scanner{b: data}
	s.ws()
	if !s.eat('[') {
		fn(Peek(data))
		return
	}
	for {
		s.ws()
		if s.eat(']') {
			return
		}
		start := s.i
		if !s.value(0) {
			return
		}
		fn(Peek(s.b[start:s.i]))
		s.ws()
		if !s.eat(',') {
			return
		}
	}
}

// maxDepth bounds nesting so hostile input cannot exhaust the stack.
const maxDepth = 10000

type scanner struct {
	b []byte
	i int
}

func (s *scanner) ws() {
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case ' ', '\t', '\r', '\n':
			s.i++
		default:
			return
		}
	}
}

func (s *scanner) eat(c byte) bool {
	if s.i < len(s.b) && s.b[s.i] == c {
		s.i++
		return true
	}
	return false
}

// str consumes a JSON string and returns it raw, quotes included.
func (s *scanner) str() ([]byte, bool) {
	start := s.i
	if !s.eat('"') {
		return nil, false
	}
	// Jump from quote to quote with vectorised scans; an escape before a
	// quote may escape it. Every byte is scanned a bounded number of times,
	// so hostile strings full of backslashes stay linear.
	for {
		q := bytes.IndexByte(s.b[s.i:], '"')
		if q < 0 {
			s.i = len(s.b)
			return nil, false
		}
		quote := s.i + q
		for {
			e := bytes.IndexByte(s.b[s.i:quote], '\\')
			if e < 0 {
				break
			}
			s.i += e + 2 // the escaped character is skipped, whatever it is
			if s.i > quote {
				break
			}
		}
		if s.i > quote {
			continue // that quote was escaped
		}
		s.i = quote + 1
		return s.b[start:s.i], true
	}
}

// value skips one JSON value.
func (s *scanner) value(depth int) bool {
	if s.i >= len(s.b) || depth > maxDepth {
		return false
	}
	switch s.b[s.i] {
	case '"':
		_, ok := s.str()
		return ok
	case '{', '[':
		open := s.b[s.i]
		close := byte('}')
		if open == '[' {
			close = ']'
		}
		s.i++
		s.ws()
		if s.eat(close) {
			return true
		}
		for {
			s.ws()
			if open == '{' {
				if _, ok := s.str(); !ok {
					return false
				}
				s.ws()
				if !s.eat(':') {
					return false
				}
				s.ws()
			}
			if !s.value(depth + 1) {
				return false
			}
			s.ws()
			if s.eat(close) {
				return true
			}
			if !s.eat(',') {
				return false
			}
		}
	default:
		start := s.i
		for s.i < len(s.b) {
			switch s.b[s.i] {
			case ',', '}', ']', ' ', '\t', '\r', '\n':
				return s.i > start
			}
			s.i++
		}
		return s.i > start
	}
}
