package jsonrpc

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
)

func TestParseBody(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		batch   bool
		want    []Call
		wantErr error
	}{
		{"request", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"x"}}`, false,
			[]Call{{Kind: Request, Method: "tools/call", ID: json.RawMessage(`1`)}}, nil},
		{"string id", ` {"jsonrpc":"2.0","id":"abc","method":"ping"} `, false,
			[]Call{{Kind: Request, Method: "ping", ID: json.RawMessage(`"abc"`)}}, nil},
		{"notification", `{"jsonrpc":"2.0","method":"notifications/initialized"}`, false,
			[]Call{{Kind: Notification, Method: "notifications/initialized"}}, nil},
		{"notification with null id", `{"jsonrpc":"2.0","id":null,"method":"notifications/cancelled","params":{"requestId":1}}`, false,
			[]Call{{Kind: Notification, Method: "notifications/cancelled"}}, nil},
		{"response", `{"jsonrpc":"2.0","id":5,"result":{}}`, false,
			[]Call{{Kind: Response, ID: json.RawMessage(`5`)}}, nil},
		{"error response", `{"jsonrpc":"2.0","id":5,"error":{"code":1,"message":"m"}}`, false,
			[]Call{{Kind: Response, ID: json.RawMessage(`5`)}}, nil},
		{"initialize", `{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"c","version":"1"}}}`, false,
			[]Call{{Kind: Request, Method: "initialize", ID: json.RawMessage(`0`), ProtocolVersion: "2025-06-18"}}, nil},
		{"initialize without params", `{"jsonrpc":"2.0","id":0,"method":"initialize"}`, false,
			[]Call{{Kind: Request, Method: "initialize", ID: json.RawMessage(`0`)}}, nil},
		// The name matched exactly, the last duplicate winning, as the
		// SDKs read it (review 50: a case variant after the real one made
		// the proxy see "1.0" where the upstream saw 2025-11-25).
		{"initialize with a case variant", `{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25","ProtocolVersion":"1.0"}}`, false,
			[]Call{{Kind: Request, Method: "initialize", ID: json.RawMessage(`0`), ProtocolVersion: "2025-11-25"}}, nil},
		{"initialize with duplicates", `{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"1.0","\u0070rotocolVersion":"2025-06-18"}}`, false,
			[]Call{{Kind: Request, Method: "initialize", ID: json.RawMessage(`0`), ProtocolVersion: "2025-06-18"}}, nil},
		{"protocolVersion only read for initialize", `{"jsonrpc":"2.0","id":0,"method":"x","params":{"protocolVersion":"2025-06-18"}}`, false,
			[]Call{{Kind: Request, Method: "x", ID: json.RawMessage(`0`)}}, nil},
		{"batch", `[{"jsonrpc":"2.0","id":1,"method":"a"},{"jsonrpc":"2.0","method":"b"},{"jsonrpc":"2.0","id":"z","result":1}]`, true,
			[]Call{{Kind: Request, Method: "a", ID: json.RawMessage(`1`)}, {Kind: Notification, Method: "b"}, {Kind: Response, ID: json.RawMessage(`"z"`)}}, nil},
		{"batch of one", "\n[{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"a\"}]\n", true,
			[]Call{{Kind: Request, Method: "a", ID: json.RawMessage(`1`)}}, nil},
		{"empty batch", `[]`, true, nil, ErrBody},
		{"batch with a non-message", `[{"jsonrpc":"2.0","id":1,"method":"a"},{"x":1}]`, true, nil, ErrBody},
		{"batch with a scalar", `[{"jsonrpc":"2.0","id":1,"method":"a"},1]`, true, nil, ErrBody},
		{"broken batch", `[{"id":1,"method":"a"}`, true, nil, ErrBody},
		{"empty body", ``, false, nil, ErrBody},
		{"not JSON", `hello`, false, nil, ErrBody},
		{"null", `null`, false, nil, ErrBody},
		{"no method, result or error", `{"jsonrpc":"2.0","id":1}`, false, nil, ErrBody},
		{"trailing garbage", `{"jsonrpc":"2.0","id":1,"method":"a"} x`, false, nil, ErrBody},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			calls, batch, err := ParseBody([]byte(tt.in))
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("err = %v, want %v", err, tt.wantErr)
			}
			if batch != tt.batch {
				t.Errorf("batch = %v, want %v", batch, tt.batch)
			}
			if len(calls) != len(tt.want) {
				t.Fatalf("calls = %+v, want %+v", calls, tt.want)
			}
			for i := range calls {
				g, w := calls[i], tt.want[i]
				if g.Kind != w.Kind || g.Method != w.Method || string(g.ID) != string(w.ID) || (g.ID == nil) != (w.ID == nil) || g.ProtocolVersion != w.ProtocolVersion {
					t.Errorf("call %d = %+v (id %s), want %+v (id %s)", i, g, g.ID, w, w.ID)
				}
			}
		})
	}
}

func TestProtocolVersionOf(t *testing.T) {
	for in, want := range map[string]string{
		`{"jsonrpc":"2.0","id":0,"result":{"protocolVersion":"2025-11-25","capabilities":{}}}`: "2025-11-25",
		`{"jsonrpc":"2.0","id":0,"error":{"code":1,"message":"x"}}`:                            "",
		`not json`:                         "",
		`{"result":{"protocolVersion":5}}`: "",
		`{"result":{"protocolVersion":"2025-06-18","PROTOCOLVERSION":"1.0"}}`: "2025-06-18",
	} {
		if got := ProtocolVersionOf([]byte(in)); got != want {
			t.Errorf("ProtocolVersionOf(%s) = %q, want %q", in, got, want)
		}
	}
}

func TestErrorResponse(t *testing.T) {
	type errObj struct {
		Code    int             `json:"code"`
		Message string          `json:"message"`
		Data    json.RawMessage `json:"data"`
	}
	type resp struct {
		JSONRPC string          `json:"jsonrpc"`
		ID      json.RawMessage `json:"id"`
		Error   errObj          `json:"error"`
	}
	for _, tt := range []struct {
		id   json.RawMessage
		data any
		want string // id as encoded
		wd   string
	}{
		{nil, nil, "null", ""},
		{json.RawMessage(`7`), map[string]any{"lost": 3}, "7", `{"lost":3}`},
		{json.RawMessage(`"a\"b"`), "x", `"a\"b"`, `"x"`},
		{json.RawMessage(`7`), func() {}, "7", ""}, // unencodable data is left out
	} {
		b := ErrorResponse(tt.id, CodeEventsLost, "events were lost: \"quoted\" \n", tt.data)
		var r resp
		if err := json.Unmarshal(b, &r); err != nil {
			t.Fatalf("%s: %v", b, err)
		}
		if r.JSONRPC != "2.0" || string(r.ID) != tt.want || r.Error.Code != CodeEventsLost ||
			r.Error.Message != "events were lost: \"quoted\" \n" || string(r.Error.Data) != tt.wd {
			t.Errorf("ErrorResponse = %s", b)
		}
		if m := Peek(b); m.Kind != Response {
			t.Errorf("Peek(%s) = %v, want Response", b, m.Kind)
		}
	}
	if CodeEventsLost > -32000 || CodeEventsLost < -32019 || CodeResumeDenied > -32000 || CodeResumeDenied < -32019 || CodeLimit > -32000 || CodeLimit < -32019 {
		t.Error("proxy error codes must be in -32000..-32019")
	}
}

func TestLogNotification(t *testing.T) {
	b := LogNotification("warning", "mcp_resume", map[string]any{"lost": 2})
	var m struct {
		JSONRPC string `json:"jsonrpc"`
		Method  string `json:"method"`
		Params  struct {
			Level  string         `json:"level"`
			Logger string         `json:"logger"`
			Data   map[string]int `json:"data"`
		} `json:"params"`
	}
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	if m.JSONRPC != "2.0" || m.Method != "notifications/message" || m.Params.Level != "warning" || m.Params.Logger != "mcp_resume" || m.Params.Data["lost"] != 2 {
		t.Errorf("LogNotification = %s", b)
	}
	if p := Peek(b); p.Kind != Notification {
		t.Errorf("Peek = %v, want Notification", p.Kind)
	}
	if k := Kind(3).String(); k != "response" {
		t.Errorf("Kind(3) = %q", k)
	}
}

func TestCanonicalID(t *testing.T) {
	for raw, want := range map[string]string{
		`7`:                  `7`,
		` 7 `:                `7`,
		`"a"`:                `"a"`,
		`"\u0041"`:           `"A"`,
		`"A"`:                `"A"`,
		`"a\r\nb"`:           `"a\r\nb"`,
		`"é"`:                `"é"`,
		`"\u00e9"`:           `"é"`,
		"{\"a\":\r\n \"b\"}": `{"a":"b"}`,
		`[1, 2]`:             `[1,2]`,
		`"unterminated`:      `"unterminated`,
	} {
		if got := CanonicalID([]byte(raw)); got != want {
			t.Errorf("CanonicalID(%q) = %q, want %q", raw, got, want)
		}
		if strings.ContainsAny(CanonicalID([]byte(raw)), "\r\n") {
			t.Errorf("CanonicalID(%q) contains a line break", raw)
		}
	}
}
