package security

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/internal/demoserver"
	"github.com/mcpresume/caddy-mcp-resume/internal/eventid"
	"github.com/mcpresume/caddy-mcp-resume/internal/mcptest"
	"github.com/mcpresume/caddy-mcp-resume/tests/harness"
)

// badEnv is what the rows of TestBadInputs work with.
type badEnv struct {
	caddy  *harness.Caddy
	host   string          // the proxy's host:port
	main   *mcptest.Client // the session the rows poke at (2025-03-26, so batches are allowed)
	direct *mcptest.Client // the same session, straight to the upstream
	epoch  string          // main's epoch
	stream uint32          // main's setup stream
	head   uint64          // its head
	bgs    []*background
}

func (e *badEnv) id(stream uint32, seq uint64) string {
	return eventid.ID{Epoch: e.epoch, Stream: stream, Seq: seq}.String()
}

// badInput is one row: an input, and the status or event it must get.
type badInput struct {
	name string
	want string // the expectation, for the log
	send func(e *badEnv) (harness.Exchange, error)
	// status is the status the proxy must answer; 0 means the upstream
	// decides (the row's check compares with it).
	status int
	rpcErr bool // the body must be a JSON-RPC error (application/json)
	check  func(t *testing.T, e *badEnv, x harness.Exchange)
}

// TestBadInputs sends bad input of every kind through a real Caddy to the
// demo MCP server while two background sessions (one per protocol
// generation) stream long tool calls. Each row names its input and the
// status or event it must get; after each row both background sessions must
// still be flowing, and at the end every event they received must be
// contiguous and complete.
func TestBadInputs(t *testing.T) {
	ctx := t.Context()
	upstream := harness.StartDemo(t, demoserver.Options{})
	caddy := harness.StartCaddy(t, mcptest.ResumeRoute(upstream, `		max_request_bytes 64KiB
		max_event_bytes 64KiB
		max_stream_bytes 1MiB
		max_sessions 3
		max_streams_per_session 16
		resume_window 3s`))

	e := &badEnv{caddy: caddy, host: strings.TrimPrefix(caddy.Base(), "http://")}
	e.bgs = []*background{
		startBackground(t, caddy.Base(), "bg-a", "2025-03-26", 40, 30),
		startBackground(t, caddy.Base(), "bg-b", "2025-11-25", 40, 30),
	}
	e.main = mustInit(t, newClient(caddy.Base(), "2025-03-26", nil))
	e.direct = newClient("http://"+upstream, e.main.Version, nil)
	e.direct.SessionID = e.main.SessionID
	setup := harness.Must(t)(e.main.Call(ctx, 1, "echo", map[string]any{"text": "main-secret-5a7"}, "main"))
	ids, err := harness.CheckIDs(setup.Events)
	if err != nil || len(ids) != 1 {
		t.Fatalf("setup call: %v: %s", err, setup)
	}
	e.epoch, e.stream, e.head = ids[0].Epoch, ids[0].Stream, ids[0].Seq
	for _, b := range e.bgs {
		b.flowing(t, 1)
	}

	for _, row := range badInputRows(ctx) {
		t.Run(row.name, func(t *testing.T) {
			t.Logf("want: %s", row.want)
			x, err := row.send(e)
			if err != nil {
				t.Fatalf("sending: %v", err)
			}
			switch {
			case row.rpcErr:
				harness.RPCError(t, x, row.status)
			case row.status != 0 && x.Status != row.status:
				t.Fatalf("want status %d, got %s", row.status, x)
			}
			if x.Status >= 500 && x.Status != http.StatusServiceUnavailable {
				t.Fatalf("server error: %s", x)
			}
			noLeak(t, "the answer", x.Body, "main-secret-5a7", "bg-a-call", "bg-b-call")
			if row.check != nil {
				row.check(t, e, x)
			}
		})
		// Whatever the row did, the other sessions keep flowing.
		for _, b := range e.bgs {
			b.flowing(t, 2)
		}
	}

	// The process survives and the main session still works (once the
	// streams of the max_streams_per_session row are out of their window).
	deadline := time.Now().Add(30 * time.Second)
	for {
		x, err := harness.Finish(e.main.Call(ctx, 9999, "echo", map[string]any{"text": "after all rows"}, "main"))
		if err == nil && strings.Contains(string(x.Body), "after all rows") {
			break
		}
		if err == nil || !strings.Contains(err.Error(), ": 503 ") || time.Now().After(deadline) {
			t.Fatalf("main session after the rows: %v %s", err, x)
		}
		time.Sleep(200 * time.Millisecond) // the poll's interval, while the answer is 503
	}
	for _, b := range e.bgs {
		b.finish(t)
	}
}

func badInputRows(ctx context.Context) []badInput {
	get := func(lastID func(e *badEnv) string) func(e *badEnv) (harness.Exchange, error) {
		return func(e *badEnv) (harness.Exchange, error) { return harness.Finish(e.main.Resume(ctx, lastID(e))) }
	}
	raw := func(headersOnly bool, lines func(e *badEnv) []string) func(e *badEnv) (harness.Exchange, error) {
		return func(e *badEnv) (harness.Exchange, error) {
			return harness.RawExchange(e.host, harness.RawGet(e.host, e.main.SessionID, e.main.Version, lines(e)...), headersOnly)
		}
	}
	malformed := func(name, want string, lastID func(e *badEnv) string) badInput {
		return badInput{name: name, want: want, send: get(lastID), status: 400, rpcErr: true}
	}
	post := func(body string, extra http.Header) func(e *badEnv) (harness.Exchange, error) {
		return func(e *badEnv) (harness.Exchange, error) { return harness.Finish(e.main.Do(ctx, "POST", body, extra)) }
	}
	// upstreamDecides: the proxy answers what the upstream answers the same
	// bytes (sent straight to it afterwards, in the same session).
	upstreamDecides := func(name, body string, extra http.Header) badInput {
		return badInput{
			name: name, want: "what the upstream answers the same request (the proxy must not crash or interfere)",
			send: post(body, extra),
			check: func(t *testing.T, e *badEnv, x harness.Exchange) {
				d, err := harness.Finish(e.direct.Do(ctx, "POST", body, extra))
				if err != nil {
					t.Fatal(err)
				}
				if d.Status != x.Status || mcptest.MediaType(d.Header) != mcptest.MediaType(x.Header) {
					t.Fatalf("proxy %s, upstream %s", x, d)
				}
				if mcptest.MediaType(x.Header) == "text/event-stream" {
					if _, err := harness.CheckIDs(x.Events); err != nil {
						t.Fatal(err)
					}
					if len(x.Events) == 0 || len(d.Events) == 0 {
						t.Fatalf("proxy %s, upstream %s", x, d)
					}
					pm, _ := harness.Decode(x.Events[len(x.Events)-1].Data)
					um, _ := harness.Decode(d.Events[len(d.Events)-1].Data)
					if string(pm.ID) != string(um.ID) || (pm.Error == nil) != (um.Error == nil) {
						t.Fatalf("proxy's final message %s, upstream's %s", x.Events[len(x.Events)-1].Data, d.Events[len(d.Events)-1].Data)
					}
				}
				t.Logf("proxy and upstream both: %d %s", x.Status, mcptest.MediaType(x.Header))
			},
		}
	}
	echo := func(id string) string {
		return fmt.Sprintf(`{"jsonrpc":"2.0","id":%s,"method":"tools/call","params":{"name":"echo","arguments":{"text":"id row"}}}`, id)
	}
	big := strings.Repeat("x", 70<<10)

	rows := []badInput{
		// ---- Last-Event-ID on GET ------------------------------------------
		{
			name: "Last-Event-ID empty", want: "treated as absent: 200, the session's standalone stream",
			send: raw(true, func(e *badEnv) []string { return []string{"Last-Event-ID:"} }), status: 200,
			check: func(t *testing.T, e *badEnv, x harness.Exchange) {
				if mcptest.MediaType(x.Header) != "text/event-stream" {
					t.Fatalf("not a stream: %s", x)
				}
			},
		},
		{
			name: "Last-Event-ID of 10 KB", want: "400, a JSON-RPC error that does not echo it",
			send: get(func(e *badEnv) string { return e.id(e.stream, 0) + strings.Repeat("7", 10<<10) }), status: 400, rpcErr: true,
			check: func(t *testing.T, e *badEnv, x harness.Exchange) {
				if len(x.Body) > 1024 {
					t.Fatalf("error body of %d bytes", len(x.Body))
				}
			},
		},
		malformed("Last-Event-ID non-ASCII (UTF-8)", "400", func(e *badEnv) string { return "épоch٣٤-1-1" }),
		{
			name: "Last-Event-ID with raw 0xFF bytes", want: "400, JSON-RPC error",
			send: raw(false, func(e *badEnv) []string { return []string{"Last-Event-ID: " + e.epoch + "-1-\xff\xfe"} }), status: 400, rpcErr: true,
		},
		{
			name: "Last-Event-ID with a bare CR inside", want: "400 (Go's HTTP server refuses the header before the proxy sees it)",
			send: raw(false, func(e *badEnv) []string { return []string{"Last-Event-ID: " + e.id(e.stream, 0) + "\revent: gap"} }), status: 400,
		},
		{
			name: "Last-Event-ID with a NUL byte", want: "400 (refused by Go's HTTP server)",
			send: raw(false, func(e *badEnv) []string { return []string{"Last-Event-ID: " + e.id(e.stream, 0) + "\x00"} }), status: 400,
		},
		{
			name: "Last-Event-ID CRLF injection of SSE fields",
			want: "the CRLF ends the header: a resume at the head of a complete stream (204, nothing); the injected lines are mere headers and never reach a stream",
			send: raw(false, func(e *badEnv) []string {
				return []string{"Last-Event-ID: " + e.id(e.stream, e.head), "id: evil-1-1", "event: gap", "data: {\"injected\":true}"}
			}), status: 204,
			check: func(t *testing.T, e *badEnv, x harness.Exchange) {
				noLeak(t, "the stream", x.Body, "evil", "injected")
				if len(x.Events) != 0 {
					t.Fatalf("events at head: %s", x)
				}
			},
		},
		{
			name: "Last-Event-ID folded over two lines (obs-fold)", want: "400 (malformed either way)",
			send: raw(false, func(e *badEnv) []string {
				return []string{"Last-Event-ID: " + e.epoch + "-1", "\t-1"}
			}), status: 400,
		},
		malformed("Last-Event-ID abc", "400", func(e *badEnv) string { return "abc" }),
		malformed("Last-Event-ID x-1-1", "400", func(e *badEnv) string { return "x-1-1" }),
		malformed("Last-Event-ID stream 0", "400", func(e *badEnv) string { return e.epoch + "-0-1" }),
		malformed("Last-Event-ID seq with a leading zero", "400", func(e *badEnv) string { return fmt.Sprintf("%s-%d-01", e.epoch, e.stream) }),
		malformed("Last-Event-ID stream with a leading zero", "400", func(e *badEnv) string { return fmt.Sprintf("%s-0%d-1", e.epoch, e.stream) }),
		malformed("Last-Event-ID epoch in upper case", "400", func(e *badEnv) string { return strings.ToUpper(e.epoch) + fmt.Sprintf("-%d-1", e.stream) }),
		malformed("Last-Event-ID negative seq", "400", func(e *badEnv) string { return fmt.Sprintf("%s-%d--1", e.epoch, e.stream) }),
		malformed("Last-Event-ID seq overflowing uint64", "400", func(e *badEnv) string { return fmt.Sprintf("%s-%d-18446744073709551616", e.epoch, e.stream) }),
		malformed("Last-Event-ID stream overflowing uint32", "400", func(e *badEnv) string { return e.epoch + "-4294967297-1" }),
		malformed("Last-Event-ID with an underscore (upstream SDK shape)", "400", func(e *badEnv) string { return fmt.Sprintf("%s_%d_1", e.epoch, e.stream) }),
		malformed("Last-Event-ID ahead of head", "400", func(e *badEnv) string { return e.id(e.stream, e.head+1) }),
		malformed("Last-Event-ID far ahead of head", "400", func(e *badEnv) string { return e.id(e.stream, 1<<63) }),
		malformed("Last-Event-ID of a stream the session does not have", "400", func(e *badEnv) string { return e.id(e.stream+100, 0) }),
		malformed("Last-Event-ID foreign epoch", "400", func(e *badEnv) string {
			if e.epoch == "aaaaaaaa" {
				return "bbbbbbbb-1-1"
			}
			return "aaaaaaaa-1-1"
		}),
		malformed("Last-Event-ID of a background session (valid, other epoch)", "400, and the background session is undisturbed",
			func(e *badEnv) string { return e.bgs[0].lastID() }),
		{
			name: "main's Last-Event-ID under a background session's Mcp-Session-Id", want: "400 (the epoch is not that session's)",
			send: func(e *badEnv) (harness.Exchange, error) {
				bg := e.main.WithHeader(nil)
				bg.SessionID = e.bgs[0].c.SessionID
				return harness.Finish(bg.Resume(ctx, e.id(e.stream, 0)))
			},
			status: 400, rpcErr: true,
		},
		{
			name: "main's Last-Event-ID without Mcp-Session-Id", want: "passes through: what the upstream answers, and no events",
			send: func(e *badEnv) (harness.Exchange, error) {
				return harness.Finish(e.main.Do(ctx, "GET", "", http.Header{"Last-Event-Id": {e.id(e.stream, 0)}, "Mcp-Session-Id": nil}))
			},
			check: func(t *testing.T, e *badEnv, x harness.Exchange) {
				d, err := harness.Finish(e.direct.Do(ctx, "GET", "", http.Header{"Last-Event-Id": {e.id(e.stream, 0)}, "Mcp-Session-Id": nil}))
				if err != nil || d.Status != x.Status || x.Status == 200 {
					t.Fatalf("proxy %s, upstream %s (%v)", x, d, err)
				}
			},
		},
		{
			name: "main's Last-Event-ID under an unknown Mcp-Session-Id", want: "the upstream's 404 (the session is unknown there too), no events",
			send: func(e *badEnv) (harness.Exchange, error) {
				c := e.main.WithHeader(nil)
				c.SessionID = "no-such-session-4711"
				return harness.Finish(c.Resume(ctx, e.id(e.stream, 0)))
			},
			status: 404,
		},

		// ---- POST bodies -----------------------------------------------
		{
			name: "batch of two tools/call", want: "200, one SSE stream answering ids 201 and 202 under contiguous proxy ids",
			send: post(`[`+echo("201")+`,`+echo("202")+`]`, nil), status: 200,
			check: func(t *testing.T, e *badEnv, x harness.Exchange) {
				if _, err := harness.CheckIDs(x.Events); err != nil {
					t.Fatal(err)
				}
				answered := map[string]bool{}
				for _, ev := range x.Events {
					var msgs []mcptest.Message
					if strings.HasPrefix(ev.Data, "[") {
						json.Unmarshal([]byte(ev.Data), &msgs)
					} else if m, ok := harness.Decode(ev.Data); ok {
						msgs = []mcptest.Message{m}
					}
					for _, m := range msgs {
						if m.Result != nil {
							answered[string(m.ID)] = true
						}
					}
				}
				if !answered["201"] || !answered["202"] || len(answered) != 2 {
					t.Fatalf("answered %v: %s", answered, x)
				}
			},
		},
		upstreamDecides("id number", echo("301"), nil),
		upstreamDecides("id negative", echo("-7"), nil),
		upstreamDecides("id fraction", echo("3.5"), nil),
		upstreamDecides("id with exponent", echo("1e2"), nil),
		upstreamDecides("id huge number", echo("123456789012345678901234567890"), nil),
		upstreamDecides("id string", echo(`"s-302"`), nil),
		upstreamDecides("id empty string", echo(`""`), nil),
		upstreamDecides("id string with escapes", echo(`"a\"b\u0000\n"`), nil),
		upstreamDecides("id null", echo("null"), nil),
		upstreamDecides("id object", echo(`{"a":1}`), nil),
		upstreamDecides("id array", echo(`[1]`), nil),
		upstreamDecides("id boolean", echo("true"), nil),
		upstreamDecides("missing id (a notification)", `{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":99999}}`, nil),
		upstreamDecides("a response nobody asked for", `{"jsonrpc":"2.0","id":424242,"result":{}}`, nil),
		upstreamDecides("invalid JSON", `{"jsonrpc":"2.0","id":1,"method":`, nil),
		upstreamDecides("empty body", "", http.Header{"Content-Type": {"application/json"}, "Accept": {"application/json, text/event-stream"}}),
		upstreamDecides("JSON that is not JSON-RPC", `[1,"two",{"three":3}]`, nil),
		upstreamDecides("empty batch", `[]`, nil),
		upstreamDecides("deeply nested JSON", strings.Repeat("[", 20000)+strings.Repeat("]", 20000), nil),
		upstreamDecides("POST carrying Last-Event-ID", echo("303"), http.Header{"Last-Event-Id": {"whatever-1-1"}}),
		{
			name: "body larger than max_request_bytes", want: "413 with a JSON-RPC error body",
			send:   post(fmt.Sprintf(`{"jsonrpc":"2.0","id":304,"method":"tools/call","params":{"name":"echo","arguments":{"text":%q}}}`, big), nil),
			status: 413, rpcErr: true,
		},
		{
			name: "chunked body larger than max_request_bytes", want: "413 with a JSON-RPC error body",
			send: func(e *badEnv) (harness.Exchange, error) {
				body := fmt.Sprintf(`{"jsonrpc":"2.0","id":305,"method":"tools/call","params":{"name":"echo","arguments":{"text":%q}}}`, big)
				req, _ := http.NewRequest("POST", e.main.URL, io.MultiReader(strings.NewReader(body))) // no length: chunked
				req.Header.Set("Content-Type", "application/json; charset=utf-8")
				req.Header.Set("Accept", "application/json, text/event-stream")
				req.Header.Set("Mcp-Session-Id", e.main.SessionID)
				req.Header.Set("Mcp-Protocol-Version", e.main.Version)
				return harness.Finish(e.main.HTTP.Do(req))
			},
			status: 413, rpcErr: true,
		},
		{
			name: "upstream event larger than max_event_bytes", want: "200, then event: gap (reason too_large) and a JSON-RPC error for id 401, both in the log: a resume from before the gap gets them again, a resume from the end gets 204",
			send: post(`{"jsonrpc":"2.0","id":401,"method":"tools/call","params":{"name":"big","arguments":{"bytes":100000}}}`, nil), status: 200,
			check: func(t *testing.T, e *badEnv, x harness.Exchange) {
				gapID := checkTooLarge(t, x, "401")
				before := mustParseID(t, gapID)
				before.Seq--
				r := harness.Must(t)(e.main.Resume(ctx, before.String()))
				if r.Status != 200 {
					t.Fatalf("resume of the failed stream before its gap %s: %s", gapID, r)
				}
				checkTooLarge(t, r, "401")
				end := harness.Must(t)(e.main.Resume(ctx, r.Events[len(r.Events)-1].ID))
				if end.Status != http.StatusNoContent {
					t.Fatalf("resume at the end of the failed stream: %s, want 204", end)
				}
			},
		},
		{
			name: "max_sessions reached", want: "the 4th initialize gets 503 with Retry-After and a JSON-RPC error body",
			send: func(e *badEnv) (harness.Exchange, error) {
				c := newClient(e.caddy.Base(), "2025-03-26", nil)
				return harness.Finish(c.Do(ctx, "POST", `{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-03-26","capabilities":{},"clientInfo":{"name":"4th","version":"1"}}}`, nil))
			},
			status: 503, rpcErr: true,
			check: func(t *testing.T, e *badEnv, x harness.Exchange) {
				if x.Header.Get("Retry-After") == "" || x.Header.Get("Mcp-Session-Id") != "" {
					t.Fatalf("want Retry-After and no session: %v", x.Header)
				}
			},
		},
		{
			name: "max_streams_per_session reached", want: "503 with Retry-After and a JSON-RPC error body; the streams already open complete in full",
			send: func(e *badEnv) (harness.Exchange, error) {
				var open []*http.Response
				defer func() {
					for _, r := range open {
						r.Body.Close()
					}
				}()
				for k := 0; k <= 17; k++ {
					// Long enough that all are live at once, however slowly a
					// loaded machine opens them: only live streams count.
					resp, err := e.main.Do(ctx, "POST", mcptest.CallBody(500+k, "count", map[string]any{"n": 80, "interval_ms": 100}, fmt.Sprint("limit-", k)), nil)
					if err != nil {
						return harness.Exchange{}, err
					}
					if resp.StatusCode == 200 {
						open = append(open, resp)
						continue
					}
					x, err := harness.Finish(resp, nil)
					if err != nil {
						return x, err
					}
					// Every stream opened before the refusal completes in full.
					for i, r := range open {
						o, err := harness.Finish(r, nil)
						if err != nil {
							return x, err
						}
						if _, err := harness.CheckIDs(o.Events); err != nil || len(o.Events) != 81 {
							return x, fmt.Errorf("stream %d opened before the limit: %v: %s", i, err, o)
						}
					}
					if len(open) == 0 {
						return x, fmt.Errorf("refused the first stream: %s", x)
					}
					return x, nil
				}
				return harness.Exchange{}, fmt.Errorf("no 503 after %d open streams", len(open))
			},
			status: 503, rpcErr: true,
			check: func(t *testing.T, e *badEnv, x harness.Exchange) {
				if x.Header.Get("Retry-After") == "" {
					t.Fatalf("no Retry-After: %v", x.Header)
				}
			},
		},
	}
	return rows
}

func mustParseID(t *testing.T, id string) eventid.ID {
	t.Helper()
	p, err := eventid.Parse(id)
	if err != nil {
		t.Fatalf("not a proxy event id %q: %v", id, err)
	}
	return p
}

// checkTooLarge checks a stream that failed on an oversized upstream event:
// a gap event with reason too_large, then a JSON-RPC error for the request,
// then the end. It returns the gap's id (the client's new cursor).
func checkTooLarge(t *testing.T, x harness.Exchange, reqID string) string {
	t.Helper()
	var gap *mcptest.Event
	var errFor bool
	for i, ev := range x.Events {
		switch {
		case ev.Type == "gap":
			var g mcptest.Gap
			if err := json.Unmarshal([]byte(ev.Data), &g); err != nil || g.Reason != "too_large" {
				t.Fatalf("gap event %q: %v", ev.Data, err)
			}
			if _, err := eventid.Parse(ev.ID); err != nil {
				t.Fatalf("gap event without a proxy id: %+v", ev)
			}
			gap = &x.Events[i]
		case gap != nil:
			m, ok := harness.Decode(ev.Data)
			if !ok || string(m.ID) != reqID || m.Error == nil || m.Error.Code > -32000 || m.Error.Code < -32099 {
				t.Fatalf("after the gap, want a JSON-RPC error for id %s, got %q", reqID, ev.Data)
			}
			errFor = true
		default:
			t.Fatalf("event before the gap: %+v", ev)
		}
	}
	if gap == nil || !errFor {
		t.Fatalf("want a gap (too_large) and a JSON-RPC error for id %s, got %s", reqID, x)
	}
	return gap.ID
}
