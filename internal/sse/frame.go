package sse

import (
	"bytes"
	"strconv"
)

// AppendFields appends the event's type, retry and data fields (no id, no
// terminating blank line) in canonical LF form; data lines only if it has data. The proxy stores this form and
// adds its own id line when it writes the event to a client.
func AppendFields(dst []byte, ev *Event) []byte {
	if ev.Type != "" {
		dst = append(dst, "event: "...)
		dst = append(dst, ev.Type...)
		dst = append(dst, '\n')
	}
	if ev.HasRetry {
		dst = append(dst, "retry: "...)
		dst = strconv.AppendInt(dst, ev.Retry, 10)
		dst = append(dst, '\n')
	}
	if !ev.HasData {
		// No data line: adding one would turn an event clients do not
		// dispatch (retry or type only) into an empty message.
		return dst
	}
	return AppendData(dst, ev.Data)
}

// FieldsLen is the length AppendFields appends for ev, so callers can
// allocate exactly.
func FieldsLen(ev *Event) int {
	n := 0
	if ev.Type != "" {
		n += len("event: ") + len(ev.Type) + 1
	}
	if ev.HasRetry {
		n += len("retry: ") + len(strconv.FormatInt(ev.Retry, 10)) + 1
	}
	if ev.HasData {
		nl := bytes.Count(ev.Data, []byte{'\n'}) // each LF becomes a line end
		n += len(ev.Data) - nl + (nl+1)*len("data: \n")
	}
	return n
}

// AppendData appends data as one "data:" line per LF-separated line. A data
// value can never contain CR here: the parser splits lines on it.
func AppendData(dst, data []byte) []byte {
	for {
		i := bytes.IndexByte(data, '\n')
		dst = append(dst, "data: "...)
		if i < 0 {
			dst = append(dst, data...)
			return append(dst, '\n')
		}
		dst = append(dst, data[:i]...)
		dst = append(dst, '\n')
		data = data[i+1:]
	}
}

// AppendID appends an "id:" line.
func AppendID(dst []byte, id string) []byte {
	dst = append(dst, "id: "...)
	dst = append(dst, id...)
	return append(dst, '\n')
}

// AppendComment appends a comment line and the blank line that ends it, which
// is how keep-alives are written.
func AppendComment(dst []byte, text string) []byte {
	dst = append(dst, ':')
	if text != "" {
		dst = append(dst, ' ')
		dst = append(dst, text...)
	}
	return append(dst, '\n', '\n')
}
