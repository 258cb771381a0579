package follow

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/internal/demoserver"
	"github.com/mcpresume/caddy-mcp-resume/internal/mcptest"
	"github.com/mcpresume/caddy-mcp-resume/tests/harness"
)

// Clients that open and drop the standalone GET of one session in a tight
// loop, three at once, some plain, some resuming, some dropping before
// the headers: the official Go SDK server (with an event store) behind an
// upstream that answers 409 to a second GET of a session. The proxy must
// never pass a 409 to a client (a second connection to the stream takes
// over), never have two upstream GETs open at once (OneGET's lags), and
// not spin: the upstream GET opened once stays open across the clients'
// reconnects.
func TestStandaloneReconnectStorm(t *testing.T) {
	up := &mcptest.OneGET{Next: demoserver.New(demoserver.Options{EventStore: true})}
	c := harness.StartCaddy(t, mcptest.ResumeRoute(harness.StartHandler(t, up), ""))
	cl := harness.NewSession(t, c.Base(), "2025-11-25")
	resp := cl.Request("GET", "", nil)
	cursor := harness.ReadEvents(t, resp, 1)[0].ID
	resp.Body.Close()
	var mu sync.Mutex
	var refused []string
	statuses := map[int]int{}
	deadline := time.Now().Add(6 * time.Second)
	var wg sync.WaitGroup
	for w := 0; w < 3; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rc := harness.NewRawClient(t, c.Base(), "2025-11-25")
			rc.SessionID = cl.SessionID
			for i := 0; time.Now().Before(deadline); i++ {
				ctx, cancel := context.WithTimeout(context.Background(), time.Duration(i%5)*7*time.Millisecond+time.Millisecond)
				var h http.Header
				if (i+w)%2 == 0 {
					h = http.Header{"Last-Event-ID": {cursor}}
				}
				r, err := rc.Do(ctx, "GET", "", h)
				if err == nil {
					mu.Lock()
					statuses[r.StatusCode]++
					if r.StatusCode != http.StatusOK {
						body, _ := io.ReadAll(r.Body)
						refused = append(refused, fmt.Sprintf("%d %q", r.StatusCode, body))
					}
					mu.Unlock()
					r.Body.Close()
				}
				cancel()
			}
		}()
	}
	wg.Wait()
	harness.WaitFor(t, 10*time.Second, "one upstream GET to be open", func() bool { return up.Open(cl.SessionID) == 1 })
	time.Sleep(500 * time.Millisecond)
	gets, lags := up.Counts()
	t.Logf("client statuses %v; %d upstream GETs, %d answered 409 %v", statuses, gets, len(lags), lags)
	if len(refused) > 0 {
		t.Errorf("%d client GETs refused, e.g. %v", len(refused), refused[:min(3, len(refused))])
	}
	if len(lags) > 0 {
		t.Errorf("%d upstream GETs came while another of the session was open", len(lags))
	}
	if gets > 3 {
		t.Errorf("%d upstream GETs for one session whose upstream GET never ended, want 1", gets)
	}
}
