package resume

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/mcpresume/caddy-mcp-resume/buffer"
	"github.com/mcpresume/caddy-mcp-resume/policy"
)

// review35Store runs on[n] at the store's n-th look at a session (1:
// authorizeSeen's, 2: the serving path's, 3: reauthorize's own).
type review35Store struct {
	buffer.Backend
	looks atomic.Int32
	on    map[int32]func()
}

func (m *review35Store) Session(id string) (buffer.Session, bool) {
	if f := m.on[m.looks.Add(1)]; f != nil {
		f()
	}
	return m.Backend.Session(id)
}

func review35Setup(t *testing.T) (h *Engine, as func(string) *http.Request, first buffer.Session) {
	h = testHandlerWith(t, Config{BindHeaders: []string{"X-User"}})
	as = func(user string) *http.Request {
		r := post("7")
		r.Header.Set("X-User", user)
		return r
	}
	first, err := h.rt.store.CreateSession("sess-1", h.sessionMeta(as("alice"), "2025-11-25", policy.Initialized))
	if err != nil {
		t.Fatal(err)
	}
	return h, as, first
}

// remadeAtSecondLook has h's store end session sess-1 (for reason) and
// make it again from r's credentials, with origin, at its second look at
// the session (the serving path's); it returns where the new incarnation
// will be.
func remadeAtSecondLook(h *Engine, r *http.Request, reason policy.Reason, origin policy.SessionOrigin) *buffer.Session {
	backend := h.rt.store
	var again buffer.Session
	store := &review35Store{Backend: backend}
	store.on = map[int32]func(){2: func() {
		backend.Delete("sess-1", reason)
		again, _ = backend.CreateSession("sess-1", h.sessionMeta(r, "2025-11-25", origin))
	}}
	h.rt.store = store
	return &again
}

// An epoch is a 12-bit random nonce plus a MAC of (key, sid, nonce): two
// incarnations of one session ID share their epoch once in 4096. Then
// reauthorize takes mallory's new incarnation for alice's old one and
// alice's call is tapped into mallory's session. (Fails on eca9670.)
func TestReview35EpochCollisionPassesReauthorize(t *testing.T) {
	t.Parallel()
	h, as, first := review35Setup(t)
	backend := h.rt.store
	var tries int
	var mallorys buffer.Session
	store := &review35Store{Backend: backend}
	store.on = map[int32]func(){2: func() {
		// made again, bound to mallory, until the new epoch is the old one's
		for tries = 1; tries <= 200000; tries++ {
			backend.Delete("sess-1", policy.ReasonDeleted)
			s, err := backend.CreateSession("sess-1", h.sessionMeta(as("mallory"), "2025-11-25", policy.Initialized))
			if err != nil {
				t.Error(err)
				return
			}
			if s.Epoch() == first.Epoch() {
				mallorys = s
				return
			}
		}
		t.Error("no epoch collision in 200000 incarnations")
	}}
	h.rt.store = store
	up := &upstream{steps: []func(http.ResponseWriter, *http.Request) error{
		sseStep("eof", result("u_1", "7"))}}
	rec := httptest.NewRecorder()
	if err := h.ServeHTTP(rec, as("alice"), up); err != nil {
		t.Logf("upstream: %v", err)
	}
	if mallorys == nil {
		t.Fatal("setup failed")
	}
	t.Logf("epoch %s again after %d incarnations; status %d, %d upstream requests, mallory's next stream %d",
		first.Epoch(), tries, rec.Code, len(up.reqs), mallorys.NextStream())
	if len(up.reqs) != 0 || mallorys.NextStream() != 1 {
		t.Fatal("alice's call went on against mallory's incarnation (same epoch, another session)")
	}
}

// A legitimate client whose own session was made again (an adoption of its
// own, bound to it) between the two looks goes on: no spurious refusal.
func TestReview35MadeAgainBySameClientGoesOn(t *testing.T) {
	t.Parallel()
	h, as, first := review35Setup(t)
	again := remadeAtSecondLook(h, as("alice"), policy.ReasonExpired, policy.Adopted)
	up := &upstream{}
	rec := httptest.NewRecorder()
	if err := h.ServeHTTP(rec, as("alice"), up); err != nil {
		t.Logf("upstream: %v", err)
	}
	if *again == nil || (*again).Epoch() == first.Epoch() {
		t.Fatal("the session was not made again, with an epoch of its own, between the two looks")
	}
	if len(up.reqs) == 0 || rec.Code == http.StatusForbidden {
		t.Fatalf("alice refused on her own new incarnation: status %d: %s", rec.Code, rec.Body)
	}
}

// DELETE: alice's DELETE of her old incarnation is refused when mallory's
// new one is found (the right answer: it would end mallory's session).
func TestReview35DeleteOfOldIncarnationRefused(t *testing.T) {
	t.Parallel()
	h, as, first := review35Setup(t)
	backend := h.rt.store
	mallorys := remadeAtSecondLook(h, as("mallory"), policy.ReasonDeleted, policy.Initialized)
	up := &upstream{}
	rec := httptest.NewRecorder()
	r := httptest.NewRequest("DELETE", "/mcp", nil)
	r.Header.Set(hdrSessionID, "sess-1")
	r.Header.Set("X-User", "alice")
	if err := h.ServeHTTP(rec, r, up); err != nil {
		t.Fatal(err)
	}
	if *mallorys == nil || (*mallorys).Epoch() == first.Epoch() {
		t.Fatal("the session was not made again, with an epoch of its own, between the two looks")
	}
	if _, ok := backend.Session("sess-1"); !ok || len(up.reqs) != 0 {
		t.Fatalf("alice's DELETE reached mallory's incarnation: status %d, %d upstream requests", rec.Code, len(up.reqs))
	}
}

// A POST for a session the proxy does not hold is let through unchecked
// and adopted once the upstream answers (tap.go, serveCall's start). If the
// session was created meanwhile (another request's adoption or
// initialize, bound to alice), CreateSession says ErrSessionExists and the
// call is tied to the session found then: mallory's call is tapped into
// alice's session, no authorization against it ever made. (Fails on
// eca9670: a second look with no reauthorize.)
func TestReview35AdoptionRaceTapsIntoAnotherIdentitysSession(t *testing.T) {
	t.Parallel()
	h := testHandlerWith(t, Config{BindHeaders: []string{"X-User"}})
	as := func(user string) *http.Request {
		r := post("7")
		r.Header.Set("X-User", user)
		return r
	}
	var alices buffer.Session
	up := &upstream{steps: []func(http.ResponseWriter, *http.Request) error{
		func(w http.ResponseWriter, r *http.Request) error {
			var err error
			alices, err = h.rt.store.CreateSession("sess-1", h.sessionMeta(as("alice"), "2025-11-25", policy.Adopted))
			if err != nil {
				t.Error(err)
			}
			return sseStep("eof", result("u_1", "7"))(w, r)
		}}}
	rec := httptest.NewRecorder()
	if err := h.ServeHTTP(rec, as("mallory"), up); err != nil {
		t.Logf("upstream: %v", err)
	}
	if alices == nil {
		t.Fatal("setup")
	}
	t.Logf("status %d; alice's next stream %d", rec.Code, alices.NextStream())
	if alices.NextStream() != 1 {
		t.Fatal("mallory's call was tapped into alice's session without an authorization against it")
	}
	if rec.Code != http.StatusOK || !strings.Contains(rec.Body.String(), `"result"`) {
		t.Fatalf("mallory's call, passed through: status %d, body %q; want the upstream's answer", rec.Code, rec.Body)
	}
}
