package resume

import (
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/mcpresume/caddy-mcp-resume/buffer"
	"github.com/mcpresume/caddy-mcp-resume/policy"
)

// deletedMidResume is a store whose sessions are deleted between a
// resume's look at the session and its look at the stream, as a DELETE on
// another connection can do: a shared store's stream records go with the
// session, so the stream is not found.
type deletedMidResume struct {
	buffer.Backend
	armed atomic.Bool
}

func (d *deletedMidResume) Session(id string) (buffer.Session, bool) {
	s, ok := d.Backend.Session(id)
	if !ok || !d.armed.Load() {
		return s, ok
	}
	return vanishing{Session: s, store: d}, true
}

type vanishing struct {
	buffer.Session
	store *deletedMidResume
}

func (v vanishing) Stream(uint32) (buffer.Stream, bool) {
	if v.store.armed.CompareAndSwap(true, false) {
		v.store.Backend.Delete(v.ID(), policy.ReasonDeleted)
	}
	return nil, false
}

// A resume that a DELETE overtakes between its look at the session and at
// the stream is answered as for the ended session (its tombstone), never
// as a cursor on a stream the session never had: 400 (CI caught
// TestDeleteRacingResumes getting 400 on the JetStream store).
func TestAResumeOvertakenByDeleteIsAnsweredAsEnded(t *testing.T) {
	t.Parallel()
	h := testHandler(t)
	sess := standaloneWithEvents(t, h)
	store := &deletedMidResume{Backend: h.rt.store}
	h.rt.store = store
	store.armed.Store(true)
	resp := resumeAs(t, relayServer(t, h, &upstream{}).URL, sess, "x")
	body, _ := io.ReadAll(resp.Body)
	if store.armed.Load() {
		t.Fatal("the resume never looked at the stream")
	}
	if resp.StatusCode == http.StatusBadRequest || strings.Contains(string(body), "secret") {
		t.Fatalf("status %d, body %q: want the ended session's answer", resp.StatusCode, body)
	}
	t.Logf("status %d, body %q", resp.StatusCode, body)
}
