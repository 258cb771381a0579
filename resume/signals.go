package resume

import (
	"encoding/json"

	"github.com/mcpresume/caddy-mcp-resume/buffer"
	"github.com/mcpresume/caddy-mcp-resume/internal/jsonrpc"
	"github.com/mcpresume/caddy-mcp-resume/internal/sse"
	"github.com/mcpresume/caddy-mcp-resume/policy"
)

// How the proxy tells a client that events are gone, in one place: the gap
// event that moves its cursor (for SSE-aware clients), then what standard
// MCP clients act on: a notifications/message warning where the stream goes
// on, a JSON-RPC error for each request whose answer is lost. A failing
// stream's log gets them (FailureSignals); a resume that meets a gap writes
// them first (relay.go's gapPreamble).

// gapInfo is the data of a gap event.
type gapInfo struct {
	LastEventID string        `json:"lastEventId"`
	ResumeFrom  string        `json:"resumeFrom,omitempty"`
	Lost        int64         `json:"lost"` // -1: unknown
	Reason      policy.Reason `json:"reason"`
}

// gapFields are the SSE fields of a gap event (no id: the log or the
// caller adds it).
func gapFields(dst []byte, g gapInfo) []byte {
	data, _ := json.Marshal(g)
	dst = append(dst, "event: gap\n"...)
	return sse.AppendData(dst, data)
}

// warningFields are the fields of the notifications/message warning that
// standard clients surface for a gap on a stream that goes on.
func warningFields(dst []byte, reason policy.Reason, lastEventID string, lost int64) []byte {
	return sse.AppendData(dst, jsonrpc.LogNotification("warning", "mcp_resume", map[string]any{
		"message":     "mcp-resume: events of this stream were lost (" + string(reason) + ")",
		"reason":      reason,
		"lastEventId": lastEventID,
		"lost":        lost,
	}))
}

// lostFields are the fields of the JSON-RPC error that answers request id
// (canonical JSON) whose response is lost, so the client's call fails now
// instead of waiting for a response that will never come.
func lostFields(dst []byte, id string, reason policy.Reason, lastEventID string, lost int64) []byte {
	return sse.AppendData(dst, jsonrpc.ErrorResponse(json.RawMessage(id), jsonrpc.CodeEventsLost,
		"mcp-resume: the response to this request was lost ("+string(reason)+")",
		map[string]any{"reason": reason, "lastEventId": lastEventID, "lost": lost}))
}

// FailureSignals are what a stream that fails gets appended: a gap event,
// then an error for each request still waiting for its answer (a request
// stream) or a warning (the standalone stream, which goes on).
func FailureSignals(reason policy.Reason, lastEventID string, pending []string) []buffer.Signal {
	sigs := []buffer.Signal{{Fields: gapFields(nil, gapInfo{LastEventID: lastEventID, Lost: -1, Reason: reason})}}
	if len(pending) == 0 {
		return append(sigs, buffer.Signal{Fields: warningFields(nil, reason, lastEventID, -1)})
	}
	for _, id := range pending {
		sigs = append(sigs, buffer.Signal{Fields: lostFields(nil, id, reason, lastEventID, -1), Answers: []string{id}})
	}
	return sigs
}
