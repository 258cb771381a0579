package resume

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/mcpresume/caddy-mcp-resume/policy"
)

// attack21: under a binding without the bearer (here a header), any
// Authorization of the session's identity is let through unchecked, and
// note() records it before the upstream answers. A token the upstream then
// refuses (401) becomes the session's "freshest": a later takeover's GET
// carries it instead of the good token the client still holds.
func TestARefusedCredentialIsNotTheFreshest(t *testing.T) {
	t.Parallel()
	h := testHandlerWith(t, Config{BindHeaders: []string{"X-Client"}})
	good := post("1")
	good.Header.Set("X-Client", "alice")
	good.Header.Set("Authorization", "Bearer good")
	sess, err := h.rt.store.CreateSession("sess-1", h.sessionMeta(good, "2025-11-25", policy.Initialized))
	if err != nil {
		t.Fatal(err)
	}
	if goOn, err := h.authorize(httptest.NewRecorder(), good, nil, "sess-1", policy.Call); !goOn || err != nil {
		t.Fatalf("the session's own request: goOn %v, err %v", goOn, err)
	}
	// The same identity with a token the upstream will refuse (expired,
	// revoked, or a guess): the proxy lets it through, the upstream says 401.
	bad := post("2")
	bad.Header.Set("X-Client", "alice")
	bad.Header.Set("Authorization", "Bearer refused-by-upstream")
	// Under a header binding the proxy judges no token: it must let it
	// through, or the case below is never tried.
	if goOn, _ := h.authorize(httptest.NewRecorder(), bad, nil, "sess-1", policy.Call); !goOn {
		t.Fatal("the proxy refused a token under a binding that does not include it")
	}
	// (the upstream answers bad with 401 here)
	get := httptest.NewRequest("GET", "/mcp", nil)
	get.Header.Set("Authorization", "Bearer good")
	if got := h.rt.freshest.with(get, sess).Header.Get("Authorization"); got != "Bearer good" {
		t.Fatalf("a takeover's GET would carry %q, a token no upstream answer vouched for, want the client's good one", got)
	}
}

// A credential the upstream refused on a GET the proxy made for the
// session (a takeover's) is not answered from the log any more, even the
// bound one: the client's next request gets the upstream's own 401 (what
// makes it refresh). Once the upstream accepts it again the refusal is
// forgotten.
func TestARefusedCredentialGetsTheUpstreamsVerdict(t *testing.T) {
	t.Parallel()
	h := testHandlerWith(t, Config{Bind: []string{BindBearer}})
	bound := post("1")
	bound.Header.Set("Authorization", "Bearer expired")
	sess, err := h.rt.store.CreateSession("sess-1", h.sessionMeta(bound, "2025-11-25", policy.Initialized))
	if err != nil {
		t.Fatal(err)
	}
	resume := httptest.NewRequest("GET", "/mcp", nil)
	resume.Header.Set("Authorization", "Bearer expired")
	resume.Header.Set("Last-Event-ID", "x")
	status := http.StatusUnauthorized
	upstream := NextHandler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer expired" {
			t.Errorf("the check carried %q, not the request's credential", r.Header.Get("Authorization"))
		}
		w.Header().Set("WWW-Authenticate", `Bearer error="invalid_token"`)
		w.WriteHeader(status)
	}))
	if goOn, _ := h.authorize(httptest.NewRecorder(), resume, upstream, "sess-1", policy.ReadsLog); !goOn {
		t.Fatal("the bound token, before any refusal: refused")
	}
	h.rt.freshest.refuse(sess, h.credentialHash(resume))
	w := httptest.NewRecorder()
	if goOn, _ := h.authorize(w, resume, upstream, "sess-1", policy.ReadsLog); goOn || w.Code != http.StatusUnauthorized ||
		w.Header().Get("WWW-Authenticate") == "" {
		t.Fatalf("the refused token: goOn %v, status %d, WWW-Authenticate %q; want the upstream's 401", goOn, w.Code, w.Header().Get("WWW-Authenticate"))
	}
	other := httptest.NewRequest("GET", "/mcp", nil)
	other.Header.Set("Authorization", "Bearer fresh")
	if !h.takeoverRefused(resume, sess) || !h.takeoverRefused(other, sess) {
		t.Fatal("a takeover would carry the session's freshest credential, refused: it does not count as refused")
	}
	h.rt.freshest.note(sess, other) // the client refreshed (the upstream vouched for it)
	if h.takeoverRefused(resume, sess) {
		t.Fatal("a takeover carries the refreshed credential, yet counts as refused")
	}
	h.rt.freshest.note(sess, resume)
	status = http.StatusOK
	if goOn, _ := h.authorize(httptest.NewRecorder(), resume, upstream, "sess-1", policy.ReadsLog); !goOn {
		t.Fatal("the upstream accepts it again: still refused")
	}
	if h.rt.freshest.hasRefusals("sess-1") {
		t.Fatal("the refusal is remembered after the upstream accepted the credential")
	}
}
