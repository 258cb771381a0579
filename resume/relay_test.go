package resume

import (
	"context"
	"testing"
	"time"
)

// A relay whose reader keeps finding the producer gone tries a takeover at
// once, then with pauses that double up to takeoverPauseMax; events that
// flow again start it afresh; a client gone during a pause ends it.
func TestTakeoverAttemptsArePaced(t *testing.T) {
	t.Parallel()
	rl := &relay{}
	ctx := context.Background()
	var pauses []time.Duration
	last := time.Now()
	for range 4 {
		if !rl.paceTakeover(ctx) {
			t.Fatal("paced with the client there: false")
		}
		pauses = append(pauses, time.Since(last))
		last = time.Now()
	}
	if pauses[0] > 50*time.Millisecond {
		t.Errorf("first attempt waited %v", pauses[0])
	}
	for i, want := range []time.Duration{100, 200, 400} {
		if got := pauses[i+1]; got < want*time.Millisecond {
			t.Errorf("attempt %d after %v, want at least %vms", i+2, got, want)
		}
	}
	rl.takeoverPause = takeoverPauseMax * 4
	rl.tookOverAt = time.Now()
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	if rl.paceTakeover(cancelled) {
		t.Error("a pause with the client gone went on")
	}
	rl.tookOverAt = time.Time{} // what a delivered batch does
	begun := time.Now()
	if !rl.paceTakeover(ctx) || time.Since(begun) > 50*time.Millisecond || rl.takeoverPause != takeoverPauseMin {
		t.Errorf("after events flowed: waited %v, next pause %v", time.Since(begun), rl.takeoverPause)
	}
}
