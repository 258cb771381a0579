package resume

import (
	"bytes"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
)

// readBody reads what io.ReadAll of limit+1 bytes read, in one buffer of
// the declared size when there is one, whatever the declaration says.
func TestReadBody(t *testing.T) {
	const limit = 16
	for _, c := range []struct {
		name     string
		body     string
		declared int64
		want     string
		err      error
	}{
		{"declared", "0123456789", 10, "0123456789", nil},
		{"empty", "", 0, "", nil},
		{"undeclared", "0123456789", -1, "0123456789", nil},
		{"undeclared, over the limit", strings.Repeat("x", 40), -1, strings.Repeat("x", limit+1), nil},
		{"declared over the limit", strings.Repeat("x", 40), 40, strings.Repeat("x", limit+1), nil},
		{"longer than declared", "0123456789abcdef0123", 10, "0123456789abcdef0", nil},
		{"one byte longer than declared", "0123456789a", 10, "0123456789a", nil},
		{"shorter than declared", "01234", 10, "", io.ErrUnexpectedEOF},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := &http.Request{Body: io.NopCloser(strings.NewReader(c.body)), ContentLength: c.declared}
			got, err := readBody(r, limit)
			if !errors.Is(err, c.err) || !bytes.Equal(got, []byte(c.want)) {
				t.Fatalf("readBody = %q, %v; want %q, %v", got, err, c.want, c.err)
			}
			if c.declared >= 0 && c.declared <= limit && c.err == nil && len(got) <= int(c.declared) && cap(got) > int(c.declared)+1 {
				t.Fatalf("a declared body took %d bytes of buffer for %d", cap(got), c.declared)
			}
		})
	}
	// Past presizeMax a declared length takes no buffer of its size before
	// its bytes come: read as io.ReadAll does.
	big := strings.Repeat("y", presizeMax+100)
	r := &http.Request{Body: io.NopCloser(strings.NewReader(big)), ContentLength: int64(len(big))}
	if got, err := readBody(r, 1<<20); err != nil || string(got) != big {
		t.Fatalf("a declared body over presizeMax: %d bytes, %v", len(got), err)
	}
}
