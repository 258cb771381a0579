package jsonrpc

// Review 34: the member scan (members.go) against what the official Go
// SDK server reads from the same bytes (jsonrpc.DecodeMessage: segmentio,
// case-sensitive, depth 1000), for bodies a client could send on purpose.

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	sdk "github.com/modelcontextprotocol/go-sdk/jsonrpc"
)

// The proxy reads these differently from the SDK, as the whole-object
// decode did before the scan: it sees a request the SDK rejects (its 400
// reaches the client: the proxy taps only a 200 SSE answer), or refuses a
// null method the SDK would answer with an error. Any other difference
// fails the test.
var knownSDKDifferences = map[string]bool{
	`{"jsonrpc":"2.0","id":1,"method":null}`:               true,
	`{"jsonrpc":"2.0","id":{"x":1},"method":"tools/call"}`: true,
	`{"jsonrpc":"2.0","id":[1],"method":"tools/call"}`:     true,
	`{"jsonrpc":"2.0","id":true,"method":"tools/call"}`:    true,
	`{"jsonrpc":"1.0","id":1,"method":"tools/call"}`:       true,
	`{"id":1,"method":"tools/call"}`:                       true,
}

func TestReview34MemberScanAgainstTheSDK(t *testing.T) {
	deep := strings.Repeat(`{"a":`, 1500) + "1" + strings.Repeat("}", 1500)
	bodies := []string{
		`{"jsonrpc":"2.0","id":1,"method":"tools/call","id":2}`,
		`{"jsonrpc":"2.0","id":1,"method":"tools/call","method":"initialize","params":{"protocolVersion":"2025-06-18"}}`,
		`{"jsonrpc":"2.0","\u0069d":7,"method":"tools/call"}`,
		`{"jsonrpc":"2.0","id":7,"me\u0074hod":"tools/call"}`,
		`{"jsonrpc":"2.0","id":"a\u0000b","method":"tools/call"}`,
		"{\"jsonrpc\":\"2.0\",\"id\":\"\xff\xfe\",\"method\":\"tools/call\"}",
		"{\"jsonrpc\":\"2.0\",\"id\":3,\"method\":\"tools/\xffcall\"}",
		"{\"jsonrpc\":\"2.0\",\"id\xff\":3,\"method\":\"tools/call\"}",
		`{"jsonrpc":"2.0","id":1e2,"method":"tools/call"}`,
		`{"jsonrpc":"2.0","id":-0,"method":"tools/call"}`,
		`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":` + deep + `}`,
		`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"s":"` + strings.Repeat("p", 1<<20) + `"}}`,
		`{"jsonrpc":"2.0","id":1,"method":null}`,
		`{"jsonrpc":"2.0","id":null,"method":"tools/call"}`,
		`{"jsonrpc":"2.0","id":{"x":1},"method":"tools/call"}`,
		`{"jsonrpc":"2.0","id":[1],"method":"tools/call"}`,
		`{"jsonrpc":"2.0","id":true,"method":"tools/call"}`,
		`{"jsonrpc":"2.0","id":1,"method":"tools/call","result":1}`,
		`{"jsonrpc":"2.0","id":1,"result":1,"method":"x"}`,
		`{"jsonrpc":"2.0","id":1,"error":null}`,
		`{"jsonrpc":"1.0","id":1,"method":"tools/call"}`,
		`{"id":1,"method":"tools/call"}`,
		` {"jsonrpc":"2.0" , "id" : 1 , "method" : "tools/call" } `,
	}
	diffs := 0
	for _, b := range bodies {
		calls, _, err := ParseBody([]byte(b))
		msg, serr := sdk.DecodeMessage([]byte(b))
		show := b
		if len(show) > 120 {
			show = show[:120] + "…"
		}
		proxy := "refused"
		if err == nil {
			proxy = fmt.Sprintf("%v %q id %s", calls[0].Kind, calls[0].Method, calls[0].ID)
		}
		up := "rejected: " + fmt.Sprint(serr)
		var upKind Kind
		var upMethod, upID string
		switch m := msg.(type) {
		case *sdk.Request:
			upKind, upMethod = Notification, m.Method
			if m.ID.IsValid() {
				upKind = Request
				idb, _ := json.Marshal(m.ID.Raw())
				upID = string(idb)
			}
			up = fmt.Sprintf("%v %q id %s", upKind, upMethod, upID)
		case *sdk.Response:
			upKind = Response
			up = "response"
		}
		// A difference that matters: the proxy sees a request (and waits for
		// its answer) where the SDK sees none, or the other way round, or
		// another method.
		mismatch := false
		switch {
		case err == nil && serr == nil:
			mismatch = calls[0].Kind != upKind || calls[0].Method != upMethod
		case err == nil && serr != nil:
			mismatch = calls[0].Kind == Request // a request stream for a message the upstream rejects
		case err != nil && serr == nil:
			mismatch = upKind == Request
		}
		if mismatch {
			diffs++
			if !knownSDKDifferences[b] && b != bodies[10] { // bodies[10]: nesting past the SDK's depth of 1000
				t.Errorf("read unlike the SDK: %s\n\tproxy: %s\n\tsdk:   %s", show, proxy, up)
			}
		}
		t.Logf("%v  %s\n\tproxy: %s\n\tsdk:   %s", map[bool]string{true: "DIFF", false: "same"}[mismatch], show, proxy, up)
	}
	t.Logf("%d differences of %d", diffs, len(bodies))
	if diffs != len(knownSDKDifferences)+1 {
		t.Errorf("%d differences, %d known: update knownSDKDifferences if the reading changed on purpose", diffs, len(knownSDKDifferences)+1)
	}
}
