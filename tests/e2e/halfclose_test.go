package e2e

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/internal/demoserver"
	"github.com/mcpresume/caddy-mcp-resume/internal/mcptest"
	"github.com/mcpresume/caddy-mcp-resume/tests/harness"
)

// A client that shuts its side of the connection after sending a call
// (net/http then cancels the request, as for a client gone) but still
// reads must never get a cleanly ended response without its answer: it
// would take the call for answered with nothing. Plain reverse_proxy
// aborts such a response; so does the proxy. A 2025-11-25 client holds
// the priming event's ID and gets the answer by resuming; an older one
// sees its call fail, as behind plain reverse_proxy (review 50).
func TestHalfClosedClientIsNotToldTheCallEnded(t *testing.T) {
	c, _ := proxyFor(t, demoserver.Options{}, "")
	for _, version := range []string{"2025-11-25", "2025-06-18"} {
		t.Run(version, func(t *testing.T) {
			t.Parallel()
			rc := harness.NewSession(t, c.Base(), version)
			conn, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", c.HTTPPort), 5*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			conn.SetDeadline(time.Now().Add(20 * time.Second))
			body := mcptest.CallBody(7, "count", map[string]any{"n": 2, "interval_ms": 100}, "tok")
			fmt.Fprintf(conn, "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"+
				"Accept: application/json, text/event-stream\r\nMcp-Session-Id: %s\r\nMcp-Protocol-Version: %s\r\n"+
				"Content-Length: %d\r\n\r\n%s", rc.SessionID, version, len(body), body)
			conn.(*net.TCPConn).CloseWrite()

			resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
			var got []byte
			if err == nil {
				got, err = io.ReadAll(resp.Body)
			}
			evs, _ := harness.ParseSSE(got)
			answered := strings.Contains(string(got), `"result"`)
			switch {
			case err == nil && !answered:
				t.Fatalf("the response ended cleanly without the answer (%d): %q", resp.StatusCode, got)
			case answered:
				return // the whole answer came: nothing to resume
			}
			t.Logf("response broken as a cut: %v; %d events", err, len(evs))
			if version != "2025-11-25" {
				return
			}
			if len(evs) == 0 || evs[len(evs)-1].ID == "" {
				t.Fatalf("a 2025-11-25 stream cut without an event ID to resume from: %q", got)
			}
			// The proxy read on: the answer is there for the resume.
			res := rc.Resume(evs[len(evs)-1].ID)
			defer res.Body.Close()
			if rest := harness.ReadEvents(t, res, 0); len(rest) == 0 || !strings.Contains(rest[len(rest)-1].Data, `"id":7`) {
				t.Fatalf("the resume did not end with the call's answer: %+v", rest)
			}
		})
	}
}
