package mcptest

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/auth"

	"github.com/mcpresume/caddy-mcp-resume/internal/bearer"
)

func TestSSEReader(t *testing.T) {
	long := strings.Repeat("y", 100<<10) // longer than the reader's buffer
	in := ": mcp-resume\n\n" +
		"id: a-1-1\nevent: message\ndata: {\"a\":1}\n\n" +
		"id: a-1-2\r\ndata: line1\r\ndata: line2\r\n\r\n" +
		"id: a-1-0\n\n" + // an id alone: a priming event
		"retry: 10\nfoo: bar\n\n" + // nothing a client keeps: no event
		"data: " + long + "\n\n" +
		"data: unterminated"
	rd := NewSSEReader(strings.NewReader(in), 4096)
	for i, want := range []Event{
		{"a-1-1", "message", `{"a":1}`}, {"a-1-2", "", "line1\nline2"}, {"a-1-0", "", ""}, {"", "", long},
	} {
		ev, err := rd.Next()
		if err != nil {
			t.Fatalf("event %d: %v", i, err)
		}
		if ev != want {
			t.Errorf("event %d: id %q type %q data %.40q", i, ev.ID, ev.Type, ev.Data)
		}
	}
	if _, err := rd.Next(); err != io.EOF {
		t.Errorf("unfinished tail: %v, want it dropped and EOF", err)
	}
	if _, err := NewSSEReader(strings.NewReader(""), 4096).Next(); err != io.EOF {
		t.Errorf("empty body: %v, want EOF", err)
	}
}

func TestSSEReaderStrict(t *testing.T) {
	for in, ok := range map[string]bool{
		"id: e-1-1\ndata: x\n\n":  true,
		"retry: 10\n\n":           true, // a retry alone is an event
		"data: x\r\n\r\n":         false,
		"data: x\rdata: y\n\n":    false,
		"foo: bar\n\n":            false,
		"data\n\n":                false,
		"data: x\n\ndata: y\n":    false, // ends inside an event
		"data: x\n\ndata: y":      false, // ends inside a line
		"id: e-1-1\ndata: x\n\n:": false,
	} {
		rd := NewSSEReader(strings.NewReader(in), 4096)
		rd.Strict = true
		var err error
		for err == nil {
			_, err = rd.Next()
		}
		if (err == io.EOF) != ok {
			t.Errorf("%q: %v", in, err)
		}
	}
}

func TestAppendProgress(t *testing.T) {
	for _, c := range []struct {
		size int
		ts   int64
	}{{100, 0}, {1024, 0}, {16384, 0}, {1024, time.Now().UnixNano()}, {110, 0}, {96, 0}} {
		for _, progress := range []int{1, 12345, 199999} {
			s := string(AppendProgress(nil, json.RawMessage(`"b"`), progress, c.ts, c.size))
			if !strings.HasPrefix(s, EventPrefix) || !strings.HasSuffix(s, EventSuffix) {
				t.Fatalf("framing: %q", s)
			}
			data := strings.TrimSuffix(strings.TrimPrefix(s, EventPrefix), EventSuffix)
			if len(data) < c.size {
				t.Errorf("size %d progress %d: data is %d bytes, want exactly the size", c.size, progress, len(data))
			}
			if len(data) > c.size && c.size >= 110 {
				t.Errorf("size %d progress %d: data is %d bytes, want exactly the size", c.size, progress, len(data))
			}
			m, err := DecodeMessage(data)
			if err != nil {
				t.Fatalf("size %d: not JSON: %v: %s", c.size, err, data)
			}
			var ts struct {
				Params struct{ TS int64 } `json:"params"`
			}
			json.Unmarshal([]byte(data), &ts)
			if m.Method != "notifications/progress" || m.Params.Progress != float64(progress) || m.Params.ProgressToken != "b" || ts.Params.TS != c.ts {
				t.Errorf("size %d: decoded %+v, ts %d", c.size, m, ts.Params.TS)
			}
		}
	}
}

func TestParseMetrics(t *testing.T) {
	text := `# HELP caddy_mcp_resume_backpressure_stalls_total x
# TYPE caddy_mcp_resume_backpressure_stalls_total counter
caddy_mcp_resume_backpressure_stalls_total 3
caddy_mcp_resume_streams_failed_total{reason="stalled"} 2
caddy_mcp_resume_streams_failed_total{reason="a b}c\"d"} 1 1700000000000
caddy_mcp_resume_retained_bytes 1.5e+06
`
	m, err := ParseMetrics(strings.NewReader(text))
	if err != nil {
		t.Fatal(err)
	}
	failed, ok := m.Sum("caddy_mcp_resume_streams_failed_total")
	if m.Series["caddy_mcp_resume_backpressure_stalls_total"] != 3 || failed != 3 || !ok ||
		m.Series[`caddy_mcp_resume_streams_failed_total{reason="a b}c\"d"}`] != 1 ||
		m.Series["caddy_mcp_resume_retained_bytes"] != 1.5e6 || len(m.Series) != 4 ||
		m.Types["caddy_mcp_resume_backpressure_stalls_total"] != "counter" {
		t.Errorf("ParseMetrics = %+v", m)
	}
	if _, ok := m.Sum("caddy_mcp_resume_streams"); ok {
		t.Error("Sum matched a metric by a prefix of its name")
	}
	for _, bad := range []string{"garbage{\n", "name\n", "name{a=\"b\"}\n", "name x\n"} {
		if _, err := ParseMetrics(strings.NewReader(bad)); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
}

// The client and the upstream speak to each other as they speak to the
// proxy: a session, a paced and held stream, the result.
func TestClientAndUpstream(t *testing.T) {
	up := &Upstream{Version: "2025-06-18", KeepCalls: true}
	srv := httptest.NewServer(up)
	defer srv.Close()
	c := NewClient(srv.URL, "2025-06-18", srv.Client())
	if err := c.Initialize(t.Context()); err != nil {
		t.Fatal(err)
	}
	up.Hold("h")
	resp, err := c.Call(t.Context(), 7, "stream", StreamArgs{N: 3, Size: 200, IntervalMS: 1, Pre: 1, Hold: "h"}, "tok")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	first, err := ReadEvents(resp.Body, 1, 5*time.Second)
	if err != nil || len(first) != 1 || len(first[0].Data) != 200 {
		t.Fatalf("before the release: %+v, %v", first, err)
	}
	// The upstream counts an event once flushed, which may be after the
	// client read it; then the hold stops it.
	call := up.LastCall(c.SessionID)
	Eventually(5*time.Second, time.Millisecond, func() bool { return call.Events.Load() == 1 })
	time.Sleep(20 * time.Millisecond)
	if n := call.Events.Load(); n != 1 {
		t.Fatalf("%d events written before the release, want Pre = 1", n)
	}
	up.Release("h")
	rest, err := ReadEvents(resp.Body, 0, 5*time.Second)
	if err != nil || len(rest) != 3 || !strings.Contains(rest[2].Data, `"id":7,"result"`) {
		t.Fatalf("after the release: %+v, %v", rest, err)
	}
	<-call.Done
	if !call.Finished.Load() || call.Written.Load() != 3*(200+23) {
		t.Errorf("finished %v, written %d", call.Finished.Load(), call.Written.Load())
	}
	if r, err := c.Do(t.Context(), http.MethodGet, "", nil); err != nil || r.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("GET: %v %v", r, err)
	}
	if err := c.Delete(t.Context()); err != nil {
		t.Error(err)
	}
}

func TestJWTIssuer(t *testing.T) {
	j := NewJWTIssuer("https://as")
	tok := j.Mint("alice", time.Minute)
	info, err := j.Verify(t.Context(), tok, nil)
	if err != nil || info.UserID != "alice" || time.Until(info.Expiration) <= 0 {
		t.Fatalf("a fresh token: %+v, %v", info, err)
	}
	if tok2 := j.Mint("alice", time.Minute); tok2 == tok {
		t.Fatal("two tokens for the same subject are the same bytes")
	}
	if iss, sub, ok := bearer.Subject("Bearer " + tok); !ok || iss != "https://as" || sub != "alice" {
		t.Fatalf("the proxy reads %q %q %v", iss, sub, ok)
	}
	for name, bad := range map[string]string{
		"another issuer's key": NewJWTIssuer("https://as").Mint("alice", time.Minute),
		"expired":              j.Mint("alice", -time.Second),
		"another subject, same signature": strings.Join([]string{strings.Split(tok, ".")[0],
			b64.EncodeToString([]byte(`{"iss":"https://as","sub":"bob","exp":4102444800}`)), strings.Split(tok, ".")[2]}, "."),
		"opaque": "2YotnFZFEjr1zCsicMWpAA",
	} {
		if _, err := j.Verify(t.Context(), bad, nil); !errors.Is(err, auth.ErrInvalidToken) {
			t.Errorf("%s: %v, want ErrInvalidToken", name, err)
		}
	}
}
