package resume

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/buffer"
	"github.com/mcpresume/caddy-mcp-resume/internal/eventid"
	"github.com/mcpresume/caddy-mcp-resume/policy"
)

// lookupFails is a store whose reads of a session fail, as a shared
// store's do while NATS is out of reach.
type lookupFails struct{ buffer.Backend }

func (f lookupFails) LookupSession(string) (buffer.Session, error) {
	return nil, errors.New("nats: timeout")
}

// standaloneWithEvents is a session whose standalone stream holds three
// events, the client having acknowledged the first.
func standaloneWithEvents(t *testing.T, h *Engine) buffer.Session {
	t.Helper()
	sess := newSession(t, h, "2025-11-25")
	st := sess.Standalone()
	p, err := st.TakeProducer(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= 3; i++ {
		if _, err := st.Append(context.Background(), buffer.Entry{Fields: []byte(`data: {"secret":` + string(rune('0'+i)) + "}\n")}); err != nil {
			t.Fatal(err)
		}
	}
	p.Done()
	return sess
}

// resumeAs is a resume of the standalone stream from event 1, with bearer.
func resumeAs(t *testing.T, base string, sess buffer.Session, bearer string) *http.Response {
	t.Helper()
	return resumeReqAs(t, base, string(eventid.Append(nil, sess.Epoch(), policy.StandaloneNum, 1)), bearer, 10*time.Second)
}

// A session the store cannot read is not a session it does not hold: the
// request gets 503 with a JSON-RPC error, and nothing reaches the upstream
// (a pass as for an unknown session skips the credential check).
func TestASessionTheStoreCannotReadIsRefused(t *testing.T) {
	t.Parallel()
	h := testHandler(t)
	sess := standaloneWithEvents(t, h)
	h.rt.store = lookupFails{h.rt.store}
	next := &upstream{}
	resp := resumeAs(t, relayServer(t, h, next).URL, sess, "x")
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(string(body), `"jsonrpc":"2.0"`) ||
		resp.Header.Get("Retry-After") == "" {
		t.Fatalf("status %d, body %q; want 503 with a JSON-RPC error and Retry-After", resp.StatusCode, body)
	}
	if n := len(next.requests()); n != 0 {
		t.Fatalf("%d requests reached the upstream", n)
	}
}

// A request let through for a session unknown (every look of its
// authorization missed) whose serving path then finds the session is
// authorized again before anything of its log goes out: another
// credential gets the upstream's refusal, never the events (review 30's
// stolen cursor across a store hiccup).
func TestASessionFoundAfterItsAuthorizationIsAuthorizedAgain(t *testing.T) {
	t.Parallel()
	for _, misses := range []int32{1, 2} { // authorize's look alone; it and serveGet's
		h := testHandler(t)
		sess := standaloneWithEvents(t, h)
		miss := &firstLooksMiss{Backend: h.rt.store}
		miss.misses.Store(misses)
		h.rt.store = miss
		// The other credential is put to the upstream (a ping on the
		// session), which refuses it.
		next := &upstream{steps: []func(http.ResponseWriter, *http.Request) error{statusStep(http.StatusUnauthorized)}}
		resp := resumeAs(t, relayServer(t, h, next).URL, sess, "mallory")
		body, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusUnauthorized || strings.Contains(string(body), "secret") {
			t.Fatalf("%d looks missed: status %d, body %q; want the upstream's 401 and none of the log", misses, resp.StatusCode, body)
		}
		// The session's own credential still gets what it missed.
		resp = resumeAs(t, relayServer(t, h, &upstream{}).URL, sess, "x")
		evs, _ := readSSE(t, resp.Body, 2)
		if resp.StatusCode != http.StatusOK || len(evs) != 2 || !strings.Contains(evs[1].Data, `"secret":3`) {
			t.Fatalf("%d looks missed: the owner got %d, %+v", misses, resp.StatusCode, evs)
		}
		h.rt.Stop()
	}
}
