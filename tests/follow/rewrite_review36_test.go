package follow

// Review 36: handlers after mcp_resume in a route run once for each
// request the tap sends through them, as they do for the client's. Two ways
// it failed: with the tap's upstream request sharing the client's header
// values (12cce1e, reverted), request_header's in-place replacement changed
// the client's request too and the tap's follow-up GET (built from it) got
// the replacement twice; and, older, the follow-up GET shared the client
// request's record of the route groups it had entered, so Caddy skipped the
// rewrite (a grouped route) for it and the upstream answered it 404.

import (
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/internal/mcptest"
	"github.com/mcpresume/caddy-mcp-resume/tests/harness"
)

type seenReq struct{ method, path, tenant string }

func TestReview36RewriteAfterMcpResumeAppliesOncePerUpstreamRequest(t *testing.T) {
	var (
		mu   sync.Mutex
		seen []seenReq
		rid  []byte
	)
	up := &scripted{Upstream: &mcptest.Upstream{Tools: map[string]mcptest.Tool{
		"poll": func(w http.ResponseWriter, r *http.Request, req *mcptest.Request) {
			mu.Lock()
			rid = append([]byte(nil), req.ID...)
			mu.Unlock()
			sseHeaders(w)
			// SEP-1699 polling: one event, a retry, and the stream closes.
			fmt.Fprintf(w, "id: a1\nretry: 50\ndata: %s\n\n", notice("working"))
		}}}}
	up.get = func(w http.ResponseWriter, r *http.Request, n int) {
		if r.Header.Get("Last-Event-ID") != "a1" {
			w.WriteHeader(http.StatusMethodNotAllowed)
			return
		}
		mu.Lock()
		id := rid
		mu.Unlock()
		sseHeaders(w)
		fmt.Fprintf(w, "id: a2\ndata: %s\n\n", resultFor(id))
	}
	rec := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, seenReq{r.Method, r.URL.Path, r.Header.Get("X-Tenant")})
		mu.Unlock()
		if r.URL.Path != "/up/mcp" {
			http.NotFound(w, r)
			return
		}
		up.ServeHTTP(w, r)
	})
	addr := harness.StartHandler(t, rec)
	opts := ""
	if mcptest.StoreBlock != "" {
		opts = "{\n" + mcptest.StoreBlock + "\n}"
	}
	c := harness.StartCaddy(t, fmt.Sprintf(`	route /mcp* {
		mcp_resume %s
		rewrite * /up{path}
		request_header X-Tenant acme acme-eu
		reverse_proxy %s
	}`, opts, addr))
	cl := harness.NewSession(t, c.Base(), "2025-11-25")
	body := `{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"poll","arguments":{}}}`
	resp := cl.Request(http.MethodPost, body, http.Header{"X-Tenant": {"acme"}})
	evs := harness.ReadEvents(t, resp, 0)
	resp.Body.Close()
	time.Sleep(100 * time.Millisecond)
	mu.Lock()
	defer mu.Unlock()
	var bad []string
	for _, s := range seen {
		if s.path != "/up/mcp" {
			bad = append(bad, fmt.Sprintf("%s %s (rewritten twice)", s.method, s.path))
		}
		if s.tenant != "" && s.tenant != "acme-eu" {
			bad = append(bad, fmt.Sprintf("%s X-Tenant %q (replaced twice)", s.method, s.tenant))
		}
	}
	got := false
	for _, e := range evs {
		got = got || strings.Contains(e.Data, `"id":7,"result"`)
	}
	if len(bad) > 0 || !got {
		t.Fatalf("upstream saw %+v; wrong: %v; client got result: %v (events %+v)", seen, bad, got, evs)
	}
}
