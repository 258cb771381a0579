package security

import (
	"context"
	"io"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/internal/demoserver"
	"github.com/mcpresume/caddy-mcp-resume/internal/mcptest"
	"github.com/mcpresume/caddy-mcp-resume/tests/harness"
)

// boundUpstream binds each session to the Authorization of the first
// request that names it, as SDK servers bind sessions to the token's
// user, and answers 403 to any other.
type boundUpstream struct {
	next http.Handler
	mu   sync.Mutex
	auth map[string]string
}

func (u *boundUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if sid := r.Header.Get("Mcp-Session-Id"); sid != "" {
		u.mu.Lock()
		if u.auth == nil {
			u.auth = make(map[string]string)
		}
		owner, ok := u.auth[sid]
		if !ok {
			u.auth[sid], owner = r.Header.Get("Authorization"), r.Header.Get("Authorization")
		}
		u.mu.Unlock()
		if owner != r.Header.Get("Authorization") {
			http.Error(w, "not your session", http.StatusForbidden)
			return
		}
	}
	u.next.ServeHTTP(w, r)
}

// After a restart (memory store: the proxy lost the session and its
// binding), someone who learned the session ID and a cursor of it resumes
// first, under their own bearer token (one only the upstream verifies).
// The adoption waits for the upstream's answer, so the upstream's 403
// reaches them, and the session is not bound to them: its owner's resume
// then gets the gap, not a 403.
func TestAdoptionAfterARestartUnderOtherCredentials(t *testing.T) {
	harness.MemoryStoreOnly(t, "a restart that loses the store")
	up := &boundUpstream{next: demoserver.New(demoserver.Options{})}
	upstream := harness.StartHandler(t, up)
	c := harness.StartCaddy(t, mcptest.ResumeRoute(upstream, ""))
	owner := harness.NewRawClient(t, c.Base(), "2025-11-25")
	owner.Header = http.Header{"Authorization": {"Bearer alice"}}
	owner.Initialize()
	evs := owner.CallToEnd(1, "count", map[string]any{"n": 2, "interval_ms": 1})
	g := owner.Request("GET", "", nil)
	standalone := harness.ReadEvents(t, g, 1)[0].ID
	g.Body.Close()
	harness.StopCaddy(t)
	c.Load(t, mcptest.ResumeRoute(upstream, ""))
	owner.Reconnect()

	for _, cursor := range []string{standalone, evs[1].ID} {
		thief := harness.NewRawClient(t, c.Base(), "2025-11-25")
		thief.SessionID = owner.SessionID
		thief.Header = http.Header{"Authorization": {"Bearer mallory"}}
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		r, err := thief.Do(ctx, "GET", "", http.Header{"Last-Event-ID": {cursor}})
		if err != nil {
			cancel()
			t.Fatal(err)
		}
		var got []mcptest.Event
		if r.StatusCode == 200 {
			got, _ = mcptest.ReadEvents(r.Body, 2, 2*time.Second)
		} else {
			io.Copy(io.Discard, r.Body)
		}
		r.Body.Close()
		cancel()
		t.Logf("the thief's resume from %s: %d %+v", cursor, r.StatusCode, got)
		if r.StatusCode == 200 {
			t.Errorf("the thief's resume from %s after the restart got 200 %+v; want the upstream's 403", cursor, got)
		}
		r2 := owner.Resume(cursor)
		st := r2.StatusCode
		r2.Body.Close()
		if st == http.StatusForbidden || st == http.StatusBadRequest {
			t.Fatalf("the owner's resume from %s after the thief's got %d: the session went to the thief", cursor, st)
		}
	}
}
