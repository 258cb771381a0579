package security

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/mcpresume/caddy-mcp-resume/internal/eventid"
	"github.com/mcpresume/caddy-mcp-resume/internal/mcptest"
	"github.com/mcpresume/caddy-mcp-resume/tests/harness"
)

// malformed answers a tools/call with body, RESULT standing for the
// JSON-RPC result, written in small chunks so that events and line endings
// straddle writes. With cut the connection then drops without ending the
// chunked body: the upstream died mid-event.
func malformed(body string, cut bool) mcptest.Tool {
	return func(w http.ResponseWriter, r *http.Request, req *mcptest.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		rc := http.NewResponseController(w)
		result := fmt.Sprintf(`{"jsonrpc":"2.0","id":%s,"result":{"content":[{"type":"text","text":"done %s"}]}}`, req.ID, req.Params.Name)
		body := strings.ReplaceAll(body, "RESULT", result)
		for len(body) > 0 {
			k := min(len(body), 7)
			io.WriteString(w, body[:k])
			body = body[k:]
			if len(body)%5 == 0 {
				rc.Flush()
			}
		}
		rc.Flush()
		if cut {
			if conn, _, err := rc.Hijack(); err == nil {
				conn.Close()
			}
		}
	}
}

const notice = `{"jsonrpc":"2.0","method":"notifications/message","params":{"level":"info","logger":"raw","data":"%s"}}`

func noticeWith(s string) string { return fmt.Sprintf(notice, s) }

// upstreamScenarios: what the malformed upstream answers a tools/call of
// each name with. Its count tool streams well-formed progress, for a
// background session.
var upstreamScenarios = map[string]mcptest.Tool{
	"no-final-blank-line":    malformed("data: "+noticeWith("first")+"\n\ndata: RESULT", false),
	"no-final-blank-line-lf": malformed("data: "+noticeWith("first")+"\n\ndata: RESULT\n", false),
	"nul-in-data":            malformed("data: "+noticeWith("a\x00b\x00")+"\n\ndata: RESULT\n\n", false),
	"invalid-utf8":           malformed("data: "+noticeWith("\xff\xfe\xc3(\xed\xa0\x80")+"\n\ndata: RESULT\n\n", false),
	"cr-only":                malformed("event: message\rdata: "+noticeWith("cr")+"\r\rdata: RESULT\r\r", false),
	"mixed-endings":          malformed("data: {\"jsonrpc\":\"2.0\",\r\ndata: \"method\":\"notifications/message\",\rdata: \"params\":{\"level\":\"info\",\"logger\":\"raw\",\"data\":\"mixed\"}}\n\r\ndata: RESULT\r\n\r\n", false),
	"upstream-ids":           malformed("id: upstream-secret-1\nretry: 1500\nevent: message\ndata: "+noticeWith("with id")+"\n\nid: up_2\ndata: RESULT\n\n", false),
	"absurdly-long-line":     malformed("data: "+noticeWith("before")+"\n\ndata: "+strings.Repeat("A", 200<<10)+"\n\ndata: RESULT\n\n", false),
	"long-line-no-newline":   malformed("data: "+strings.Repeat("B", 200<<10), false),
	"cut-mid-event":          malformed("data: "+noticeWith("before the cut")+"\n\ndata: {\"jsonrpc\":\"2.0\",\"id\":", true),
}

// TestMalformedUpstreamSSE: an upstream that speaks malformed SSE. What the
// client gets is either the upstream's events re-framed (LF line endings,
// proxy IDs, payload bytes untouched, the upstream's own IDs hidden) or an
// explicit failure (a gap event and a JSON-RPC error for the request), never
// a silent loss; and the proxy keeps serving a background session throughout.
func TestMalformedUpstreamSSE(t *testing.T) {
	ctx := t.Context()
	upstream := harness.StartHandler(t, &mcptest.Upstream{FlushEach: true, Tools: upstreamScenarios})
	caddy := harness.StartCaddy(t, mcptest.ResumeRoute(upstream, `		max_event_bytes 64KiB
		max_stream_bytes 1MiB`))
	bg := startBackground(t, caddy.Base(), "raw-bg", "2025-03-26", 40, 25)
	c := mustInit(t, newClient(caddy.Base(), "2025-03-26", nil))
	bg.flowing(t, 1)

	// reframed checks a stream that must arrive whole: every event under a
	// contiguous proxy id, the notice's data exactly as sent, then the result.
	reframed := func(noticeData string) func(t *testing.T, x harness.Exchange, id int) {
		return func(t *testing.T, x harness.Exchange, id int) {
			t.Helper()
			if _, err := harness.CheckIDs(x.Events); err != nil {
				t.Fatal(err)
			}
			var datas []string
			for _, ev := range x.Events {
				datas = append(datas, ev.Data)
			}
			want := []string{noticeData, fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"result":{"content":[{"type":"text","text":"done %s"}]}}`, id, t.Name()[strings.LastIndex(t.Name(), "/")+1:])}
			if noticeData == "" {
				want = want[1:]
			}
			if fmt.Sprintf("%q", datas) != fmt.Sprintf("%q", want) {
				t.Fatalf("events %q,\nwant %q", datas, want)
			}
		}
	}
	// failed checks an explicit failure: a gap with the reason, then a
	// JSON-RPC error for the request.
	failed := func(reason string) func(t *testing.T, x harness.Exchange, id int) {
		return func(t *testing.T, x harness.Exchange, id int) {
			t.Helper()
			var gap, rpcErr bool
			for _, ev := range x.Events {
				switch {
				case ev.Type == "gap":
					var g mcptest.Gap
					if json.Unmarshal([]byte(ev.Data), &g); g.Reason != reason {
						t.Fatalf("gap %q, want reason %s", ev.Data, reason)
					}
					if _, err := eventid.Parse(ev.ID); err != nil {
						t.Fatalf("gap without a proxy id: %+v", ev)
					}
					gap = true
				case gap:
					m, ok := harness.Decode(ev.Data)
					if !ok || string(m.ID) != fmt.Sprint(id) || m.Error == nil {
						t.Fatalf("after the gap, want a JSON-RPC error for id %d: %q", id, ev.Data)
					}
					rpcErr = true
				default:
					if _, err := eventid.Parse(ev.ID); err != nil {
						t.Fatalf("event before the failure without a proxy id: %+v", ev)
					}
				}
			}
			if !gap || !rpcErr {
				t.Fatalf("want a gap (%s) and a JSON-RPC error for id %d, got %s", reason, id, x)
			}
		}
	}
	// answered accepts the result (the proxy dispatched the unterminated last
	// event, as the SDK clients do) or an explicit failure; not a silent end.
	answered := func(t *testing.T, x harness.Exchange, id int) {
		t.Helper()
		for _, ev := range x.Events {
			if m, ok := harness.Decode(ev.Data); ok && string(m.ID) == fmt.Sprint(id) && (m.Result != nil || m.Error != nil) {
				return
			}
		}
		t.Fatalf("the upstream's final response (in an event without its closing blank line) was dropped "+
			"and the client was not told: a client talking to the upstream directly gets it. Got %s", x)
	}

	for i, tc := range []struct {
		name  string
		want  string
		check func(t *testing.T, x harness.Exchange, id int)
	}{
		{"no-final-blank-line", "the result (the last event is complete but for its blank line) or an explicit failure", answered},
		{"no-final-blank-line-lf", "the result or an explicit failure", answered},
		{"nul-in-data", "re-framed, NUL bytes untouched", reframed(noticeWith("a\x00b\x00"))},
		{"invalid-utf8", "re-framed, bytes untouched", reframed(noticeWith("\xff\xfe\xc3(\xed\xa0\x80"))},
		{"cr-only", "re-framed with LF", reframed(noticeWith("cr"))},
		{"mixed-endings", "re-framed with LF, the data lines joined as sent", reframed("{\"jsonrpc\":\"2.0\",\n\"method\":\"notifications/message\",\n\"params\":{\"level\":\"info\",\"logger\":\"raw\",\"data\":\"mixed\"}}")},
		{"upstream-ids", "re-framed under proxy ids; the upstream's ids never shown", reframed(noticeWith("with id"))},
		{"absurdly-long-line", "the events before it, then a gap (too_large) and a JSON-RPC error", failed("too_large")},
		{"long-line-no-newline", "a gap (too_large) and a JSON-RPC error", failed("too_large")},
		{"cut-mid-event", "the events before it, then a gap (upstream_failed) and a JSON-RPC error", failed("upstream_failed")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Logf("want: %s", tc.want)
			id := 100 + i
			x := harness.Must(t)(c.Call(ctx, id, tc.name, map[string]any{}, "t"))
			tc.check(t, x, id)
			noLeak(t, "the stream", x.Body, "upstream-secret-1", "up_2", "raw-bg-call")
		})
		bg.flowing(t, 2)
	}

	// The proxy keeps serving: a well-formed call in the same session.
	x := harness.Must(t)(c.Call(ctx, 999, "count", map[string]any{"n": 3, "interval_ms": 1}, "after"))
	if ids, err := harness.CheckIDs(x.Events); err != nil || len(ids) != 4 {
		t.Fatalf("a good call after the malformed ones: %v: %s", err, x)
	}
	bg.finish(t)
}
