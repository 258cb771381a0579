package harness

// This file is the kit of the suites that look at whole answers (security
// and others): a finished request with its status, headers, body and,
// strictly parsed, its SSE events; raw requests written byte by byte on a
// connection of their own; and the checks of a JSON-RPC error body and of
// contiguous proxy IDs.

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/internal/eventid"
	"github.com/mcpresume/caddy-mcp-resume/internal/mcptest"
)

// Exchange is a finished request: status, headers, the whole body, and the
// events in it when it was SSE.
type Exchange struct {
	Status int
	Header http.Header
	Body   []byte
	Events []mcptest.Event
}

func (x Exchange) String() string {
	b := x.Body
	if len(b) > 600 {
		b = append(b[:600:600], "…"...)
	}
	return fmt.Sprintf("%d %s %q", x.Status, x.Header.Get("Content-Type"), b)
}

// Finish reads the response to its end.
func Finish(resp *http.Response, err error) (Exchange, error) {
	if err != nil {
		return Exchange{}, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	x := Exchange{Status: resp.StatusCode, Header: resp.Header, Body: body}
	if err != nil {
		return x, fmt.Errorf("reading body: %v (after %d bytes)", err, len(body))
	}
	if mcptest.MediaType(resp.Header) == "text/event-stream" {
		x.Events, err = ParseSSE(body)
	}
	return x, err
}

func MustFinish(t testing.TB, resp *http.Response, err error) Exchange {
	t.Helper()
	x, err := Finish(resp, err)
	if err != nil {
		t.Fatal(err)
	}
	return x
}

// Must is MustFinish for a call returning (*http.Response, error):
// Must(t)(c.resume(id)).
func Must(t testing.TB) func(*http.Response, error) Exchange {
	return func(resp *http.Response, err error) Exchange {
		t.Helper()
		return MustFinish(t, resp, err)
	}
}

// ParseSSE splits a complete SSE body into events, strictly (see
// StreamEvents).
func ParseSSE(body []byte) ([]mcptest.Event, error) {
	var evs []mcptest.Event
	err := StreamEvents(bytes.NewReader(body), func(ev mcptest.Event) bool {
		evs = append(evs, ev)
		return true
	})
	return evs, err
}

// StreamEvents reads SSE events as they arrive and calls fn for each,
// until the body ends or fn returns false. The reader is strict: the proxy
// re-frames upstream events with LF only and the fields it knows, so
// anything else from it is an error.
func StreamEvents(r io.Reader, fn func(mcptest.Event) bool) error {
	sr := mcptest.NewSSEReader(r, 64<<10)
	sr.Strict = true
	for {
		ev, err := sr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		if !fn(ev) {
			return nil
		}
	}
}

// RPCError checks that x is status with a JSON-RPC error body (Content-Type
// application/json, an "error" object with a code and a message) and
// returns the error.
func RPCError(t testing.TB, x Exchange, status int) (code int, message string) {
	t.Helper()
	if x.Status != status {
		t.Fatalf("want %d with a JSON-RPC error, got %s", status, x)
	}
	if mt := mcptest.MediaType(x.Header); mt != "application/json" {
		t.Fatalf("want Content-Type application/json, got %q (%s)", mt, x)
	}
	var m struct {
		JSONRPC string `json:"jsonrpc"`
		Error   *struct {
			Code    *int   `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
	}
	if err := json.Unmarshal(x.Body, &m); err != nil || m.JSONRPC != "2.0" || m.Error == nil || m.Error.Code == nil || m.Error.Message == "" {
		t.Fatalf("want a JSON-RPC error object, got %s (%v)", x, err)
	}
	return *m.Error.Code, m.Error.Message
}

func Decode(data string) (mcptest.Message, bool) {
	m, err := mcptest.DecodeMessage(data)
	return m, err == nil
}

// CheckIDs checks that every event carries a proxy ID of one stream, with
// contiguous seqs (a leading priming event at seq 0 allowed), and returns
// the parsed IDs.
func CheckIDs(evs []mcptest.Event) ([]eventid.ID, error) {
	var out []eventid.ID
	for i, ev := range evs {
		id, err := eventid.Parse(ev.ID)
		if err != nil {
			return nil, fmt.Errorf("event %d: id %q is not a proxy id: %+v", i, ev.ID, ev)
		}
		if i > 0 {
			prev := out[i-1]
			if id.Epoch != prev.Epoch || id.Stream != prev.Stream {
				return nil, fmt.Errorf("event %d: id %s after %s: another stream", i, ev.ID, prev)
			}
			if id.Seq != prev.Seq+1 && ev.Type != "gap" {
				return nil, fmt.Errorf("event %d: id %s after %s: not contiguous", i, ev.ID, prev)
			}
		}
		out = append(out, id)
	}
	return out, nil
}

// RawExchange writes raw request bytes on a fresh connection and reads one
// response. With headersOnly the body is not read (an open stream).
func RawExchange(addr, request string, headersOnly bool) (Exchange, error) {
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return Exchange{}, err
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(30 * time.Second))
	if _, err := io.WriteString(conn, request); err != nil {
		return Exchange{}, err
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		return Exchange{}, fmt.Errorf("reading response: %v", err)
	}
	if headersOnly {
		return Exchange{Status: resp.StatusCode, Header: resp.Header}, nil
	}
	return Finish(resp, nil)
}

// RawGet builds a GET /mcp with the given header lines (each without CRLF;
// they are written verbatim, so they may carry anything).
func RawGet(host, sid, version string, lines ...string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "GET /mcp HTTP/1.1\r\nHost: %s\r\nAccept: text/event-stream\r\nConnection: close\r\n", host)
	if sid != "" {
		fmt.Fprintf(&b, "Mcp-Session-Id: %s\r\nMcp-Protocol-Version: %s\r\n", sid, version)
	}
	for _, l := range lines {
		b.WriteString(l)
		b.WriteString("\r\n")
	}
	b.WriteString("\r\n")
	return b.String()
}
