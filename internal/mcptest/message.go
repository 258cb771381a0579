package mcptest

import "encoding/json"

// Message is a JSON-RPC message as a client checks it: a request or
// notification (Method), or a response (ID with Result or Error).
type Message struct {
	ID     json.RawMessage `json:"id"`
	Method string          `json:"method"`
	Params struct {
		ProgressToken any     `json:"progressToken"`
		Progress      float64 `json:"progress"`
	} `json:"params"`
	Result json.RawMessage `json:"result"`
	Error  *struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

// DecodeMessage decodes one JSON-RPC message, as an event's data carries it.
func DecodeMessage(data string) (Message, error) {
	var m Message
	err := json.Unmarshal([]byte(data), &m)
	return m, err
}

// Gap is the data of the proxy's gap event: what a resume could not replay.
type Gap struct {
	LastEventID string `json:"lastEventId"`
	ResumeFrom  string `json:"resumeFrom"`
	Lost        int    `json:"lost"`
	Reason      string `json:"reason"`
}
