package resume

import (
	"context"
	"testing"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/policy"
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

// The freshest credential a session's requests brought replaces an older
// one on what the proxy asks the upstream for the session, and is
// forgotten with the session.
func TestFreshestCredentialOfASession(t *testing.T) {
	t.Parallel()
	h := testHandler(t)
	sess := newSession(t, h, "2025-11-25")
	first := post("1") // Bearer x
	if got := h.rt.freshest.with(first, sess); got != first {
		t.Fatal("with nothing noted, the request changed")
	}
	h.rt.freshest.note(sess, first)
	later := post("2")
	later.Header.Set("Authorization", "Bearer y")
	h.rt.freshest.note(sess, later)
	got := h.rt.freshest.with(first, sess)
	if got == first || got.Header.Get("Authorization") != "Bearer y" || first.Header.Get("Authorization") != "Bearer x" {
		t.Fatalf("the older request's copy carries %q (the original %q), want Bearer y",
			got.Header.Get("Authorization"), first.Header.Get("Authorization"))
	}
	if h.rt.freshest.with(later, sess) != later {
		t.Fatal("a request with the freshest credential was copied")
	}
	h.rt.store.Delete(sess.ID(), policy.ReasonDeleted)
	deadline := time.Now().Add(5 * time.Second)
	for {
		h.rt.freshest.mu.Lock()
		_, kept := h.rt.freshest.m[sess.ID()]
		h.rt.freshest.mu.Unlock()
		if !kept {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the credential outlived its session")
		}
		time.Sleep(time.Millisecond)
	}
}
