package e2e

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/internal/demoserver"
	"github.com/mcpresume/caddy-mcp-resume/internal/mcptest"
	"github.com/mcpresume/caddy-mcp-resume/tests/harness"
)

// firstBlockReview53 reads a response's bytes up to the end of its first
// SSE block (or what came within d).
func firstBlockReview53(body io.Reader, d time.Duration) (string, io.Reader) {
	br := bufio.NewReader(body)
	type res struct{ b []byte }
	ch := make(chan res, 1)
	go func() {
		var out []byte
		for {
			c, err := br.ReadByte()
			if err != nil {
				ch <- res{out}
				return
			}
			out = append(out, c)
			if bytes.HasSuffix(out, []byte("\n\n")) {
				ch <- res{out}
				return
			}
		}
	}()
	select {
	case r := <-ch:
		return string(r.b), br
	case <-time.After(d):
		return "<timeout>", br
	}
}

// checkPreambleReview53 checks what a resume from lastID begins with, and
// that nothing without data comes to an older version.
func checkPreambleReview53(t *testing.T, version, lastID string, resp *http.Response, rest int) {
	t.Helper()
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("resume from %s: %d", lastID, resp.StatusCode)
	}
	first, br := firstBlockReview53(resp.Body, 5*time.Second)
	if version == "2025-11-25" {
		if want := "id: " + lastID + "\ndata: \n\n"; first != want {
			t.Errorf("%s resume from %s began with %q, want %q", version, lastID, first, want)
		}
	} else if strings.HasPrefix(first, ":") {
		// Nothing within headersHeld (a resume at head): a keep-alive.
		if strings.Contains(first, "id:") || strings.Contains(first, "data:") {
			t.Errorf("%s resume from %s began with %q", version, lastID, first)
		}
	} else if !strings.HasPrefix(first, "id: ") || strings.HasPrefix(first, "id: "+lastID+"\n") || !strings.Contains(first, "\ndata: {") {
		// Older versions get no event without data: the headers wait
		// for the first event after the cursor.
		t.Errorf("%s resume from %s began with %q, want its first event or a comment", version, lastID, first)
	}
	if rest == 0 {
		return
	}
	evs, _ := mcptest.ReadEvents(br, rest, 5*time.Second)
	for _, ev := range evs {
		if ev.Data == "" && version != "2025-11-25" {
			t.Errorf("%s session got an event without data: %+v", version, ev)
		}
		if ev.Data == "" && ev.ID != "" && version == "2025-11-25" {
			t.Errorf("%s: a second empty event after the preamble: %+v", version, ev)
		}
	}
}

// Review 53: every resume the log answers in full (replay, at head, the
// standalone stream) begins with the client's own position for 2025-11-25,
// and for older versions with its first event after the cursor (or a
// keep-alive comment when none comes soon), never an event without data.
func TestReview53ResumePreambleByVersion(t *testing.T) {
	c, _ := proxyFor(t, demoserver.Options{}, "")
	for _, version := range []string{"2025-11-25", "2025-06-18", "2025-03-26"} {
		t.Run(version, func(t *testing.T) {
			rc := harness.NewSession(t, c.Base(), version)
			// A long call: read 3 data events, then leave.
			resp := rc.Call(2, "count", map[string]any{"n": 30, "interval_ms": 100})
			evs := harness.ReadEvents(t, resp, 4)
			resp.Body.Close()
			evs = mcptest.AfterPosition(evs, evs[0].ID) // a priming event at seq 0, if any
			var data []mcptest.Event
			for _, ev := range evs {
				if ev.Data != "" {
					data = append(data, ev)
				}
			}
			if len(data) < 2 {
				t.Fatalf("events %+v", evs)
			}
			// Mid-stream replay.
			checkPreambleReview53(t, version, data[0].ID, rc.Resume(data[0].ID), 3)
			// At head of a live stream: read the replay to head, then resume at it.
			r2 := rc.Resume(data[1].ID)
			got, _ := mcptest.ReadResumed(r2.Body, data[1].ID, 2, 5*time.Second)
			r2.Body.Close()
			if len(got) == 0 {
				t.Fatalf("no events after %s", data[1].ID)
			}
			head := got[len(got)-1].ID
			checkPreambleReview53(t, version, head, rc.Resume(head), 1)

			// The standalone stream: open it, leave, resume at its start.
			sresp, err := rc.Client.Do(t.Context(), http.MethodGet, "", http.Header{"Accept": {"text/event-stream"}})
			if err != nil {
				t.Fatal(err)
			}
			sfirst, _ := firstBlockReview53(sresp.Body, 2*time.Second)
			sresp.Body.Close()
			t.Logf("%s standalone GET began with %q", version, sfirst)
			epoch := strings.Split(data[0].ID, "-")[0]
			sid := fmt.Sprintf("%s-0-0", epoch)
			checkPreambleReview53(t, version, sid, rc.Resume(sid), 0)
		})
	}
}
