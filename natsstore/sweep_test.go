package natsstore

import (
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/buffer"
)

// The sweeper passes by an ended stream judged idle only while its record
// is unchanged and its floor's event is younger than the window as it is
// now.
func TestIdleEndedStreamsComeDueAgain(t *testing.T) {
	now := time.Unix(1000, 0)
	delivered := now.Add(-30 * time.Second).UnixNano()
	rec := &streamRecord{Floor: 3, Head: 4, Deliveries: []delivery{{Seq: 2, At: 1}, {Seq: 4, At: delivered}}}
	for _, c := range []struct {
		name   string
		rec    *streamRecord
		rev    uint64 // the record's revision at the sweep
		window time.Duration
		skip   bool
	}{
		{"unchanged, inside the window", rec, 7, time.Minute, true},
		{"written since", rec, 8, time.Minute, false},
		{"the window has passed", rec, 7, 30 * time.Second, false},
		{"the window was shortened", rec, 7, 10 * time.Second, false},
		{"nothing delivered: only a write lets it go", &streamRecord{Floor: 3, Head: 4}, 7, time.Nanosecond, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			var in idleEnded
			in.pass = 1
			in.note("k", 7, c.rec)
			in.pass = 2
			if got := in.skip(endedStream{key: "k", rev: c.rev}, now, c.window); got != c.skip {
				t.Fatalf("skip = %v, want %v", got, c.skip)
			}
			if got := in.skip(endedStream{key: "other", rev: 7}, now, c.window); got {
				t.Fatal("a stream never judged was passed by")
			}
			in.forget()
			if _, kept := in.by["k"]; kept != c.skip {
				t.Fatalf("entry kept %v after a sweep that passed it by: %v", kept, c.skip)
			}
		})
	}
	var in idleEnded
	in.note("k", 1, &streamRecord{Floor: 3, Head: 4})
	if r := in.by["k"]; r.delivered != math.MaxInt64 {
		t.Fatalf("delivered %d for a floor never delivered", r.delivered)
	}
}

// BenchmarkSweep: one op is one sweep of a session holding n ended calls,
// each delivered to its client and inside the resume window: what every
// call costs the sweeper each interval while its events are kept (a
// 2-minute window, a 500 ms interval: 240 sweeps). ns/stream is per call
// held, per sweep.
func BenchmarkSweep(b *testing.B) {
	for _, n := range []int{200, 1000} {
		b.Run(fmt.Sprintf("calls=%d", n), func(b *testing.B) {
			lim := testLimits()
			lim.ResumeWindow = 2 * time.Minute
			lim.MaxStreamsPerSession = n + 1
			lim.SessionIdleTimeout = time.Hour
			st := openEmbedded(b, lim, func(o *Options) { o.SweepInterval = time.Hour; o.LeaseTTL = time.Minute })
			sess, err := st.CreateSession("sweep", buffer.SessionMeta{Version: "2025-06-18"})
			if err != nil {
				b.Fatal(err)
			}
			for i := 0; i < n; i++ {
				shortCall(b, sess, fmt.Sprint(1000+i))
			}
			served := st.servedSessions()
			now := time.Now()
			st.sweep(now, served) // each stream judged once
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				st.sweep(now, served)
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(n), "ns/stream")
		})
	}
}
