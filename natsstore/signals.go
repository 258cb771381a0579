package natsstore

import (
	"encoding/json"

	"github.com/mcpresume/caddy-mcp-resume/buffer"
	"github.com/mcpresume/caddy-mcp-resume/internal/jsonrpc"
	"github.com/mcpresume/caddy-mcp-resume/internal/sse"
	"github.com/mcpresume/caddy-mcp-resume/policy"
)

// defaultFailureSignals are what a stream whose producer died gets when
// the embedding layer set no FailureSignals: the bytes the Caddy glue
// builds (resume/signals.go) for a failure with unknown loss: a gap
// event, then a JSON-RPC error for each request still waiting (or, with
// none waiting, a notifications/message warning).
func defaultFailureSignals(reason policy.Reason, lastEventID string, pending []string) []buffer.Signal {
	gap, _ := json.Marshal(struct {
		LastEventID string        `json:"lastEventId"`
		Lost        int64         `json:"lost"`
		Reason      policy.Reason `json:"reason"`
	}{lastEventID, -1, reason})
	sigs := []buffer.Signal{{Fields: sse.AppendData([]byte("event: gap\n"), gap)}}
	if len(pending) == 0 {
		return append(sigs, buffer.Signal{Fields: sse.AppendData(nil, jsonrpc.LogNotification("warning", "mcp_resume",
			map[string]any{
				"message":     "mcp-resume: events of this stream were lost (" + string(reason) + ")",
				"reason":      reason,
				"lastEventId": lastEventID,
				"lost":        -1,
			}))})
	}
	for _, id := range pending {
		sigs = append(sigs, buffer.Signal{Answers: []string{id}, Fields: sse.AppendData(nil,
			jsonrpc.ErrorResponse(json.RawMessage(id), jsonrpc.CodeEventsLost,
				"mcp-resume: the response to this request was lost ("+string(reason)+")",
				map[string]any{"reason": reason, "lastEventId": lastEventID, "lost": -1}))})
	}
	return sigs
}
