package security

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/internal/demoserver"
	"github.com/mcpresume/caddy-mcp-resume/internal/mcptest"
	"github.com/mcpresume/caddy-mcp-resume/tests/harness"
)

// TestCredentialBinding: a session is bound at initialize. Another
// credential holding a valid Last-Event-ID and the session's Mcp-Session-Id
// gets 403 with a JSON-RPC error body and not one byte of the session's
// events, for GET (resume and standalone), POST (requests and
// notifications) and DELETE; the session survives all of it. Run with the
// default binding (bearer: the demo upstream accepts any token, but these
// are opaque, so the proxy cannot tell they name alice and refuses them
// after asking the upstream) and with bind_headers X-Api-Key (a fixed
// identity, refused without asking).
func TestCredentialBinding(t *testing.T) {
	for _, tc := range []struct {
		name, options, header string
	}{
		{"default Authorization", "", "Authorization"},
		{"bind_headers X-Api-Key", "bind_headers X-Api-Key", "X-Api-Key"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			upstream := harness.StartDemo(t, demoserver.Options{})
			caddy := harness.StartCaddy(t, mcptest.ResumeRoute(upstream, tc.options))
			testCredentialBinding(t, caddy, tc.header)
		})
	}
}

func cred(header, value string) http.Header {
	return http.Header{http.CanonicalHeaderKey(header): {value}}
}

func testCredentialBinding(t *testing.T, caddy *harness.Caddy, header string) {
	ctx := t.Context()
	aliceCred, malloryCred := "Bearer alice-0c7e", "Bearer mallory-5d1b"
	alice := mustInit(t, newClient(caddy.Base(), "2025-11-25", cred(header, aliceCred)))

	// Alice's call: every event carries her secret token; the result her
	// secret text.
	const secretToken, secretText = "alice-secret-token-7f3a", "alice-secret-result-91c2"
	x := harness.Must(t)(alice.Call(ctx, 1, "count", map[string]any{"n": 4, "interval_ms": 5}, secretToken))
	ids, err := harness.CheckIDs(x.Events)
	if err != nil || len(x.Events) != 6 {
		t.Fatalf("alice's call: %v: %s", err, x)
	}
	x2 := harness.Must(t)(alice.Call(ctx, 2, "echo", map[string]any{"text": secretText}, secretToken))
	if !strings.Contains(string(x2.Body), secretText) {
		t.Fatalf("alice's echo: %s", x2)
	}
	// A cursor inside the window: alice's first progress event. Replaying
	// from it would send events 2.. (with the secret token).
	cursor := x.Events[1].ID
	secrets := []string{secretToken, secretText, aliceCred}
	info, ok := adminSession(t, caddy, alice.SessionID)
	if !ok {
		t.Fatal("alice's session is not held by the proxy")
	}
	streamsBefore := len(info.Streams)

	mallory := alice.WithHeader(cred(header, malloryCred))
	anonymous := alice.WithHeader(nil)
	both := alice.WithHeader(http.Header{http.CanonicalHeaderKey(header): {aliceCred, malloryCred}})

	forbidden := func(t *testing.T, what string, x harness.Exchange, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		harness.RPCError(t, x, http.StatusForbidden)
		noLeak(t, what, x.Body, secrets...)
		if strings.Contains(string(x.Body), "data:") || strings.Contains(string(x.Body), cursor[:8]) {
			t.Fatalf("%s: the error body carries event data or ids: %s", what, x)
		}
	}

	t.Run("resume with a valid Last-Event-ID", func(t *testing.T) {
		for _, c := range []struct {
			name string
			cl   *mcptest.Client
		}{{"other credential", mallory}, {"no credential", anonymous}, {"both credentials", both}} {
			x, err := harness.Finish(c.cl.Resume(ctx, cursor))
			forbidden(t, c.name, x, err)
			// The head and the priming position too.
			x, err = harness.Finish(c.cl.Resume(ctx, x2.Events[len(x2.Events)-1].ID))
			forbidden(t, c.name+" at head", x, err)
			x, err = harness.Finish(c.cl.Resume(ctx, ids[0].String()))
			forbidden(t, c.name+" at seq 0", x, err)
		}
	})
	t.Run("standalone GET", func(t *testing.T) {
		x, err := harness.Finish(mallory.Do(ctx, "GET", "", nil))
		forbidden(t, "standalone GET", x, err)
	})
	t.Run("POST tools/call", func(t *testing.T) {
		x, err := harness.Finish(mallory.Do(ctx, "POST", mcptest.CallBody(3, "echo", map[string]any{"text": "mallory-was-here"}, "m"), nil))
		forbidden(t, "tools/call", x, err)
		x, err = harness.Finish(mallory.Do(ctx, "POST", `[`+mcptest.CallBody(4, "echo", map[string]any{"text": "mallory-batch"}, "m")+`]`, nil))
		forbidden(t, "tools/call batch", x, err)
		x, err = harness.Finish(mallory.Do(ctx, "POST", `{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":1}}`, nil))
		forbidden(t, "notification", x, err)
		x, err = harness.Finish(mallory.Do(ctx, "POST", `{"jsonrpc":"2.0","id":1,"result":{}}`, nil))
		forbidden(t, "response", x, err)
	})
	t.Run("POST initialize naming the session", func(t *testing.T) {
		// The proxy takes an initialize for a new session and forwards it
		// before any credential check; but this one names alice's session.
		x, err := harness.Finish(mallory.Do(ctx, "POST", `{"jsonrpc":"2.0","id":5,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"m","version":"1"}}}`, nil))
		forbidden(t, "initialize with alice's Mcp-Session-Id", x, err)
	})
	t.Run("POST tools/call disguised as initialize", func(t *testing.T) {
		// The upstream SDK reads member names case-sensitively: it runs
		// tools/call in alice's session. The proxy must not read "METHOD"
		// as the method and wave the request through as an initialize.
		body := `{"jsonrpc":"2.0","id":6,"method":"tools/call","METHOD":"initialize","params":{"name":"echo","arguments":{"text":"mallory-smuggled"}}}`
		x, err := harness.Finish(mallory.Do(ctx, "POST", body, nil))
		if err == nil && strings.Contains(string(x.Body), "mallory-smuggled") {
			t.Errorf("mallory's tools/call ran in alice's session: %s", x)
		}
		forbidden(t, "smuggled tools/call", x, err)
	})
	t.Run("a protocol version the proxy does not track", func(t *testing.T) {
		// The upstream SDK accepts 2024-11-05 in the header and runs the
		// call in alice's session; the header must not switch the binding off.
		v := http.Header{"Mcp-Protocol-Version": {"2024-11-05"}}
		x, err := harness.Finish(mallory.Do(ctx, "POST", mcptest.CallBody(8, "echo", map[string]any{"text": "mallory-old-version"}, "m"), v))
		if err == nil && strings.Contains(string(x.Body), "mallory-old-version") {
			t.Errorf("mallory's tools/call ran in alice's session: %s", x)
		}
		forbidden(t, "tools/call with Mcp-Protocol-Version 2024-11-05", x, err)
	})
	t.Run("standalone GET with a protocol version the proxy does not track", func(t *testing.T) {
		resp, err := mallory.Do(ctx, "GET", "", http.Header{"Mcp-Protocol-Version": {"2024-11-05"}})
		if err == nil && resp.StatusCode == 200 {
			defer resp.Body.Close() // an open stream: do not wait for its end
			// Alice's server-initiated notifications now go to mallory.
			harness.Must(t)(alice.Call(ctx, 10, "notify", map[string]any{"n": 1, "interval_ms": 50}, "a"))
			streamsBefore++ // alice's own call
			evs, _ := mcptest.ReadEvents(resp.Body, 1, 3*time.Second)
			t.Fatalf("mallory got alice's standalone stream from the upstream (%s), and on it: %+v", resp.Header.Get("Content-Type"), evs)
		}
		x, err := harness.Finish(resp, err)
		forbidden(t, "standalone GET with Mcp-Protocol-Version 2024-11-05", x, err)
	})
	t.Run("a Content-Type the proxy does not parse as JSON", func(t *testing.T) {
		// Not executable with the Go SDK upstream (it parses Content-Type
		// as the proxy does), but an upstream that only looks for the
		// substring "application/json" runs it: the binding must not
		// depend on how the proxy classifies the body.
		ct := http.Header{"Content-Type": {"text/plain; x=application/json"}}
		x, err := harness.Finish(mallory.Do(ctx, "POST", mcptest.CallBody(9, "echo", map[string]any{"text": "mallory-content-type"}, "m"), ct))
		forbidden(t, "tools/call with Content-Type text/plain", x, err)
	})
	t.Run("DELETE", func(t *testing.T) {
		x, err := harness.Finish(mallory.Do(ctx, "DELETE", "", nil))
		forbidden(t, "DELETE", x, err)
		x, err = harness.Finish(anonymous.Do(ctx, "DELETE", "", nil))
		forbidden(t, "DELETE without credential", x, err)
		if _, ok := adminSession(t, caddy, alice.SessionID); !ok {
			t.Fatal("the session was deleted")
		}
	})

	t.Run("alice is unaffected", func(t *testing.T) {
		if info, ok := adminSession(t, caddy, alice.SessionID); !ok || len(info.Streams) != streamsBefore {
			t.Errorf("alice's session changed: held %v, streams %d -> %d", ok, streamsBefore, len(info.Streams))
		}
		// Her resume replays exactly what followed the cursor.
		r := harness.Must(t)(alice.Resume(ctx, cursor))
		r.Events = mcptest.AfterPosition(r.Events, cursor)
		if r.Status != 200 || len(r.Events) != len(x.Events)-2 {
			t.Fatalf("alice's resume: want the %d events after %s, got %s", len(x.Events)-2, cursor, r)
		}
		for i, ev := range r.Events {
			if ev.ID != x.Events[i+2].ID || ev.Data != x.Events[i+2].Data {
				t.Fatalf("alice's replay event %d: %+v, want %+v", i, ev, x.Events[i+2])
			}
		}
		// And her session still works upstream.
		e := harness.Must(t)(alice.Call(ctx, 7, "echo", map[string]any{"text": "still here"}, "t"))
		if !strings.Contains(string(e.Body), "still here") {
			t.Fatalf("alice's call after the attacks: %s", e)
		}
	})

	t.Run("no credential at initialize, one at resume", func(t *testing.T) {
		bob := mustInit(t, newClient(caddy.Base(), "2025-03-26", nil))
		bx := harness.Must(t)(bob.Call(ctx, 1, "echo", map[string]any{"text": "bob-secret-3e9"}, "b"))
		if len(bx.Events) == 0 {
			t.Fatalf("bob's call: %s", bx)
		}
		bobCursor := bx.Events[0].ID
		x, err := harness.Finish(bob.WithHeader(cred(header, "Bearer bob")).Resume(ctx, bobCursor))
		if err != nil {
			t.Fatal(err)
		}
		harness.RPCError(t, x, http.StatusForbidden)
		noLeak(t, "bob's resume with a credential", x.Body, "bob-secret-3e9")
		x, err = harness.Finish(bob.WithHeader(cred(header, "Bearer bob")).Do(ctx, "POST", mcptest.CallBody(2, "echo", map[string]any{"text": "x"}, "b"), nil))
		if err != nil {
			t.Fatal(err)
		}
		harness.RPCError(t, x, http.StatusForbidden)
		// Without one, as at initialize, it resumes (at the head of a
		// complete stream: 204, nothing more will come).
		ok := harness.Must(t)(bob.Resume(ctx, bobCursor))
		if ok.Status != http.StatusNoContent || len(ok.Events) != 0 {
			t.Fatalf("bob's own resume at head: %s", ok)
		}
	})

	if header != "Authorization" {
		t.Run("only the bound header counts", func(t *testing.T) {
			h := cred(header, aliceCred)
			h.Set("Authorization", "Bearer whatever-"+fmt.Sprint(len(header)))
			r := harness.Must(t)(alice.WithHeader(h).Resume(ctx, x2.Events[len(x2.Events)-1].ID))
			if r.Status != http.StatusNoContent || len(r.Events) != 0 { // at the end of a complete stream
				t.Fatalf("alice with another Authorization (not bound): %s", r)
			}
			// Header names match case-insensitively.
			r = harness.Must(t)(alice.WithHeader(http.Header{strings.ToLower(header): {aliceCred}}).Resume(ctx, x2.Events[len(x2.Events)-1].ID))
			if r.Status != http.StatusNoContent {
				t.Fatalf("alice with a lower-case header name: %s", r)
			}
		})
	}
}

// TestCredentialBindingAfterExpiry: a session that expired at the proxy
// (idle) but lives on upstream is tombstoned with its credential
// fingerprint. Another credential must not take it over, neither by a
// resume (GET) nor by a new request (POST), and its owner must still get
// it back.
func TestCredentialBindingAfterExpiry(t *testing.T) {
	ctx := t.Context()
	upstream := harness.StartDemo(t, demoserver.Options{})
	caddy := harness.StartCaddy(t, mcptest.ResumeRoute(upstream, "session_idle_timeout 1s"))
	alice := mustInit(t, newClient(caddy.Base(), "2025-03-26", cred("Authorization", "Bearer alice")))
	x := harness.Must(t)(alice.Call(ctx, 1, "echo", map[string]any{"text": "alice-before-expiry"}, "a"))
	if len(x.Events) != 1 {
		t.Fatalf("alice's call: %s", x)
	}
	cursor := x.Events[0].ID
	harness.WaitFor(t, 20*time.Second, "alice's idle session to expire at the proxy", func() bool {
		_, held := adminSession(t, caddy, alice.SessionID)
		return !held
	})
	mallory := alice.WithHeader(cred("Authorization", "Bearer mallory"))

	t.Run("GET resume", func(t *testing.T) {
		x, err := harness.Finish(mallory.Resume(ctx, cursor))
		if err != nil {
			t.Fatal(err)
		}
		harness.RPCError(t, x, http.StatusForbidden)
	})
	t.Run("POST tools/call", func(t *testing.T) {
		x, err := harness.Finish(mallory.Do(ctx, "POST", mcptest.CallBody(2, "echo", map[string]any{"text": "mallory-adopted"}, "m"), nil))
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(x.Body), "mallory-adopted") {
			t.Errorf("mallory's call ran in alice's expired session (and the proxy adopted it for mallory): %s", x)
		}
		harness.RPCError(t, x, http.StatusForbidden)
	})
	t.Run("alice gets her session back", func(t *testing.T) {
		// Her call's stream: she has its answer, so 204, nothing to send.
		x, err := harness.Finish(alice.Resume(ctx, cursor))
		if err != nil {
			t.Fatal(err)
		}
		if x.Status != http.StatusNoContent {
			t.Fatalf("alice's resume of her answered call after expiry: %s, want 204", x)
		}
		// Her next call adopts the session again, bound to her credential.
		x = harness.Must(t)(alice.Call(ctx, 3, "echo", map[string]any{"text": "alice-after-expiry"}, "a"))
		if !strings.Contains(string(x.Body), "alice-after-expiry") {
			t.Fatalf("alice's call after expiry: %s", x)
		}
		if _, held := adminSession(t, caddy, alice.SessionID); !held {
			t.Fatal("the session was not adopted again for alice")
		}
		y, err := harness.Finish(mallory.Do(ctx, "POST", mcptest.CallBody(4, "echo", map[string]any{"text": "mallory-after"}, "m"), nil))
		if err != nil {
			t.Fatal(err)
		}
		harness.RPCError(t, y, http.StatusForbidden)
	})
}
