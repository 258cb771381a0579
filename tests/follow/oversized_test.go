package follow

import (
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/internal/mcptest"
	"github.com/mcpresume/caddy-mcp-resume/tests/harness"
)

// poisonUpstream is an MCP server with an event store whose standalone
// stream holds, as its second event, one over the proxy's max_event_bytes.
type poisonUpstream struct {
	mu   sync.Mutex
	gets []string // the Last-Event-ID of each standalone GET
}

func (p *poisonUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch r.Method {
	case http.MethodPost:
		body, _ := io.ReadAll(r.Body)
		if strings.Contains(string(body), `"initialize"`) {
			w.Header().Set("Mcp-Session-Id", "poison-session")
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprint(w, `{"jsonrpc":"2.0","id":0,"result":{"protocolVersion":"2025-06-18","capabilities":{},"serverInfo":{"name":"p","version":"1"}}}`)
			return
		}
		w.WriteHeader(http.StatusAccepted)
	case http.MethodGet:
		last := r.Header.Get("Last-Event-ID")
		p.mu.Lock()
		p.gets = append(p.gets, last)
		p.mu.Unlock()
		from, _ := strconv.Atoi(last)
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		notice := func(s string) string {
			return `{"jsonrpc":"2.0","method":"notifications/message","params":{"level":"info","data":"` + s + `"}}`
		}
		evs := []string{notice("one"), notice(strings.Repeat("x", 4000)), notice("three")}
		for i, d := range evs {
			if i+1 > from {
				fmt.Fprintf(w, "id: %d\ndata: %s\n\n", i+1, d)
			}
		}
		w.(http.Flusher).Flush()
		select {
		case <-r.Context().Done():
		case <-time.After(5 * time.Second):
		}
	case http.MethodDelete:
		w.WriteHeader(http.StatusOK)
	}
}

// An upstream event over max_event_bytes fails the standalone stream (a
// warning, and the stream goes on). The event is reported lost, so the
// upstream cursor moves past it: asked for again, it would fail every later
// GET, and nothing after it would ever reach the client.
func TestOversizedStandaloneEventIsSkipped(t *testing.T) {
	up := &poisonUpstream{}
	addr := harness.StartHandler(t, up)
	c := harness.StartCaddy(t, mcptest.ResumeRoute(addr, "max_event_bytes 1KiB"))
	rc := harness.NewSession(t, c.Base(), "2025-06-18")
	last := ""
	var datas []string
	for round := 0; round < 4; round++ {
		var extra http.Header
		if last != "" {
			extra = http.Header{"Last-Event-ID": {last}}
		}
		resp := rc.Request("GET", "", extra)
		want := 0 // the first GET ends once the stream failed
		if round > 0 {
			want = 1 // then an event, or nothing
		}
		evs, err := mcptest.ReadEvents(resp.Body, want, 3*time.Second)
		resp.Body.Close()
		t.Logf("GET %d (Last-Event-ID %q): %d, %d events, err %v", round, last, resp.StatusCode, len(evs), err)
		for _, e := range evs {
			t.Logf("  id=%s type=%s data=%.140s", e.ID, e.Type, e.Data)
			datas = append(datas, e.Data)
			if e.ID != "" {
				last = e.ID
			}
		}
		if strings.Contains(strings.Join(datas, "\n"), `"three"`) {
			break
		}
	}
	up.mu.Lock()
	t.Logf("upstream standalone GETs, by Last-Event-ID: %q", up.gets)
	up.mu.Unlock()
	if !strings.Contains(strings.Join(datas, "\n"), `"three"`) {
		t.Fatal("the event after the oversized one never reached the client")
	}
	up.mu.Lock()
	defer up.mu.Unlock()
	for _, id := range up.gets[1:] {
		if id == "1" {
			t.Fatalf("the proxy asked the upstream for the oversized event again: %q", up.gets)
		}
	}
}
