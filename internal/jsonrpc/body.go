package jsonrpc

import (
	"bytes"
	"encoding/json"
	"errors"
	"strconv"
)

// Call is one message of a client's POST body, as far as the proxy cares.
type Call struct {
	Kind            Kind
	Method          string
	ID              json.RawMessage // nil for notifications and for null ids
	ProtocolVersion string          // params.protocolVersion of an initialize request
}

// ErrBody is returned for bodies that are not JSON-RPC at all.
var ErrBody = errors.New("body is not a JSON-RPC message or batch")

// ParseBody decodes a POST body: one message, or a batch (MCP 2025-03-26).
func ParseBody(body []byte) (calls []Call, batch bool, err error) {
	body = bytes.TrimSpace(body)
	if len(body) > 0 && body[0] == '[' {
		var raws []json.RawMessage
		if err := json.Unmarshal(body, &raws); err != nil || len(raws) == 0 {
			return nil, true, ErrBody
		}
		for _, r := range raws {
			c, err := parseOne(r)
			if err != nil {
				return nil, true, err
			}
			calls = append(calls, c)
		}
		return calls, true, nil
	}
	c, err := parseOne(body)
	if err != nil {
		return nil, false, err
	}
	return []Call{c}, false, nil
}

// parseOne reads one message: the members it needs straight from the bytes
// (members.go), or by decoding the whole object where those bytes need
// decoding (escapes in a member name or the method, invalid UTF-8 in it).
// Both read a body alike: FuzzParseOneAsDecoded.
func parseOne(raw []byte) (Call, error) {
	if !json.Valid(raw) {
		return Call{}, ErrBody
	}
	m, ok := topMembers(raw)
	if !ok {
		return parseOneDecoded(raw)
	}
	c, err := m.call(func(method []byte) (string, error) {
		if name, ok := plainString(method); ok {
			return name, nil
		}
		return "", errDecode
	})
	if err == errDecode {
		return parseOneDecoded(raw) // escapes or invalid UTF-8: encoding/json's reading
	}
	return c, err
}

// errDecode: a member's bytes need encoding/json to read them.
var errDecode = errors.New("jsonrpc: decode the whole object")

// parseOneDecoded is parseOne by decoding the whole object.
func parseOneDecoded(raw []byte) (Call, error) {
	// Member names are case-sensitive, as in the upstream SDKs.
	var mm map[string]json.RawMessage
	if err := json.Unmarshal(raw, &mm); err != nil || mm == nil {
		return Call{}, ErrBody
	}
	m := members{id: mm["id"], method: mm["method"], params: mm["params"]}
	_, m.result = mm["result"]
	_, m.error = mm["error"]
	return m.call(func(method []byte) (name string, err error) {
		err = json.Unmarshal(method, &name)
		return name, err
	})
}

// call is the message these members make, the method read by method.
func (m members) call(method func([]byte) (string, error)) (Call, error) {
	var c Call
	if m.id != nil && !bytes.Equal(m.id, []byte("null")) {
		c.ID = bytes.Clone(m.id)
	}
	switch {
	case m.method != nil && !bytes.Equal(m.method, []byte("null")):
		if m.method[0] != '"' {
			return Call{}, ErrBody // not a string
		}
		name, err := method(m.method)
		if err == errDecode {
			return Call{}, err
		}
		if err != nil {
			return Call{}, ErrBody
		}
		c.Method = name
		c.Kind = Notification
		if c.ID != nil {
			c.Kind = Request
		}
	case m.result || m.error:
		c.Kind = Response
	default:
		return Call{}, ErrBody
	}
	if m.params != nil && c.Method == "initialize" {
		c.ProtocolVersion = protocolVersionParam(m.params)
	}
	return c, nil
}

// protocolVersionParam is params.protocolVersion of an initialize request.
func protocolVersionParam(params []byte) string { return stringMember(params, "protocolVersion") }

// ProtocolVersionOf returns result.protocolVersion of an initialize response.
func ProtocolVersionOf(response []byte) string {
	return stringMember(member(response, "result"), "protocolVersion")
}

// member is obj's member name as the SDKs read it: the name matched
// exactly, the last of duplicates winning. (encoding/json's struct
// decoding matches names case-insensitively and keeps the last match: a
// "ProtocolVersion" after "protocolVersion" once made the proxy see
// another version than the upstream did, review 50.)
func member(obj []byte, name string) json.RawMessage {
	var mm map[string]json.RawMessage
	if json.Unmarshal(obj, &mm) != nil {
		return nil
	}
	return mm[name]
}

// stringMember is obj's member name if it is a string, else "".
func stringMember(obj []byte, name string) string {
	var v string
	if json.Unmarshal(member(obj, name), &v) != nil {
		return ""
	}
	return v
}

// Error codes the proxy uses, inside JSON-RPC's implementation-defined server
// error range (-32000 to -32099; MCP leaves -32000..-32019 to implementations).
const (
	CodeEventsLost   = -32010 // a stream's events were lost; see the message for why
	CodeResumeDenied = -32011 // a resume was refused (bad or foreign Last-Event-ID, credentials)
	CodeLimit        = -32012 // a proxy limit was reached
	CodeInvalid      = -32600 // JSON-RPC "Invalid Request"
)

// ErrorResponse encodes a JSON-RPC error response. A nil id encodes as null,
// which JSON-RPC uses when the request's id is unknown.
func ErrorResponse(id json.RawMessage, code int, message string, data any) []byte {
	b := make([]byte, 0, 128)
	b = append(b, `{"jsonrpc":"2.0","id":`...)
	if id == nil {
		b = append(b, "null"...)
	} else {
		b = append(b, id...)
	}
	b = append(b, `,"error":{"code":`...)
	b = strconv.AppendInt(b, int64(code), 10)
	b = append(b, `,"message":`...)
	msg, _ := json.Marshal(message)
	b = append(b, msg...)
	if data != nil {
		if d, err := json.Marshal(data); err == nil {
			b = append(b, `,"data":`...)
			b = append(b, d...)
		}
	}
	return append(b, "}}"...)
}

// LogNotification encodes a notifications/message (MCP logging) notification,
// which standard clients surface to the application.
func LogNotification(level, logger string, data any) []byte {
	b, _ := json.Marshal(map[string]any{
		"jsonrpc": "2.0",
		"method":  "notifications/message",
		"params":  map[string]any{"level": level, "logger": logger, "data": data},
	})
	return b
}

// CanonicalID returns the canonical text of a JSON-RPC id: a string with its
// escapes resolved and re-encoded as encoding/json writes it, any other value
// compacted. The proxy matches responses to requests in this form, so an
// upstream that re-encodes "\u0041" as "A" still answers request "\u0041",
// and writes ids in this form, so no raw control byte of a client's id ever
// reaches an SSE line. Invalid JSON is returned as is (it matches nothing).
func CanonicalID(raw []byte) string {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 {
		return ""
	}
	if raw[0] != '"' {
		if simpleToken(raw) {
			return string(raw) // a number: nothing to canonicalise
		}
		var b bytes.Buffer
		if json.Compact(&b, raw) != nil {
			return string(raw)
		}
		return b.String()
	}
	if simpleString(raw) {
		return string(raw)
	}
	var s string
	if json.Unmarshal(raw, &s) != nil {
		return string(raw)
	}
	out, _ := json.Marshal(s)
	return string(out)
}

// simpleToken reports whether raw is a bare token (a number, true, false)
// without whitespace, which is already canonical.
func simpleToken(raw []byte) bool {
	for _, c := range raw {
		if c <= ' ' || c == '{' || c == '[' || c == '"' {
			return false
		}
	}
	return true
}

// simpleString reports whether raw is a JSON string of printable ASCII
// without escapes or characters encoding/json would escape: its own
// canonical form.
func simpleString(raw []byte) bool {
	if len(raw) < 2 || raw[len(raw)-1] != '"' {
		return false
	}
	for _, c := range raw[1 : len(raw)-1] {
		if c < 0x20 || c >= 0x7f || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			return false
		}
	}
	return true
}
