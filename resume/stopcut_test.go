package resume

import (
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/internal/eventid"
)

// attack21: the stop's cut wrote an ID-only event (empty data) whatever the
// session's version, though 2025-06-18 and 2025-03-26 sessions get no
// event without data "since their clients may choke on it" (tests/e2e
// TestPrimingOnlyFor20251125). Now an older version's resume of a request
// stream holds its headers for its first events, and a stop during that
// hold must give the client no response at all (a failed request, which it
// makes again), not a 200 whose body ends with no ID in it (which the Go
// SDK takes for the call lost): review 54 found the cut flushing the held
// headers first.
func TestAStopCutGivesOlderVersionsNoEmptyEvent(t *testing.T) {
	t.Parallel()
	for _, version := range []string{"2025-06-18", "2025-03-26"} {
		t.Run(version, func(t *testing.T) {
			t.Parallel()
			h := testHandler(t)
			sess, str, srv := oneEventStream(t, h, version)
			at := string(eventid.Append(nil, sess.Epoch(), 1, 1)) // at head
			r, _ := http.NewRequest("GET", srv.URL+"/mcp", nil)
			r.Header.Set("Accept", "text/event-stream")
			r.Header.Set(hdrSessionID, "sess-1")
			r.Header.Set(hdrVersion, version)
			r.Header.Set("Authorization", "Bearer x")
			r.Header.Set(hdrLastEventID, at)
			go func() {
				for !str.Connected() { // the resume holds its headers now
					time.Sleep(time.Millisecond)
				}
				h.rt.Stop()
			}()
			resp, err := http.DefaultClient.Do(r)
			if err != nil {
				return // a failed request
			}
			defer resp.Body.Close()
			body, rerr := io.ReadAll(resp.Body)
			t.Fatalf("a stop during the held headers gave the client %d, body %q (%v): a stream with no ID, not a failed request",
				resp.StatusCode, body, rerr)
		})
	}
}
