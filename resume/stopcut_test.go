package resume

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/mcpresume/caddy-mcp-resume/buffer"
	"github.com/mcpresume/caddy-mcp-resume/internal/eventid"
)

// attack21: the stop's cut writes an ID-only event (empty data) whatever
// the session's version, though the project gives 2025-06-18 and
// 2025-03-26 sessions no priming event "since their clients may choke on
// empty data" (tests/e2e TestPrimingOnlyFor20251125): an older client cut
// by a drain at head now gets exactly the event it may choke on.
func TestAStopCutGivesOlderVersionsNoEmptyEvent(t *testing.T) {
	t.Parallel()
	for _, version := range []string{"2025-06-18", "2025-03-26"} {
		t.Run(version, func(t *testing.T) {
			t.Parallel()
			h := testHandler(t)
			sess := newSession(t, h, version)
			str, err := sess.NewStream([]string{`1`}, [32]byte{})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := str.Append(context.Background(), buffer.Entry{Fields: []byte("data: {}\n")}); err != nil {
				t.Fatal(err)
			}
			srv := relayServer(t, h, &upstream{})
			at := string(eventid.Append(nil, sess.Epoch(), 1, 1))
			r, _ := http.NewRequest("GET", srv.URL+"/mcp", nil)
			r.Header.Set("Accept", "text/event-stream")
			r.Header.Set(hdrSessionID, "sess-1")
			r.Header.Set(hdrVersion, version)
			r.Header.Set("Authorization", "Bearer x")
			r.Header.Set(hdrLastEventID, at)
			resp, err := http.DefaultClient.Do(r)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			br := bufio.NewReader(resp.Body)
			if line, err := br.ReadString('\n'); err != nil || !strings.HasPrefix(line, ":") {
				t.Fatalf("first line %q, %v: want the comment that releases the headers", line, err)
			}
			br.ReadString('\n')
			h.rt.Stop()
			rest, _ := io.ReadAll(br)
			if strings.Contains(string(rest), "id:") && !strings.Contains(string(rest), "data:") {
				t.Fatalf("a %s client cut by the stop got %q: an event with an ID and empty data, which the proxy gives its version nowhere else", version, rest)
			}
		})
	}
}
