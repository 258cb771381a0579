package resume

import (
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"

	"github.com/mcpresume/caddy-mcp-resume/buffer"
	"github.com/mcpresume/caddy-mcp-resume/policy"
)

// madeAgainMidRequest is a store whose session is deleted and made again,
// bound to another identity, between a request's authorization (its first
// look at the session) and the serving path's look: what a DELETE and a
// new initialize under the same session ID on other connections can do.
type madeAgainMidRequest struct {
	buffer.Backend
	looks atomic.Int32
	again func()
}

func (m *madeAgainMidRequest) Session(id string) (buffer.Session, bool) {
	if m.looks.Add(1) == 2 {
		m.again()
	}
	return m.Backend.Session(id)
}

// A request authorized against one incarnation of its session is
// authorized again when the serving path finds another: served on the new
// one with the old one's authorization, a client bound to neither would
// act on (and read) a log that is not its own.
func TestARequestIsAuthorizedAgainstTheIncarnationItIsServedOn(t *testing.T) {
	t.Parallel()
	h, as, first := review35Setup(t) // bound to X-User, made by alice
	store := &madeAgainMidRequest{Backend: h.rt.store}
	store.again = func() {
		h.rt.store.Delete("sess-1", policy.ReasonDeleted)
		if _, err := h.rt.store.CreateSession("sess-1", h.sessionMeta(as("mallory"), "2025-11-25", policy.Initialized)); err != nil {
			t.Error(err)
		}
	}
	h.rt.store = store
	up := &upstream{}
	rec := httptest.NewRecorder()
	if err := h.ServeHTTP(rec, as("alice"), up); err != nil {
		t.Fatal(err)
	}
	if store.looks.Load() < 2 {
		t.Fatalf("the session was looked at %d times: the test needs the serving path's look", store.looks.Load())
	}
	now, _ := h.rt.store.Session("sess-1")
	if now == nil || now.Epoch() == first.Epoch() {
		t.Fatal("the session was not made again")
	}
	if len(up.reqs) != 0 || rec.Code == http.StatusOK {
		t.Fatalf("alice's call on mallory's incarnation: status %d, %d upstream requests; want refused", rec.Code, len(up.reqs))
	}
	if n := now.NextStream(); n != 1 {
		t.Fatalf("the new incarnation numbers its next stream %d: alice's call was tapped into it", n)
	}
	t.Logf("status %d: %s", rec.Code, rec.Body)
}
