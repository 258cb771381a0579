package jsonrpc

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
)

// The proxy classifies a client's POST body with ParseBody (is it an
// initialize? which request ids does the stream answer?), and the upstream
// classifies the same bytes with its own JSON-RPC decoder. The official Go
// SDK decodes member names case-sensitively (segmentio/encoding with
// DontMatchCaseInsensitiveStructFields, a security fix), last duplicate wins,
// as JSON.parse does in the TypeScript SDK. Whenever the proxy and the
// upstream read one body differently, the proxy accounts for requests the
// upstream never saw (and misses the ones it did).

// upstreamReading classifies one JSON object as the upstream SDKs read it:
// exact member names, escapes decoded, the last duplicate wins. ok is false
// when they would reject it.
func upstreamReading(raw []byte) (c Call, ok bool) {
	var m map[string]json.RawMessage
	if json.Unmarshal(raw, &m) != nil || m == nil {
		return Call{}, false
	}
	if id, has := m["id"]; has && string(id) != "null" {
		c.ID = id
	}
	if method, has := m["method"]; has && string(method) != "null" {
		if json.Unmarshal(method, &c.Method) != nil {
			return Call{}, false
		}
		c.Kind = Notification
		if c.ID != nil {
			c.Kind = Request
		}
		return c, true
	}
	if _, has := m["result"]; has {
		c.Kind = Response
		return c, true
	}
	if _, has := m["error"]; has {
		c.Kind = Response
		return c, true
	}
	return Call{}, false
}

// relevantKeys are the members the classification depends on.
var relevantKeys = []string{"id", "method", "result", "error", "params"}

// keyShape reports, for a JSON object, whether a member name equals a
// relevant key only when case is ignored (e.g. "ID", "Method"), and whether
// a relevant key occurs twice. Names are decoded (escapes resolved).
func keyShape(raw []byte) (caseVariant, duplicate bool) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return false, false
	}
	seen := map[string]bool{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return false, false
		}
		name, _ := tok.(string)
		for _, k := range relevantKeys {
			if name != k && strings.EqualFold(name, k) {
				caseVariant = true
			}
		}
		if seen[name] {
			for _, k := range relevantKeys {
				if name == k {
					duplicate = true
				}
			}
		}
		seen[name] = true
		var skip json.RawMessage
		if dec.Decode(&skip) != nil {
			return false, false
		}
	}
	return caseVariant, duplicate
}

var parseBodySeeds = []string{
	`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo","arguments":{"text":"x"}}}`,
	`{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-03-26","capabilities":{}}}`,
	`{"jsonrpc":"2.0","method":"notifications/initialized"}`,
	`{"jsonrpc":"2.0","id":"s","result":{}}`,
	`{"jsonrpc":"2.0","id":null,"error":{"code":-32600,"message":"x"}}`,
	`[{"jsonrpc":"2.0","id":1,"method":"a"},{"jsonrpc":"2.0","id":"1","method":"b"}]`,
	`[]`, `[1]`, `[null]`, `null`, `{}`, `"x"`, `{"method":1}`, `{"method":null,"result":1}`,
	`{"id":{"a":[1,2]},"method":"m"}`, `{"id":1.5e3,"method":"m"}`, `{"id":true,"method":"m"}`,
	`{"\u0069d":7,"\u006dethod":"m"}`, `{"id":1,"method":"m"} x`, ` {"method":"m"} `,
	`{"method":"m","params":[1,{"protocolVersion":2}]}`, "{\"method\":\"\xff\xfe\"}",
	`{"ID":1,"method":"m"}`, `{"id":1,"method":"a","Method":"initialize"}`, `{"id":1,"id":2,"method":"m"}`,
	`[[{"id":1,"method":"m"}]]`, strings.Repeat("[", 5000),
}

// FuzzParseBody: ParseBody never panics; it accepts only what encoding/json
// accepts; what it accepts is well-formed (a request has a non-null id, a
// notification none, a batch is an array); where the upstream SDKs' reading
// is unambiguous (no case-variant or duplicate member names) it reads the
// body as they do; and a well-formed message is never refused. Key case is
// checked by TestParseBodyReadsKeysAsUpstream below.
func FuzzParseBody(f *testing.F) {
	for _, s := range parseBodySeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		calls, batch, err := ParseBody(body)
		trimmed := bytes.TrimSpace(body)
		if err != nil {
			if calls != nil {
				t.Fatalf("calls %v with error %v", calls, err)
			}
			// A refusal is fine (the body passes through to the upstream),
			// unless the body is one well-formed message the upstream accepts.
			if len(trimmed) > 0 && trimmed[0] == '{' {
				if cv, dup := keyShape(trimmed); !cv && !dup {
					if _, ok := upstreamReading(trimmed); ok {
						t.Fatalf("refused a well-formed message %q: %v", body, err)
					}
				}
			}
			return
		}
		if !json.Valid(trimmed) {
			t.Fatalf("accepted invalid JSON %q", body)
		}
		if len(calls) == 0 {
			t.Fatalf("accepted %q with no calls", body)
		}
		if batch != (trimmed[0] == '[') {
			t.Fatalf("batch=%v for %q", batch, body)
		}
		var elems []json.RawMessage
		if batch {
			if err := json.Unmarshal(trimmed, &elems); err != nil || len(elems) != len(calls) {
				t.Fatalf("batch of %d elements read as %d calls: %q", len(elems), len(calls), body)
			}
		} else {
			elems = []json.RawMessage{trimmed}
		}
		for i, c := range calls {
			switch c.Kind {
			case Request:
				if c.ID == nil || string(c.ID) == "null" || !json.Valid(c.ID) {
					t.Fatalf("request %d with id %q in %q", i, c.ID, body)
				}
			case Notification:
				if c.ID != nil {
					t.Fatalf("notification %d with id %q in %q", i, c.ID, body)
				}
			case Response:
			default:
				t.Fatalf("call %d of kind %v in %q", i, c.Kind, body)
			}
			if c.ProtocolVersion != "" && c.Method != "initialize" {
				t.Fatalf("protocol version %q on %q", c.ProtocolVersion, c.Method)
			}
			if cv, dup := keyShape(elems[i]); cv || dup {
				continue
			}
			want, ok := upstreamReading(elems[i])
			if !ok {
				t.Fatalf("accepted element %d that the upstream rejects: %q", i, elems[i])
			}
			if want.Kind != c.Kind || want.Method != c.Method || !bytes.Equal(want.ID, c.ID) {
				t.Fatalf("element %d read as %v %q id %q; the upstream reads %v %q id %q",
					i, c.Kind, c.Method, c.ID, want.Kind, want.Method, want.ID)
			}
		}
	})
}

// TestParseBodyReadsKeysAsUpstream: member names are case-sensitive in
// JSON-RPC and in the upstream SDKs; ParseBody must not see an id, a method
// or an initialize where the upstream sees none (or another).
func TestParseBodyReadsKeysAsUpstream(t *testing.T) {
	for _, body := range []string{
		// the upstream sees a notification; the proxy must not open a request stream for id 5
		`{"jsonrpc":"2.0","method":"notifications/cancelled","ID":5}`,
		// the upstream answers id 1; the proxy must wait for id 1, not 2
		`{"jsonrpc":"2.0","id":1,"method":"tools/call","Id":2,"params":{"name":"echo"}}`,
		// the upstream runs tools/call; the proxy must not take it for an initialize
		`{"jsonrpc":"2.0","id":1,"method":"tools/call","METHOD":"initialize"}`,
		// the upstream rejects it (no method, no result); the proxy must not see a request
		`{"jsonrpc":"2.0","Id":3,"Method":"tools/call"}`,
	} {
		want, wantOK := upstreamReading([]byte(body))
		calls, _, err := ParseBody([]byte(body))
		switch {
		case !wantOK && err == nil:
			t.Errorf("%s: ParseBody reads %v %q id %s; the upstream rejects it", body, calls[0].Kind, calls[0].Method, calls[0].ID)
		case wantOK && err != nil:
			t.Errorf("%s: ParseBody refuses it; the upstream reads %v %q", body, want.Kind, want.Method)
		case wantOK && (calls[0].Kind != want.Kind || calls[0].Method != want.Method || !bytes.Equal(calls[0].ID, want.ID)):
			t.Errorf("%s: ParseBody reads %v %q id %s; the upstream reads %v %q id %s",
				body, calls[0].Kind, calls[0].Method, calls[0].ID, want.Kind, want.Method, want.ID)
		}
	}
}

// FuzzParseOneAsDecoded: parseOne, which reads the members it needs from
// the bytes, reads every body as decoding it whole does (parseOneDecoded).
func FuzzParseOneAsDecoded(f *testing.F) {
	for _, s := range parseBodySeeds {
		f.Add([]byte(s))
	}
	for _, s := range []string{
		`{"id":1,"method":"tools/call","params":{"name":"count","arguments":{"s":"}]\"{["}}}`,
		` {"id" : "a\"b" , "method" : "m" } `, `{"id":null,"method":"m"}`, `{"method":null,"result":1}`,
		`{"\u0069d":1,"method":"m"}`, `{"id":1,"method":"\u0069nitialize","params":{"protocolVersion":"2025-06-18"}}`,
		`{"id":1,"method":"initialize","params":{"ProtocolVersion":"x"}}`, `{"id":[1,{"a":"]"}],"method":"m"}`,
		`{"id":1,"method":"m","id":null}`, `{"id":1,"method":5}`, `{"error":{},"id":-1.5e3}`, `{}`, `[]`, `null`, `"x"`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		got, gerr := parseOne(raw)
		want, werr := parseOneDecoded(raw)
		if (gerr == nil) != (werr == nil) || got.Kind != want.Kind || got.Method != want.Method ||
			!bytes.Equal(got.ID, want.ID) || (got.ID == nil) != (want.ID == nil) || got.ProtocolVersion != want.ProtocolVersion {
			t.Fatalf("%q: read as %+v (%v), decoded as %+v (%v)", raw, got, gerr, want, werr)
		}
	})
}
