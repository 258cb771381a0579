package security

import (
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/mcpresume/caddy-mcp-resume/internal/demoserver"
	"github.com/mcpresume/caddy-mcp-resume/internal/eventid"
	"github.com/mcpresume/caddy-mcp-resume/internal/mcptest"
	"github.com/mcpresume/caddy-mcp-resume/tests/harness"
)

// TestIsolation: a cursor only ever opens its own session's own stream. IDs
// of another session (valid format, other epoch) and stream numbers the
// session does not have get 400 with a JSON-RPC error body and no events;
// with two concurrent tool calls in one session, a cursor of stream A
// replays exactly A's missed events and never one of B's, and vice versa.
func TestIsolation(t *testing.T) {
	ctx := t.Context()
	upstream := harness.StartDemo(t, demoserver.Options{})
	caddy := harness.StartCaddy(t, mcptest.ResumeRoute(upstream, ""))

	s1 := mustInit(t, newClient(caddy.Base(), "2025-03-26", nil))
	s2 := mustInit(t, newClient(caddy.Base(), "2025-03-26", nil))
	x1 := harness.Must(t)(s1.Call(ctx, 1, "echo", map[string]any{"text": "s1-secret-aa1"}, "t1"))
	x2 := harness.Must(t)(s2.Call(ctx, 1, "echo", map[string]any{"text": "s2-secret-bb2"}, "t2"))
	id1, err1 := harness.CheckIDs(x1.Events)
	id2, err2 := harness.CheckIDs(x2.Events)
	if err1 != nil || err2 != nil || len(id1) != 1 || len(id2) != 1 {
		t.Fatalf("setup: %v %v: %s / %s", err1, err2, x1, x2)
	}
	if id1[0].Epoch == id2[0].Epoch {
		t.Fatalf("two sessions share the epoch %s", id1[0].Epoch)
	}

	badRequest := func(t *testing.T, c *mcptest.Client, lastID string, secrets ...string) {
		t.Helper()
		x, err := harness.Finish(c.Resume(ctx, lastID))
		if err != nil {
			t.Fatal(err)
		}
		harness.RPCError(t, x, http.StatusBadRequest)
		noLeak(t, "resume with "+lastID, x.Body, secrets...)
	}
	t.Run("another session's ID", func(t *testing.T) {
		// Both at seq 0 (inside the window) and at head.
		badRequest(t, s1, x2.Events[0].ID, "s2-secret-bb2")
		badRequest(t, s1, eventid.ID{Epoch: id2[0].Epoch, Stream: id2[0].Stream, Seq: 0}.String(), "s2-secret-bb2")
		badRequest(t, s2, x1.Events[0].ID, "s1-secret-aa1")
	})
	t.Run("a stream the session does not have", func(t *testing.T) {
		badRequest(t, s1, eventid.ID{Epoch: id1[0].Epoch, Stream: id1[0].Stream + 50, Seq: 0}.String(), "s1-secret-aa1")
		badRequest(t, s1, eventid.ID{Epoch: id1[0].Epoch, Stream: 4294967295, Seq: 1}.String(), "s1-secret-aa1")
	})

	t.Run("two concurrent streams of one session", func(t *testing.T) {
		const n = 12
		a, err := s1.Call(ctx, 11, "count", map[string]any{"n": n, "interval_ms": 20}, "token-A")
		if err != nil {
			t.Fatal(err)
		}
		b, err := s1.Call(ctx, 12, "count", map[string]any{"n": n, "interval_ms": 20}, "token-B")
		if err != nil {
			t.Fatal(err)
		}
		// Read three of A's events, then drop A; read B to its end.
		var gotA []mcptest.Event
		harness.StreamEvents(a.Body, func(ev mcptest.Event) bool {
			gotA = append(gotA, ev)
			return len(gotA) < 3
		})
		a.Body.Close()
		xb := harness.MustFinish(t, b, nil)
		checkStream := func(what string, evs []mcptest.Event, token string, reqID, firstProgress int) eventid.ID {
			t.Helper()
			ids, err := harness.CheckIDs(evs)
			if err != nil {
				t.Fatalf("%s: %v", what, err)
			}
			for i, ev := range evs {
				other := map[string]string{"token-A": "token-B", "token-B": "token-A"}[token]
				if strings.Contains(ev.Data, other) {
					t.Fatalf("%s: event %d is another stream's: %+v", what, i, ev)
				}
				m, _ := harness.Decode(ev.Data)
				if i < len(evs)-1 || m.Result == nil {
					if m.Params.ProgressToken != token || int(m.Params.Progress) != firstProgress+i {
						t.Fatalf("%s: event %d: %s, want progress %d of %s", what, i, ev.Data, firstProgress+i, token)
					}
				} else if string(m.ID) != fmt.Sprint(reqID) {
					t.Fatalf("%s: final result for id %s, want %d", what, m.ID, reqID)
				}
			}
			return ids[0]
		}
		if len(gotA) != 3 {
			t.Fatalf("A: got %d events before dropping it", len(gotA))
		}
		aFirst := checkStream("A before the drop", gotA, "token-A", 11, 1)
		if len(xb.Events) != n+1 {
			t.Fatalf("B: want %d events, got %s", n+1, xb)
		}
		bFirst := checkStream("B", xb.Events, "token-B", 12, 1)
		if aFirst.Stream == bFirst.Stream {
			t.Fatalf("A and B share stream %d", aFirst.Stream)
		}

		// A's cursor replays A's events 4.. and A's result, only.
		ra := harness.Must(t)(s1.Resume(ctx, gotA[2].ID))
		if ra.Status != 200 || len(ra.Events) != n+1-3 {
			t.Fatalf("resume of A from %s: want %d events, got %s", gotA[2].ID, n+1-3, ra)
		}
		if id := checkStream("A resumed", ra.Events, "token-A", 11, 4); id.Seq != 4 || id.Stream != aFirst.Stream {
			t.Fatalf("A resumed at %s, want seq 4 of stream %d", id, aFirst.Stream)
		}
		noLeak(t, "A's replay", ra.Body, "token-B")

		// B's cursor at 0 replays all of B, only.
		rb := harness.Must(t)(s1.Resume(ctx, eventid.ID{Epoch: bFirst.Epoch, Stream: bFirst.Stream, Seq: 0}.String()))
		if rb.Status != 200 || len(rb.Events) != n+1 {
			t.Fatalf("resume of B from 0: %s", rb)
		}
		checkStream("B resumed", rb.Events, "token-B", 12, 1)
		noLeak(t, "B's replay", rb.Body, "token-A")
	})
}
