package resume

import (
	"net/http/httptest"
	"testing"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/buffer"
	"github.com/mcpresume/caddy-mcp-resume/policy"
)

// attack21: under a binding without the bearer (here a header), any
// Authorization of the session's identity is let through unchecked, and
// note() records it before the upstream answers. A token the upstream then
// refuses (401) becomes the session's "freshest": a later takeover's GET
// carries it instead of the good token the client still holds.
func TestARefusedCredentialIsNotTheFreshest(t *testing.T) {
	t.Parallel()
	cfg := Config{StallTimeout: 5 * time.Second, Keepalive: time.Second, BindHeaders: []string{"X-Client"}}
	cfg.SetDefaults()
	st := buffer.NewMemoryStore(buffer.Options{Limits: cfg.Limits(), Key: []byte("k")})
	t.Cleanup(st.Close)
	rt := NewRuntime(st)
	h, err := New(cfg, rt)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rt.Stop)
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
	if goOn, _ := h.authorize(httptest.NewRecorder(), bad, nil, "sess-1", policy.Call); !goOn {
		t.Skip("the proxy refused it itself: nothing to check")
	}
	// (the upstream answers bad with 401 here)
	get := httptest.NewRequest("GET", "/mcp", nil)
	get.Header.Set("Authorization", "Bearer good")
	if got := h.rt.freshest.with(get, sess).Header.Get("Authorization"); got != "Bearer good" {
		t.Fatalf("a takeover's GET would carry %q, a token no upstream answer vouched for, want the client's good one", got)
	}
}
