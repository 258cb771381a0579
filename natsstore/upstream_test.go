package natsstore

import (
	"context"
	"testing"

	"github.com/mcpresume/caddy-mcp-resume/buffer"
)

// The batches of a stream carry the upstream cursor the tap gave with
// NextUpstream: a replica that crashes before it records one leaves the
// next producer the exact cursor of what it stored. A cursor recorded for
// the same stored head (a graceful stop) wins: it may be later still.
func TestUpstreamCursorSurvivesACrash(t *testing.T) {
	a, b := replicas(t)
	sa, err := a.CreateSession("s1", buffer.SessionMeta{Version: "2025-11-25"})
	if err != nil {
		t.Fatal(err)
	}
	str := sa.Standalone().(*stream)
	claim(t, str)
	for i, id := range []string{"u1", "", "u3"} {
		if id != "" {
			str.NextUpstream(id)
		}
		if _, err := str.Append(context.Background(), []byte("data: x\n"), nil); err != nil {
			t.Fatalf("append %d: %v", i, err)
		}
	}
	if got := str.WaitStored(); got != 3 {
		t.Fatalf("stored up to %d", got)
	}
	crash(a)
	sb := sessionOn(t, b, "s1")
	if got := sb.Standalone().UpstreamCursor(); got != "u3" {
		t.Fatalf("cursor after the producer crashed = %q, want u3", got)
	}
	sb.Standalone().SetUpstreamCursor("u4") // a priming event after u3, recorded at a stop
	if got := sb.Standalone().UpstreamCursor(); got != "u4" {
		t.Fatalf("cursor recorded at head 3 = %q, want u4", got)
	}
}
