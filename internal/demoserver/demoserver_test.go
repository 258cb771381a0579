package demoserver

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

const waitFor = 5 * time.Second

// connect starts the handler on a real socket and connects the SDK client,
// which opens the standalone GET stream before Connect returns.
func connect(t *testing.T, copts *mcp.ClientOptions) *mcp.ClientSession {
	t.Helper()
	srv := httptest.NewServer(New(Options{ProgressInterval: 10 * time.Millisecond}))
	t.Cleanup(srv.Close)

	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	client := mcp.NewClient(&mcp.Implementation{Name: "demoserver-test", Version: "0"}, copts)
	cs, err := client.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: srv.URL, MaxRetries: -1}, nil)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	// Registered after srv.Close, so it runs first: the DELETE must reach
	// the server.
	t.Cleanup(func() { cs.Close() })
	return cs
}

func call(t *testing.T, cs *mcp.ClientSession, params *mcp.CallToolParams) *mcp.CallToolResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	res, err := cs.CallTool(ctx, params)
	if err != nil {
		t.Fatalf("CallTool(%s): %v", params.Name, err)
	}
	if res.IsError {
		t.Fatalf("CallTool(%s): tool error: %s", params.Name, textOf(t, res))
	}
	return res
}

func textOf(t *testing.T, res *mcp.CallToolResult) string {
	t.Helper()
	if len(res.Content) != 1 {
		t.Fatalf("got %d content blocks, want 1", len(res.Content))
	}
	tc, ok := res.Content[0].(*mcp.TextContent)
	if !ok {
		t.Fatalf("content is %T, want *mcp.TextContent", res.Content[0])
	}
	return tc.Text
}

func TestCountSendsProgressInOrder(t *testing.T) {
	// Notifications are handled on the client's queue, which may lag behind
	// the result, so collect them on a channel.
	progress := make(chan *mcp.ProgressNotificationParams, 10)
	cs := connect(t, &mcp.ClientOptions{
		ProgressNotificationHandler: func(_ context.Context, req *mcp.ProgressNotificationClientRequest) {
			progress <- req.Params
		},
	})

	params := &mcp.CallToolParams{Name: "count", Arguments: map[string]any{"n": 3, "interval_ms": 10}}
	params.SetProgressToken("tok-1")
	res := call(t, cs, params)

	if got := textOf(t, res); got != "counted to 3" {
		t.Errorf("text = %q, want %q", got, "counted to 3")
	}
	var structured countResult
	if err := remarshal(res.StructuredContent, &structured); err != nil || structured.Count != 3 {
		t.Errorf("structured = %v (err %v), want {count: 3}", res.StructuredContent, err)
	}
	for i := 1; i <= 3; i++ {
		select {
		case p := <-progress:
			want := mcp.ProgressNotificationParams{ProgressToken: "tok-1", Progress: float64(i), Total: 3, Message: stepMsg(i)}
			if p.ProgressToken != want.ProgressToken || p.Progress != want.Progress || p.Total != want.Total || p.Message != want.Message {
				t.Errorf("progress %d = %+v, want %+v", i, *p, want)
			}
		case <-time.After(waitFor):
			t.Fatalf("timed out waiting for progress notification %d", i)
		}
	}
	select {
	case p := <-progress:
		t.Errorf("unexpected extra progress notification %+v", *p)
	case <-time.After(50 * time.Millisecond):
	}
}

func TestCountWithoutTokenSendsNoProgress(t *testing.T) {
	progress := make(chan struct{}, 10)
	cs := connect(t, &mcp.ClientOptions{
		ProgressNotificationHandler: func(context.Context, *mcp.ProgressNotificationClientRequest) {
			progress <- struct{}{}
		},
	})
	res := call(t, cs, &mcp.CallToolParams{Name: "count", Arguments: map[string]any{"n": 2, "interval_ms": 0}})
	if got := textOf(t, res); got != "counted to 2" {
		t.Errorf("text = %q, want %q", got, "counted to 2")
	}
	select {
	case <-progress:
		t.Error("got a progress notification without a progress token")
	case <-time.After(50 * time.Millisecond):
	}
}

func TestNotifyUsesStandaloneStream(t *testing.T) {
	// The client never sends logging/setLevel: the server seeds "info".
	notices := make(chan *mcp.LoggingMessageParams, 10)
	cs := connect(t, &mcp.ClientOptions{
		LoggingMessageHandler: func(_ context.Context, req *mcp.LoggingMessageRequest) {
			notices <- req.Params
		},
	})

	res := call(t, cs, &mcp.CallToolParams{Name: "notify", Arguments: map[string]any{"n": 3, "interval_ms": 10}})
	if got := textOf(t, res); got != "scheduled 3 notifications" {
		t.Errorf("text = %q, want %q", got, "scheduled 3 notifications")
	}
	// The call's own stream is closed by now, so these can only have come
	// over the standalone GET stream.
	for i := 1; i <= 3; i++ {
		select {
		case n := <-notices:
			if n.Level != "info" || n.Logger != "demo" || n.Data != noticeMsg(i) {
				t.Errorf("notice %d = %+v, want level info, logger demo, data %q", i, *n, noticeMsg(i))
			}
		case <-time.After(waitFor):
			t.Fatalf("timed out waiting for notice %d", i)
		}
	}
}

func TestEchoAndBig(t *testing.T) {
	cs := connect(t, nil)

	res := call(t, cs, &mcp.CallToolParams{Name: "echo", Arguments: map[string]any{"text": "héllo"}})
	if got := textOf(t, res); got != "héllo" {
		t.Errorf("echo = %q, want %q", got, "héllo")
	}

	const size = 1 << 20
	res = call(t, cs, &mcp.CallToolParams{Name: "big", Arguments: map[string]any{"bytes": size}})
	got := textOf(t, res)
	if len(got) != size || got != BigText(size) {
		t.Errorf("big: got %d bytes, want %d bytes of BigText", len(got), size)
	}
}

func TestRejectsNonLocalHostOnLoopback(t *testing.T) {
	srv := httptest.NewServer(New(Options{}))
	defer srv.Close()

	req, _ := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader(`{}`))
	req.Host = "evil.example"
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden {
		t.Errorf("status = %d, want 403", resp.StatusCode)
	}
}

func stepMsg(i int) string   { return fmt.Sprintf("step %d of 3", i) }
func noticeMsg(i int) string { return fmt.Sprintf("notice %d of 3", i) }

func remarshal(from, to any) error {
	b, err := json.Marshal(from)
	if err != nil {
		return err
	}
	return json.Unmarshal(b, to)
}
