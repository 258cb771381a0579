package buffer_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/buffer"
	"github.com/mcpresume/caddy-mcp-resume/buffer/storetest"
	"github.com/mcpresume/caddy-mcp-resume/policy"
)

// Review 51. A config reload that shortens resume_window (SetLimits) while
// a sweep is under way: SetLimits zeroed every stream's sweepAt, but the
// sweep in progress had read the limits at its start and, for every
// session it visited after the reload, stored sweepAt = delivery + the OLD
// window over the zero, so the sweeper passed those streams by until the
// old window was over (and a producer blocked on max_session_bytes failed
// stalled where the next sweep used to free its room). Now each stream
// keeps the delivery time alone (evictFrom) and every sweep judges it with
// its own window.
//
// The reload is placed inside a sweep deterministically through the
// store's own SessionEnded hook, which the sweeper calls synchronously
// when it expires an idle session (memory.go Delete): the hook does what
// Caddy's reload does from another goroutine (caddymodule/zone.go
// loadZone -> st.SetLimits). Which session the sweep visits first is Go's
// map order, so each attempt has several idle sessions and the attempts
// are repeated: in every attempt where an idle session comes before the
// one under test (all but about 1 in 5), the events outlive the new
// window.
func TestReview51ReloadDuringSweepKeepsTheOldWindow(t *testing.T) {
	const attempts = 20
	stale := 0
	for a := 0; a < attempts; a++ {
		if review51ReloadDuringSweep(t, a) {
			stale++
		}
	}
	if stale > 0 {
		t.Fatalf("in %d of %d attempts, events delivered 11 min ago stayed retained a sweep after "+
			"resume_window was cut from 1h to 1m by a reload during a sweep: the sweeper set the stream aside "+
			"until the old window ends", stale, attempts)
	}
}

// review51ReloadDuringSweep reports whether the stream under test kept its
// delivered events past the shortened window.
func review51ReloadDuringSweep(t *testing.T, attempt int) bool {
	lim := storetest.BigLimits()
	lim.ResumeWindow = time.Hour
	lim.SessionIdleTimeout = 10 * time.Minute
	var st *buffer.MemoryStore
	reloaded := false
	st, clk := newStore(t, buffer.Options{Limits: lim, Hooks: buffer.Hooks{
		SessionEnded: func(_ string, r policy.Reason) {
			if r != policy.ReasonExpired || reloaded {
				return
			}
			reloaded = true
			l := st.Limits()
			l.ResumeWindow = time.Minute // the reload: a window of a minute
			st.SetLimits(l)
		},
	}})
	defer st.Close()
	for i := 0; i < 4; i++ {
		storetest.MustSession(t, st, fmt.Sprintf("idle-%d-%d", attempt, i))
	}
	sess := storetest.MustSession(t, st, fmt.Sprintf("kept-%d", attempt))
	str := storetest.MustStream(t, sess)
	storetest.AppendN(t, str, 2, evSize)
	r, err := str.Attach(1)
	if err != nil {
		t.Fatal(err)
	}
	b, err := r.Read(context.Background(), nil, 1<<20, time.Second)
	if err != nil || b.Last != 2 {
		t.Fatalf("read %d..%d: %v", b.First, b.Last, err)
	}
	r.Delivered(b.Last) // delivered at t0
	r.Close()
	str.Complete()
	st.Sweep() // judged by the hour: set aside until t0+1h

	clk.Advance(11 * time.Minute)
	sess.Touch() // the session under test is active, the others idle
	st.Sweep()   // expires the idle sessions; the reload lands in it
	if !reloaded {
		t.Fatal("no idle session expired: the reload never happened")
	}
	clk.Advance(time.Second)
	st.Sweep() // the window is a minute; the events were delivered 11 minutes ago
	if f := str.View().Floor; f != 3 {
		t.Logf("attempt %d: floor %d, retained %d bytes, after a sweep 11 min after delivery with a 1 min window",
			attempt, f, buffer.StreamBytes(str))
		return true
	}
	return false
}

// The same fault as a producer sees it. An operator cuts resume_window to
// release memory a session's delivered calls hold; the reload lands in a
// sweep (as above). Another call of the session, blocked on
// max_session_bytes with no client reading it, must get the room at the
// next sweep (it did before 0e32c75: the next sweep evicted the ended
// call with the new window and released its bytes). Instead the ended
// call is set aside until the old window ends, the producer stays blocked,
// and at stall_timeout its stream fails as stalled.
func TestReview51ReloadDuringSweepStallsAProducer(t *testing.T) {
	const attempts = 10
	failed := 0
	for a := 0; a < attempts; a++ {
		if review51StallAfterReload(t, a) {
			failed++
		}
	}
	if failed > 0 {
		t.Fatalf("in %d of %d attempts a producer blocked on max_session_bytes failed with stall_timeout "+
			"although the shortened window released the session's room at the sweep after the reload", failed, attempts)
	}
}

func review51StallAfterReload(t *testing.T, attempt int) (stalled bool) {
	lim := storetest.BigLimits()
	lim.ResumeWindow = time.Hour
	lim.SessionIdleTimeout = 10 * time.Minute
	lim.MaxSessionBytes = 3 * evBytes
	lim.StallTimeout = 5 * time.Minute
	var st *buffer.MemoryStore
	reloaded := false
	st, clk := newStore(t, buffer.Options{Limits: lim, Hooks: buffer.Hooks{
		SessionEnded: func(_ string, r policy.Reason) {
			if r != policy.ReasonExpired || reloaded {
				return
			}
			reloaded = true
			l := st.Limits()
			l.ResumeWindow = time.Minute
			st.SetLimits(l)
		},
	}})
	defer st.Close()
	for i := 0; i < 4; i++ {
		storetest.MustSession(t, st, fmt.Sprintf("idle-%d-%d", attempt, i))
	}
	sess := storetest.MustSession(t, st, fmt.Sprintf("busy-%d", attempt))
	done := storetest.MustStream(t, sess, "1") // a call whose client got everything
	storetest.AppendN(t, done, 2, evSize)
	r, err := done.Attach(1)
	if err != nil {
		t.Fatal(err)
	}
	b, err := r.Read(context.Background(), nil, 1<<20, time.Second)
	if err != nil || b.Last != 2 {
		t.Fatalf("read %d..%d: %v", b.First, b.Last, err)
	}
	r.Delivered(b.Last)
	r.Close()
	done.Complete()
	busy := storetest.MustStream(t, sess, "2") // a call whose client is away
	storetest.AppendN(t, busy, 1, evSize)
	st.Sweep()

	clk.Advance(11 * time.Minute)
	sess.Touch()
	blocked := storetest.AsyncAppend(busy, storetest.Payload(2, evSize))
	storetest.WaitFor(t, "the append to block on the session's bytes", func() bool { return st.Stats().StalledStreams == 1 })
	st.Sweep() // the idle sessions expire; the reload (window 1m) lands in it
	if !reloaded {
		t.Fatal("the reload never happened")
	}
	clk.Advance(time.Second)
	st.Sweep() // must evict the ended call: delivered 11 min ago, window 1 min
	clk.Advance(lim.StallTimeout)
	var res storetest.AppendResult
	for waited := false; !waited; {
		st.Wake() // again until it decides on the moved clock
		select {
		case res = <-blocked:
			waited = true
		case <-time.After(10 * time.Millisecond):
		}
	}
	var fe *buffer.FailedError
	if errors.As(res.Err, &fe) && fe.Reason == policy.ReasonStalled {
		t.Logf("attempt %d: the blocked call failed as stalled; the ended call still holds %d bytes",
			attempt, buffer.StreamBytes(done))
		return true
	}
	if res.Err != nil || res.Seq != 2 {
		t.Fatalf("attempt %d: append = %d, %v", attempt, res.Seq, res.Err)
	}
	return false
}
