package jsonrpc

import (
	"bytes"
	"unicode/utf8"
)

// Reading the members of a message without decoding it: a call's POST body
// is parsed on every request, and decoding it whole (a map of every member,
// each copied) was most of the allocations the proxy adds to a call. These
// functions take text encoding/json has validated (json.Valid): they only
// find where members and values begin and end.

// members are the top-level members parseOne reads: each value's bytes
// (the last one, where a name repeats, as encoding/json keeps it), nil if
// absent.
type members struct {
	id, method, params []byte
	result, error      bool
}

// topMembers finds the members of the object raw (valid JSON); ok is false
// if raw is no object or a member's name has escapes (its name is then
// encoding/json's to read).
func topMembers(raw []byte) (m members, ok bool) {
	i := skipSpace(raw, 0)
	if i == len(raw) || raw[i] != '{' {
		return m, false
	}
	for i++; ; {
		i = skipSpace(raw, i)
		switch raw[i] {
		case '}':
			return m, true
		case ',':
			i = skipSpace(raw, i+1)
		}
		end := stringEnd(raw, i)
		name := raw[i+1 : end-1]
		if bytes.IndexByte(name, '\\') >= 0 {
			return m, false
		}
		i = skipSpace(raw, end)
		i = skipSpace(raw, i+1) // the colon
		end = valueEnd(raw, i)
		v := raw[i:end:end]
		switch string(name) {
		case "id":
			m.id = v
		case "method":
			m.method = v
		case "params":
			m.params = v
		case "result":
			m.result = true
		case "error":
			m.error = true
		}
		i = end
	}
}

func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// stringEnd is the index after the string starting at b[i] (a quote).
func stringEnd(b []byte, i int) int {
	for i++; ; i++ {
		switch b[i] {
		case '\\':
			i++
		case '"':
			return i + 1
		}
	}
}

// valueEnd is the index after the value starting at b[i].
func valueEnd(b []byte, i int) int {
	switch b[i] {
	case '"':
		return stringEnd(b, i)
	case '{', '[':
		depth := 0
		for ; ; i++ {
			switch b[i] {
			case '"':
				i = stringEnd(b, i) - 1
			case '{', '[':
				depth++
			case '}', ']':
				if depth--; depth == 0 {
					return i + 1
				}
			}
		}
	default: // a number, true, false or null
		for ; i < len(b); i++ {
			switch b[i] {
			case ',', '}', ']', ' ', '\t', '\n', '\r':
				return i
			}
		}
		return i
	}
}

// plainString is the JSON string v (with its quotes) as Go text, if it needs
// no decoding: no escapes, valid UTF-8 (encoding/json replaces what is not).
func plainString(v []byte) (string, bool) {
	if len(v) < 2 || v[0] != '"' {
		return "", false
	}
	s := v[1 : len(v)-1]
	if bytes.IndexByte(s, '\\') >= 0 || !utf8.Valid(s) {
		return "", false
	}
	return string(s), true
}
