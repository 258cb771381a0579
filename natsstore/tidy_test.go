package natsstore

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/mcpresume/caddy-mcp-resume/buffer"
	"github.com/mcpresume/caddy-mcp-resume/policy"
)

// The tidy removes the delete markers of ended sessions and retired
// streams as they come due, a few each sweep, without reading the buckets
// (issue 23: PurgeDeletes over every bucket once a minute cost seconds of
// CPU at once); a key written again after its deletion keeps its value;
// released leases leave no marker at all.
func TestTidyRemovesMarkersAsTheyComeDue(t *testing.T) {
	old := tidyAge
	tidyAge = 300 * time.Millisecond
	t.Cleanup(func() { tidyAge = old })
	lim := testLimits()
	lim.ResumeWindow = 100 * time.Millisecond
	st := openEmbedded(t, lim, func(o *Options) { o.SweepInterval = 20 * time.Millisecond })
	ctx := context.Background()

	sess, err := st.CreateSession("gone", buffer.SessionMeta{Version: "2025-06-18"})
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 5; i++ {
		shortCall(t, sess, string(rune('1'+i)))
	}
	st.Delete("gone", policy.ReasonDeleted)
	// A session deleted and created again under the same ID: its record's
	// key has a marker below the new value.
	if _, err := st.CreateSession("again", buffer.SessionMeta{}); err != nil {
		t.Fatal(err)
	}
	st.Delete("again", policy.ReasonDeleted)
	if _, err := st.CreateSession("again", buffer.SessionMeta{}); err != nil {
		t.Fatal(err)
	}

	// What a bucket holds, by key: its values and markers.
	held := func(bucket string) map[string]uint64 {
		s, err := st.js.Stream(ctx, "KV_"+bucket)
		if err != nil {
			t.Fatal(err)
		}
		info, err := s.Info(ctx, jetstream.WithSubjectFilter(">"))
		if err != nil {
			t.Fatal(err)
		}
		out := make(map[string]uint64)
		for subj, n := range info.State.Subjects {
			if k := strings.TrimPrefix(subj, "$KV."+bucket+"."); k != probeKey {
				out[k] = n
			}
		}
		return out
	}
	waitUntil(t, "the markers to go", 10*time.Second, func() bool {
		return len(held(st.names.streams)) == 1 && len(held(st.names.sessions)) == 1 && len(held(st.names.leases)) == 0
	})
	// What is left is the live session and its standalone stream.
	if s, ok := st.Session("again"); !ok {
		t.Fatal("the session created again is gone")
	} else if _, _, ok := st.streams.get(streamKey(sessionToken("again"), s.Epoch(), policy.StandaloneNum)); !ok {
		t.Fatal("its standalone stream's record is gone")
	}
	if _, err := st.sessions.kv.Get(ctx, sessionToken("again")); err != nil {
		t.Fatalf("the session created again, in KV: %v", err)
	}
	if n := len(held(st.names.tombs)); n != 1 {
		t.Fatalf("%d tombstones in KV, want 1 (the session gone for good)", n)
	}
}
