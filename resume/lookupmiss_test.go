package resume

import (
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/buffer"
	"github.com/mcpresume/caddy-mcp-resume/internal/eventid"
	"github.com/mcpresume/caddy-mcp-resume/policy"
)

// firstLooksMiss is a store whose first looks at a session find nothing,
// as a shared store's reads that failed (or another replica's creation not
// yet visible) do; the adoption's own look then finds it.
type firstLooksMiss struct {
	buffer.Backend
	misses atomic.Int32
}

func (f *firstLooksMiss) Session(id string) (buffer.Session, bool) {
	if f.misses.Add(-1) >= 0 {
		return nil, false
	}
	return f.Backend.Session(id)
}

// A resume of the standalone stream whose first look missed the session
// is answered as the resume it is once the session is found: exactly what
// the client missed, no gap, no 503. (A CI run caught a replica answering
// 503 "the session's standalone stream is unavailable" here: it took the
// session for one to adopt, then attached the client at event 1 of a
// stream acknowledged past it; the Go SDK client gave the session up.)
func TestAResumeWhoseFirstLookMissedIsStillAResume(t *testing.T) {
	t.Parallel()
	h := testHandler(t)
	sess := standaloneWithEvents(t, h)
	// The client was sent and acknowledged 1 and 2 (its earlier resume).
	if _, rd, err := sess.Standalone().Resume(2, func(policy.StreamView) policy.Resume { return policy.Resume{Kind: policy.Noop} }); err != nil {
		t.Fatal(err)
	} else if rd != nil {
		rd.Close()
	}
	// The request's authorization looks, then serveGet: both miss.
	miss := &firstLooksMiss{Backend: h.rt.store}
	miss.misses.Store(2)
	h.rt.store = miss

	srv := relayServer(t, h, &upstream{steps: []func(http.ResponseWriter, *http.Request) error{sseStep("hang")}})
	resp := resumeReqAs(t, srv.URL, string(eventid.Append(nil, sess.Epoch(), policy.StandaloneNum, 2)), "x", 10*time.Second)
	defer h.rt.Stop() // ends the standalone tap, which outlives its client
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d, want the stream", resp.StatusCode)
	}
	evs, _ := readSSE(t, resp.Body, 1)
	want := string(eventid.Append(nil, sess.Epoch(), policy.StandaloneNum, 3))
	if len(evs) != 1 || evs[0].ID != want || strings.Contains(evs[0].Data, "gap") {
		t.Fatalf("the client got %+v, want event %s alone", evs, want)
	}
}
