package soak

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/buffer"
	"github.com/mcpresume/caddy-mcp-resume/internal/demoserver"
	"github.com/mcpresume/caddy-mcp-resume/internal/mcptest"
	"github.com/mcpresume/caddy-mcp-resume/tests/harness"
)

// A short soak: several sessions on the official-SDK demo server make tool
// calls (count, up to 800 progress notifications) through Caddy over raw
// HTTP, while the test randomly drops their connections (clean close or
// reset), pauses reading, and resumes with GET Last-Event-ID from the last
// event seen. Bounds are small enough that backpressure engages. At the end
// every stream must have been delivered with 0 lost and 0 duplicated events
// (the delivered seq list checked against the stream's head in the admin
// API), and no event may have been evicted before it was acknowledged.
func TestSoakDisconnectResume(t *testing.T) {
	const (
		sessions = 6
		soakFor  = 40 * time.Second
	)
	upstream := harness.StartDemo(t, demoserver.Options{})
	c := harness.StartCaddy(t, mcptest.ResumeRoute(upstream, `
			max_stream_bytes 64KiB
			max_session_bytes 256KiB
			max_total_bytes 16MiB
			resume_window 3s
			stall_timeout 30s`))
	versions := []string{"2025-11-25", "2025-06-18", "2025-03-26"}

	type callRecord struct {
		stream    uint32
		n         int
		delivered int    // events with data delivered (progress + response)
		seqSum    uint64 // digest of the delivered seqs
		resumes   int
	}
	type sessStats struct {
		sid     string
		calls   []callRecord
		cuts    int
		resets  int
		pauses  int
		err     error
		version string
	}
	stats := make([]*sessStats, sessions)
	deadline := time.Now().Add(soakFor)
	var wg sync.WaitGroup
	for i := range stats {
		st := &sessStats{version: versions[i%len(versions)]}
		stats[i] = st
		wg.Add(1)
		go func(seed uint64) {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(seed, 4))
			cl := harness.NewStreamClient(c.Base(), st.version)
			defer cl.Close()
			if st.err = cl.Init(); st.err != nil {
				return
			}
			st.sid = cl.SessionID
			for id := 1; time.Now().Before(deadline); id++ {
				n := 20 + rng.IntN(781)
				interval := []int{0, 0, 1, 2}[rng.IntN(4)]
				s, err := cl.CallStream(id, "count", map[string]any{"n": n, "interval_ms": interval}, 20*time.Second)
				if err != nil {
					st.err = err
					return
				}
				// Where to drop the connection or pause reading, in events.
				var cutAt, pauseAt []int
				for k := rng.IntN(4); k > 0; k-- {
					cutAt = append(cutAt, 1+rng.IntN(n))
				}
				if rng.IntN(3) == 0 {
					pauseAt = append(pauseAt, rng.IntN(n))
				}
				tr := &harness.Tracker{}
				rec := callRecord{n: n}
				seen := 0 // events taken on this call, any connection
				for !tr.Done {
					ev, err := s.Next()
					if err != nil {
						s.Close()
						st.err = fmt.Errorf("session %s (%s) call %d: after %d events, last %s: %w", cl.SessionID, st.version, id, tr.Events, tr.LastID, err)
						return
					}
					if err := tr.Take(ev, id); err != nil {
						s.Close()
						st.err = fmt.Errorf("session %s (%s) call %d: %w", cl.SessionID, st.version, id, err)
						return
					}
					if ev.Data != "" {
						rec.delivered++
						if id, err := tr.Position(ev.ID); err == nil {
							rec.seqSum += id.Seq
						}
					}
					seen++
					for _, p := range pauseAt {
						if p == seen && !tr.Done {
							st.pauses++
							time.Sleep(time.Duration(200+rng.IntN(800)) * time.Millisecond) // the load: a reader that pauses
						}
					}
					for _, k := range cutAt {
						if k != seen || tr.Done || tr.LastID == "" {
							continue
						}
						if rng.IntN(2) == 0 {
							st.resets++
							cl.CT.Cut(true)
						}
						s.Close()
						st.cuts++
						time.Sleep(time.Duration(rng.IntN(300)) * time.Millisecond) // the load: a client away a while before it resumes
						if s, err = cl.ResumeStream(tr.LastID, 20*time.Second); err != nil {
							st.err = fmt.Errorf("session %s (%s) call %d: resume from %s: %w", cl.SessionID, st.version, id, tr.LastID, err)
							return
						}
						rec.resumes++
					}
				}
				s.Close()
				rec.stream = tr.Stream
				if len(tr.Gaps) > 0 || tr.ErrorMsg != "" || tr.Progress != n || tr.LastSeq != uint64(n+1) {
					st.err = fmt.Errorf("session %s (%s) call %d: progress %d of %d, last seq %d, gaps %v, error %q",
						cl.SessionID, st.version, id, tr.Progress, n, tr.LastSeq, tr.Gaps, tr.ErrorMsg)
					return
				}
				st.calls = append(st.calls, rec)
			}
		}(uint64(i + 1))
	}
	wg.Wait()

	var calls, events, lost, dup, cuts, resets, pauses, resumes int
	// A shared store records a stream's end once its last batch is stored,
	// a moment after the client read it: wait for every stream to say so.
	var infos []buffer.SessionInfo
	harness.WaitFor(t, 10*time.Second, "every call's stream to be complete", func() bool {
		var err error
		if infos, err = c.Sessions(); err != nil {
			return false
		}
		for _, se := range infos {
			for _, s := range se.Streams {
				if s.Kind == "request" && s.State == "live" {
					return false
				}
			}
		}
		return true
	})
	heads := map[string]map[uint32]uint64{}
	states := map[string]map[uint32]string{}
	for _, se := range infos {
		heads[se.ID], states[se.ID] = map[uint32]uint64{}, map[uint32]string{}
		for _, s := range se.Streams {
			heads[se.ID][s.Num] = s.Head
			states[se.ID][s.Num] = s.State
		}
	}
	for _, st := range stats {
		if st.err != nil {
			t.Error(st.err)
		}
		cuts += st.cuts
		resets += st.resets
		pauses += st.pauses
		for _, rec := range st.calls {
			calls++
			resumes += rec.resumes
			events += rec.delivered
			produced, ok := heads[st.sid][rec.stream]
			if !ok {
				t.Errorf("session %s: stream %d not in the admin API", st.sid, rec.stream)
				continue
			}
			if produced != uint64(rec.n+1) {
				t.Errorf("session %s stream %d: head %d, want %d", st.sid, rec.stream, produced, rec.n+1)
			}
			if s := states[st.sid][rec.stream]; s != "complete" {
				t.Errorf("session %s stream %d: state %q", st.sid, rec.stream, s)
			}
			want := produced * (produced + 1) / 2
			switch {
			case uint64(rec.delivered) < produced:
				lost += int(produced) - rec.delivered
			case uint64(rec.delivered) > produced:
				dup += rec.delivered - int(produced)
			}
			if rec.seqSum != want {
				t.Errorf("session %s stream %d: seq digest %d, want %d", st.sid, rec.stream, rec.seqSum, want)
			}
		}
	}
	t.Logf("soak %v: %d sessions, %d calls, %d events delivered; %d connection drops (%d resets), %d reading pauses, %d resumes; lost %d, duplicated %d",
		soakFor, sessions, calls, events, cuts, resets, pauses, resumes, lost, dup)
	if lost != 0 || dup != 0 {
		t.Errorf("lost %d, duplicated %d events", lost, dup)
	}
	if calls < sessions || resumes == 0 {
		t.Errorf("the soak did too little: %d calls, %d resumes", calls, resumes)
	}
	m, err := c.Metrics()
	if err != nil {
		t.Fatal(err)
	}
	stalls, _ := m.Sum("caddy_mcp_resume_backpressure_stalls_total")
	fromEvicted, _ := m.Sum("caddy_mcp_resume_resumes_from_evicted_total")
	evictedEarly, ok := m.Sum(harness.EvictedBeforeAck)
	t.Logf("metrics: backpressure_stalls_total %v, resumes_from_evicted_total %v, events_evicted_before_ack_total %v (exposed %v)", stalls, fromEvicted, evictedEarly, ok)
	if fromEvicted != 0 {
		t.Errorf("resumes_from_evicted_total = %v: a resume within resume_window hit a gap", fromEvicted)
	}
	harness.AssertNoEarlyEviction(t, c)
}
