package follow

// Review 50: the relay hand-off (the tap writing a call's first 4 KiB to
// an HTTP/1 client itself) with upstream events split across upstream
// writes around the 4 KiB budget and across the quiet hand-off (keepalive
// 100ms: the shortest allowed, so the quiet timer is 100ms), on the
// in-process Caddy with a keep-alive connection reused call after call.

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/internal/mcptest"
	"github.com/mcpresume/caddy-mcp-resume/tests/harness"
)

// r50Piece is one upstream write, then a pause.
type r50Piece struct {
	b     string
	pause time.Duration
}

// r50Script is what call id's upstream writes, and the data of the events
// a client must get, in order.
func r50Script(id int) (pieces []r50Piece, want []string) {
	n := 0
	event := func(pad int) (string, string) {
		data := notice(fmt.Sprintf("e%d-%d:%s", id, n, strings.Repeat(string(rune('a'+n%26)), pad)))
		n++
		return fmt.Sprintf("id: u%d\ndata: %s\n\n", n, data), data
	}
	result := resultFor([]byte(strconv.Itoa(id)))
	res := "id: r\ndata: " + result + "\n\n"
	// split writes e in two at cut (clamped), with pause between.
	split := func(e string, cut int, pause time.Duration) {
		cut = max(1, min(cut, len(e)-1))
		pieces = append(pieces, r50Piece{e[:cut], pause}, r50Piece{e[cut:], 0})
	}
	switch id % 5 {
	case 0: // an event of about 3.9 KiB split in the middle, 3 ms apart; the result
		e, d := event(3800 + id%200)
		split(e, len(e)/2, 3*time.Millisecond)
		want = append(want, d)
		pieces = append(pieces, r50Piece{res, 0})
		want = append(want, result)
	case 1: // 300-byte events; the 13th (across the budget) split by a pause past the quiet timer
		for k := range 16 {
			e, d := event(300)
			if k == 12 {
				split(e, 100+id%150, 150*time.Millisecond)
			} else {
				pieces = append(pieces, r50Piece{e, 0})
			}
			want = append(want, d)
		}
		pieces = append(pieces, r50Piece{res, 0})
		want = append(want, result)
	case 2: // the result and two events after it in one write, then one of 4.5 KiB
		e1, d1 := event(10)
		e2, d2 := event(20)
		e3, d3 := event(4500)
		pieces = append(pieces, r50Piece{res + e1 + e2, 2 * time.Millisecond}, r50Piece{e3, 0})
		want = append(want, result, d1, d2, d3)
	case 3: // events that fill the budget to within a few bytes, the result split across writes
		for range 3 {
			e, d := event(1100 + id%40)
			pieces = append(pieces, r50Piece{e, time.Millisecond})
			want = append(want, d)
		}
		split(res, len(res)-3, 2*time.Millisecond)
		want = append(want, result)
	case 4: // one write holding a 4 KiB event cut just before its blank line, finished after the quiet timer
		e, d := event(4096 - 200)
		split(e, len(e)-1, 120*time.Millisecond)
		want = append(want, d)
		pieces = append(pieces, r50Piece{res, 0})
		want = append(want, result)
	}
	return pieces, want
}

func r50Tool(w http.ResponseWriter, r *http.Request, req *mcptest.Request) {
	id, _ := strconv.Atoi(string(req.ID))
	sseHeaders(w)
	rc := http.NewResponseController(w)
	pieces, _ := r50Script(id)
	for _, p := range pieces {
		w.Write([]byte(p.b))
		rc.Flush()
		if p.pause > 0 {
			time.Sleep(p.pause)
		}
	}
}

// Every call's events reach its client whole, once each, in order, with
// contiguous IDs, whichever way the upstream cuts them across writes,
// around the inline budget and the quiet timer.
func TestReview50SplitEventsAroundTheBudgetAndTheQuietTimer(t *testing.T) {
	harness.MemoryStoreOnly(t, "the tap writes to its client itself only with the memory store's ReadyReader")
	up := &mcptest.Upstream{Tools: map[string]mcptest.Tool{"split": r50Tool}}
	c := harness.StartCaddy(t, mcptest.ResumeRoute(harness.StartHandler(t, up), "keepalive 100ms"))
	cl := harness.NewSession(t, c.Base(), "2025-11-25")
	m0, err := c.Metrics()
	if err != nil {
		t.Fatal(err)
	}
	for i := range 20 {
		id := 500 + i
		resp := cl.Call(id, "split", nil)
		evs := harness.ReadEvents(t, resp, 0)
		resp.Body.Close()
		if _, err := harness.CheckIDs(evs); err != nil {
			t.Errorf("call %d: %v", id, err)
		}
		var got []string
		for _, ev := range evs {
			if strings.TrimSpace(ev.Data) != "" {
				got = append(got, ev.Data)
			}
		}
		_, want := r50Script(id)
		if strings.Join(got, "\n") != strings.Join(want, "\n") {
			t.Errorf("call %d (case %d): got %d events, want %d; first difference: %s", id, id%5, len(got), len(want), r50Diff(got, want))
		}
	}
	m1, err := c.Metrics()
	if err != nil {
		t.Fatal(err)
	}
	key := `caddy_mcp_resume_relays_total{writer="tap"}`
	t.Logf("relays by the tap: %v of 20", m1.Series[key]-m0.Series[key])
}

func r50Diff(got, want []string) string {
	for i := range max(len(got), len(want)) {
		var g, w string
		if i < len(got) {
			g = got[i]
		}
		if i < len(want) {
			w = want[i]
		}
		if g != w {
			return fmt.Sprintf("#%d got %q, want %q", i, trunc(g, 80), trunc(w, 80))
		}
	}
	return "none"
}

func trunc(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
