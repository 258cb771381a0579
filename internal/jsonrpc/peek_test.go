package jsonrpc

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
)

func TestPeek(t *testing.T) {
	tests := []struct {
		name   string
		in     string
		kind   Kind
		id     string // raw; "" means nil
		method string // raw; "" means nil
	}{
		{"request", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"x"}}`, Request, `1`, `"tools/call"`},
		{"request, method first", `{"method":"ping","id":"a","jsonrpc":"2.0"}`, Request, `"a"`, `"ping"`},
		{"notification", `{"jsonrpc":"2.0","method":"notifications/progress","params":{"progress":1}}`, Notification, "", `"notifications/progress"`},
		{"notification with null id", `{"jsonrpc":"2.0","id":null,"method":"x"}`, Notification, "", `"x"`},
		{"response with result", `{"jsonrpc":"2.0","id":7,"result":{"content":[]}}`, Response, `7`, ""},
		{"response with null result", `{"jsonrpc":"2.0","id":7,"result":null}`, Response, `7`, ""},
		{"error response", `{"jsonrpc":"2.0","id":"r1","error":{"code":-32601,"message":"nope"}}`, Response, `"r1"`, ""},
		{"error response with null id", `{"jsonrpc":"2.0","id":null,"error":{"code":-32700,"message":"parse error"}}`, Response, "", ""},
		{"error response without id", `{"jsonrpc":"2.0","error":{"code":-32700,"message":"parse error"}}`, Response, "", ""},
		{"result without id is not a response", `{"jsonrpc":"2.0","result":{}}`, Invalid, "", ""},
		{"result with null id is not a response", `{"jsonrpc":"2.0","id":null,"result":{}}`, Invalid, "", ""},
		{"nested result keys do not count", `{"jsonrpc":"2.0","params":{"result":1,"error":2,"id":3,"method":"m"}}`, Invalid, "", ""},
		{"nested result inside a request", `{"jsonrpc":"2.0","method":"x","params":{"result":{"id":9}}}`, Notification, "", `"x"`},
		{"nested in arrays", `{"jsonrpc":"2.0","id":2,"result":[{"method":"m","id":1},[{"error":1}]]}`, Response, `2`, ""},
		{"keys inside strings do not count", `{"jsonrpc":"2.0","params":"\"result\":1,\"id\":2","method":"m"}`, Notification, "", `"m"`},
		{"escaped quotes in strings", `{"method":"a\"b","id":"x\"}\\\"","params":{"k\"ey":"v\\"}}`, Request, `"x\"}\\\""`, `"a\"b"`},
		{"escaped backslash before quote", `{"id":"\\","method":"m"}`, Request, `"\\"`, `"m"`},
		{"unicode escapes", `{"id":"\u00e9\"","method":"\u0070ing"}`, Request, `"\u00e9\""`, `"\u0070ing"`},
		{"id negative float", `{"id":-1.5e3,"method":"m"}`, Request, `-1.5e3`, `"m"`},
		{"id zero", `{"id":0,"method":"m"}`, Request, `0`, `"m"`},
		{"id string", `{"id":"abc","result":1}`, Response, `"abc"`, ""},
		{"id empty string", `{"id":"","result":1}`, Response, `""`, ""},
		{"id object", `{"id":{"a":[1,{"b":null}]},"method":"m"}`, Request, `{"a":[1,{"b":null}]}`, `"m"`},
		{"id array", `{"id":[1,"2"],"method":"m"}`, Request, `[1,"2"]`, `"m"`},
		{"id true", `{"id":true,"method":"m"}`, Request, `true`, `"m"`},
		{"id false", `{"id":false,"result":{}}`, Response, `false`, ""},
		{"method not a string", `{"id":1,"method":5}`, Invalid, `1`, ""},
		{"method null", `{"method":null,"id":1,"result":2}`, Response, `1`, ""},
		{"whitespace everywhere", " \t\r\n{ \"id\" :\n 3 ,\r\n\t\"method\" : \"m\" } \n", Request, `3`, `"m"`},
		{"empty object", `{}`, Invalid, "", ""},
		{"empty", ``, Invalid, "", ""},
		{"array", `[{"id":1,"method":"m"}]`, Invalid, "", ""},
		{"string", `"id"`, Invalid, "", ""},
		{"null", `null`, Invalid, "", ""},
		{"unterminated", `{"id":1,"method":"m"`, Invalid, "", ""},
		{"unterminated string", `{"id":"1,"method":"m"}`, Invalid, "", ""},
		{"missing colon", `{"id" 1,"method":"m"}`, Invalid, "", ""},
		{"missing comma", `{"id":1 "method":"m"}`, Invalid, "", ""},
		{"bare key", `{id:1,"method":"m"}`, Invalid, "", ""},
		{"missing value", `{"id":,"method":"m"}`, Invalid, "", ""},
		{"trailing backslash", `{"id":"\`, Invalid, "", ""},
		{"unclosed nested", `{"id":1,"params":{"a":[1,2}}`, Invalid, "", ""},
		// Duplicate keys: the last one wins, as in encoding/json and JSON.parse.
		{"duplicate id, last null", `{"id":1,"id":null,"method":"m"}`, Notification, "", `"m"`},
		{"duplicate id, last wins", `{"id":1,"id":2,"method":"m"}`, Request, `2`, `"m"`},
		{"duplicate method, last not a string", `{"id":1,"method":"m","method":5}`, Invalid, `1`, ""},
		// Escaped key names mean the same member.
		{"escaped id key", `{"\u0069d":1,"method":"m"}`, Request, `1`, `"m"`},
		{"escaped method key", `{"id":1,"\u006dethod":"m"}`, Request, `1`, `"m"`},
		{"escaped result key", `{"id":1,"r\u0065sult":{}}`, Response, `1`, ""},
		{"escaped other key", `{"id":1,"\u0072":{},"method":"m"}`, Request, `1`, `"m"`},
		{"keys are case sensitive", `{"ID":1,"Method":"m","Result":1}`, Invalid, "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := Peek([]byte(tt.in))
			if m.Kind != tt.kind {
				t.Errorf("Peek(%s).Kind = %v, want %v", tt.in, m.Kind, tt.kind)
			}
			if tt.kind == Invalid {
				return
			}
			if (tt.id == "") != (m.ID == nil) || string(m.ID) != tt.id {
				t.Errorf("Peek(%s).ID = %q, want %q", tt.in, m.ID, tt.id)
			}
			if string(m.Method) != tt.method {
				t.Errorf("Peek(%s).Method = %q, want %q", tt.in, m.Method, tt.method)
			}
		})
	}
}

func TestPeekDeepNesting(t *testing.T) {
	deep := `{"id":1,"result":` + strings.Repeat("[", 100000) + strings.Repeat("]", 100000) + `}`
	if m := Peek([]byte(deep)); m.Kind != Invalid {
		t.Errorf("100000 levels: got %v, want Invalid (depth bound)", m.Kind)
	}
	ok := `{"id":1,"result":` + strings.Repeat("[", 5000) + strings.Repeat("]", 5000) + `}`
	if m := Peek([]byte(ok)); m.Kind != Response {
		t.Errorf("5000 levels: got %v, want Response", m.Kind)
	}
}

func peekAll(s string) []Message {
	var out []Message
	PeekAll([]byte(s), func(m Message) { out = append(out, m) })
	return out
}

func TestPeekAll(t *testing.T) {
	tests := []struct {
		name  string
		in    string
		kinds []Kind
	}{
		{"single message", `{"id":1,"method":"m"}`, []Kind{Request}},
		{"single invalid", `nope`, []Kind{Invalid}},
		{"batch", ` [ {"id":1,"method":"a"}, {"method":"n"} ,{"id":1,"result":{"method":"x"}},{"id":null,"error":{}} ] `,
			[]Kind{Request, Notification, Response, Response}},
		{"batch with invalid element", `[{"id":1,"method":"a"},5,"s",[{"method":"m"}]]`, []Kind{Request, Invalid, Invalid, Invalid}},
		{"empty batch", `[]`, nil},
		{"whitespace empty batch", " [ \n ] ", nil},
		{"truncated batch stops", `[{"id":1,"method":"a"},{"id":2`, []Kind{Request}},
		{"batch missing comma stops", `[{"id":1,"method":"a"} {"id":2,"method":"b"}]`, []Kind{Request}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := peekAll(tt.in)
			if len(got) != len(tt.kinds) {
				t.Fatalf("PeekAll(%s) gave %d messages, want %d", tt.in, len(got), len(tt.kinds))
			}
			for i, m := range got {
				if m.Kind != tt.kinds[i] {
					t.Errorf("PeekAll(%s)[%d] = %v, want %v", tt.in, i, m.Kind, tt.kinds[i])
				}
			}
		})
	}
	got := peekAll(`[{"id":"q","method":"tools/call"}]`)
	if len(got) != 1 || string(got[0].ID) != `"q"` || string(got[0].Method) != `"tools/call"` {
		t.Errorf("batch element: %+v", got)
	}
}

// reference classifies with encoding/json: last duplicate wins, key escapes
// decoded, exact (case-sensitive) member names.
func reference(m map[string]json.RawMessage) (kind Kind, id, method []byte) {
	if raw, ok := m["id"]; ok {
		if r := bytes.TrimSpace(raw); !bytes.Equal(r, []byte("null")) {
			id = r
		}
	}
	if raw, ok := m["method"]; ok {
		if r := bytes.TrimSpace(raw); len(r) > 0 && r[0] == '"' {
			method = r
		}
	}
	_, hasResult := m["result"]
	_, hasError := m["error"]
	switch {
	case method != nil && id != nil:
		kind = Request
	case method != nil:
		kind = Notification
	case (hasResult || hasError) && (id != nil || hasError):
		kind = Response
	}
	return kind, id, method
}

func checkAgainstReference(t *testing.T, data []byte) {
	var obj map[string]json.RawMessage
	if json.Unmarshal(data, &obj) == nil && obj != nil {
		kind, id, method := reference(obj)
		m := Peek(data)
		if m.Kind != kind || !bytes.Equal(m.ID, id) || !bytes.Equal(m.Method, method) {
			t.Fatalf("Peek(%q) = {%v %q %q}, encoding/json says {%v %q %q}", data, m.Kind, m.ID, m.Method, kind, id, method)
		}
	}
	var batch []json.RawMessage
	if json.Unmarshal(data, &batch) == nil && batch != nil {
		got := peekAll(string(data))
		if len(got) != len(batch) {
			t.Fatalf("PeekAll(%q) gave %d messages, encoding/json %d", data, len(got), len(batch))
		}
		for i, raw := range batch {
			var obj map[string]json.RawMessage
			want := Invalid
			var id, method []byte
			if json.Unmarshal(raw, &obj) == nil && obj != nil {
				want, id, method = reference(obj)
			}
			if got[i].Kind != want || !bytes.Equal(got[i].ID, id) || !bytes.Equal(got[i].Method, method) {
				t.Fatalf("PeekAll(%q)[%d] = %+v, encoding/json says {%v %q %q}", data, i, got[i], want, id, method)
			}
		}
	}
}

func TestPeekAgreesWithEncodingJSON(t *testing.T) {
	for _, s := range peekSeeds {
		checkAgainstReference(t, []byte(s))
	}
}

var peekSeeds = []string{
	`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"x","arguments":{"result":1}}}`,
	`{"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":"t","progress":1}}`,
	`{"jsonrpc":"2.0","id":"a","result":{"content":[{"type":"text","text":"\"id\":1"}]}}`,
	`{"jsonrpc":"2.0","id":null,"error":{"code":-32700,"message":"x"}}`,
	`[{"id":1,"method":"a"},{"method":"b"},{"id":2,"result":null},{"error":{}}]`,
	`{"id":1,"id":null,"method":"m"}`,
	`{"\u0069d":1,"method":"m"}`,
	`{"id":[1,{"a":"}"}],"method":"m"}`,
	`{"ID":1,"method":"m"}`,
}

// FuzzPeek: wherever encoding/json accepts the input as an object (or a
// batch of them), Peek and PeekAll agree with a classification computed from
// encoding/json's decoding. Elsewhere they must merely not panic.
func FuzzPeek(f *testing.F) {
	for _, s := range peekSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		checkAgainstReference(t, data)
		_ = Peek(data)
		PeekAll(data, func(Message) {})
		_, _, _ = ParseBody(data)
	})
}

func TestPeekResponse(t *testing.T) {
	for _, tc := range []struct {
		data string
		id   string
		ok   bool
	}{
		{`{"jsonrpc":"2.0","id":1,"result":{}}`, "1", true},
		{`{"jsonrpc":"2.0","id":"a","error":{"code":1,"message":"x"}}`, `"a"`, true},
		{`{"jsonrpc":"2.0","\u0069d":7,"\u0072esult":{}}`, "7", true},
		{`{"jsonrpc":"2.0","method":"notifications/progress","params":{"result":1}}`, "", false},
		{`{"jsonrpc":"2.0","id":3,"method":"sampling/createMessage","params":{}}`, "", false},
		{`{"jsonrpc":"2.0","method":"x"` + strings.Repeat(" ", 10) + `,"params":` /* truncated: stops before */, "", false},
		{`[{"jsonrpc":"2.0","id":1,"result":{}}]`, "", false}, // batches go through PeekAll
	} {
		id, ok := PeekResponse([]byte(tc.data))
		if ok != tc.ok || string(id) != tc.id {
			t.Errorf("%s: (%q, %v), want (%q, %v)", tc.data, id, ok, tc.id, tc.ok)
		}
	}
}

// FuzzPeekResponse checks PeekResponse never reports a response that the
// full Peek does not, with the same id.
func FuzzPeekResponse(f *testing.F) {
	f.Add([]byte(`{"jsonrpc":"2.0","id":1,"result":{}}`))
	f.Add([]byte(`{"method":"x","method":null,"result":1,"id":1}`))
	f.Add([]byte(`{"id":1,"result":{},"id":2}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		id, ok := PeekResponse(data)
		if !ok {
			return
		}
		m := Peek(data)
		if m.Kind != Response || string(m.ID) != string(id) {
			t.Fatalf("PeekResponse says response %q, Peek says %v %q", id, m.Kind, m.ID)
		}
	})
}

// FuzzPeekResponseShortcut checks PeekResponse's shortcut for the common
// notification prefixes: on every input it answers exactly what the full
// scan (stopping at a method member) answers.
func FuzzPeekResponseShortcut(f *testing.F) {
	for _, s := range peekSeeds {
		f.Add([]byte(s))
	}
	f.Add([]byte(`{"jsonrpc":"2.0","method":"notifications/progress","params":{"progress":1}}`))
	f.Add([]byte(`{"jsonrpc":"2.0","method":"x`))
	f.Add([]byte(`{"jsonrpc":"2.0","method":"a\"","id":1,"result":{}}`))
	f.Add([]byte(`{"method":"x","id":1,"result":{}}`))
	f.Add([]byte(`{"jsonrpc":"2.0","id":1,"result":{}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		id, ok := PeekResponse(data)
		m := peek(data, true)
		if ok != (m.Kind == Response) || !bytes.Equal(id, m.ID) || id == nil != (m.ID == nil) {
			t.Fatalf("%q: PeekResponse (%q, %v), the scan (%q, %v)", data, id, ok, m.ID, m.Kind)
		}
	})
}
