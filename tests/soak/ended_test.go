package soak

import (
	"testing"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/tests/harness"
)

// Ended streams leave their session (review item 6): a session that makes
// many short calls keeps the records of only the latest ended ones once
// their events are gone, so its memory, its admin view and the work per
// request stay bounded.
func TestEndedStreamsLeaveTheSession(t *testing.T) {
	_, c := harness.FloodProxy(t, 0, "resume_window 200ms")
	cl := harness.StreamSession(t, c)
	const calls = 1500
	for i := 1; i <= calls; i++ {
		s, err := cl.CallStream(i, "flood", harness.FloodArgs(1, 120), 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		var tr harness.Tracker
		if _, err := harness.Drain(cl, s, &tr, i, 10, 0); err != nil {
			t.Fatal(err)
		}
	}
	var held int
	harness.WaitFor(t, 10*time.Second, "ended streams to retire", func() bool {
		ss, err := c.Sessions()
		if err != nil || len(ss) != 1 {
			return false
		}
		held = len(ss[0].Streams)
		return held <= 64
	})
	t.Logf("%d calls: %d stream records held", calls, held)
}
