package resume

import (
	"net/http"
	"net/http/httptest"
	"os/exec"
	"strings"
	"testing"

	"github.com/mcpresume/caddy-mcp-resume/policy"
)

// The engine is usable without Caddy: nothing of Caddy (nor of NATS) is
// linked into it.
func TestEngineImportsNoCaddy(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").Output()
	if err != nil {
		t.Skipf("go list: %v", err)
	}
	for _, dep := range strings.Fields(string(out)) {
		if strings.Contains(dep, "caddyserver") || strings.Contains(dep, "nats-io") {
			t.Errorf("package resume depends on %s", dep)
		}
	}
}

// Without Caddy's replacer, bind resolves {http.request.header.X} as Caddy
// does (values joined with ",") and every other placeholder to "".
func TestHeaderPlaceholders(t *testing.T) {
	r := httptest.NewRequest("GET", "/mcp", nil)
	r.Header.Add("X-Tenant", "a")
	r.Header.Add("X-Tenant", "b")
	r.Header.Set("X-User", "u1")
	for in, want := range map[string]string{
		"{http.request.header.X-User}":                            "u1",
		"tenant-{http.request.header.X-Tenant}":                   "tenant-a,b",
		"{http.auth.user.id}":                                     "",
		"{http.request.header.X-User}/{http.request.header.Nope}": "u1/",
		"no placeholder":                                          "no placeholder",
		"{unclosed":                                               "{unclosed",
	} {
		if got := HeaderPlaceholders(r, in); got != want {
			t.Errorf("%q: %q, want %q", in, got, want)
		}
	}
}

// bind with header placeholders works without Caddy: a session bound to
// X-User refuses a request of another user (403, from the refusals table)
// and lets its own through.
func TestBindHeaderPlaceholderWithoutCaddy(t *testing.T) {
	h := testHandler(t)
	h.Bind = []string{"{http.request.header.X-User}"}
	init := post("0")
	init.Header.Set("X-User", "alice")
	if _, err := h.rt.store.CreateSession("sess-1", h.sessionMeta(init, "2025-11-25", policy.Initialized)); err != nil {
		t.Fatal(err)
	}
	for user, want := range map[string]int{"mallory": http.StatusForbidden, "alice": http.StatusTeapot} {
		r := httptest.NewRequest("DELETE", "/mcp", nil)
		r.Header.Set(hdrSessionID, "sess-1")
		r.Header.Set("X-User", user)
		up := &upstream{steps: []func(http.ResponseWriter, *http.Request) error{statusStep(http.StatusTeapot)}}
		w := serve(t, h, up, r)
		if w.Code != want {
			t.Errorf("%s: %d %s, want %d", user, w.Code, w.Body, want)
		}
		if want == http.StatusForbidden && !strings.Contains(w.Body.String(), "mcp-resume: credentials differ from the session's") {
			t.Errorf("%s: body %s", user, w.Body)
		}
	}
}
