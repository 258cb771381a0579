package security

import (
	"net/http"
	"testing"

	"github.com/mcpresume/caddy-mcp-resume/internal/demoserver"
	"github.com/mcpresume/caddy-mcp-resume/internal/mcptest"
	"github.com/mcpresume/caddy-mcp-resume/tests/harness"
)

// Review 50. The proxy read an initialize's params.protocolVersion with
// encoding/json into a struct: member names matched case-insensitively,
// the last match winning, where the official SDK server reads them
// case-sensitively. An initialize whose params carried
// "protocolVersion":"2025-11-25" and then "ProtocolVersion":"1.0" was, for
// the proxy, a version it never taps, so serveInitialize skipped its guards
// (max_sessions, and the empty-identity refusal of
// TestAnEmptyIdentityBindsNoSession); for the SDK it was a 2025-11-25
// initialize, which it answered, and the proxy then registered the session
// from that answer, bound to the empty identity the guard exists to refuse.
// Now the proxy reads the member as the SDKs do and refuses both.
func TestReview50CaseVariantProtocolVersionSkipsTheEmptyIdentityGuard(t *testing.T) {
	upstream := harness.StartDemo(t, demoserver.Options{})
	caddy := harness.StartCaddy(t, mcptest.ResumeRoute(upstream, "bind {http.auth.user.id}"))
	alice := newClient(caddy.Base(), "2025-11-25", cred("Authorization", "Bearer alice"))
	for _, body := range []string{
		`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"a","version":"1"}}}`,
		`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","ProtocolVersion":"1.0","capabilities":{},"clientInfo":{"name":"a","version":"1"}}}`,
	} {
		x, err := harness.Finish(alice.Do(t.Context(), "POST", body, nil))
		if err != nil {
			t.Fatal(err)
		}
		// The guard, as TestAnEmptyIdentityBindsNoSession: no session.
		harness.RPCError(t, x, http.StatusInternalServerError)
		if sid := x.Header.Get("Mcp-Session-Id"); sid != "" {
			t.Fatalf("an initialize the guard refuses got session %s: %s", sid, body)
		}
	}
}
