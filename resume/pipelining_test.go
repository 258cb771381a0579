package resume

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Review 31 broke the first relay hand-off (handoff.go: the tap writing a
// short stream to its client itself, in its own goroutine, up to 4 KiB).
// Its premise, that an HTTP/1 response starts on a connection its client
// has read to the end, fails for a client that pipelines: the earlier
// responses fill the socket's buffers, and the tap blocked in a write with
// its upstream unread. Now the tap writes only when the connection's send
// queue is empty as the response begins (sendqueue.go); this test holds it
// to that.

// pipelinedUpstream answers every call with k progress events, each written and
// flushed on its own, then the result; it records which calls it began and
// which it finished writing (the tap took every byte).
type pipelinedUpstream struct {
	k, pad            int
	began, finished   atomic.Int64
	mu                sync.Mutex
	lastBegun         string
	lastBegunFinished bool
}

func (u *pipelinedUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) error {
	body, _ := io.ReadAll(r.Body)
	id := "0"
	if i := strings.Index(string(body), `"id":`); i >= 0 {
		rest := string(body[i+5:])
		id = rest[:strings.IndexAny(rest, ",}")]
	}
	u.began.Add(1)
	u.mu.Lock()
	u.lastBegun, u.lastBegunFinished = id, false
	u.mu.Unlock()
	w.Header().Set("Content-Type", "text/event-stream")
	w.WriteHeader(http.StatusOK)
	pad := strings.Repeat("p", u.pad)
	for i := range u.k {
		if _, err := fmt.Fprintf(w, "event: message\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/message\",\"params\":{\"n\":%d,\"pad\":%q}}\n\n", i, pad); err != nil {
			panic(http.ErrAbortHandler)
		}
		http.NewResponseController(w).Flush()
	}
	if _, err := io.WriteString(w, result("", id)); err != nil {
		panic(http.ErrAbortHandler)
	}
	u.finished.Add(1)
	u.mu.Lock()
	u.lastBegunFinished = true
	u.mu.Unlock()
	return nil
}

// A client that pipelines its calls on one HTTP/1.1 connection and reads
// nothing: the responses of the earlier calls fill the socket's buffers
// (they were written out whole, so the next request is read), and the
// call whose inline writes no longer fit must not hold up its tap: its
// upstream is read to the end whatever the client does.
func TestAPipeliningClientThatReadsNothingNeverHoldsTheTap(t *testing.T) {
	cfg := Config{}
	cfg.MaxStreamBytes, cfg.MaxSessionBytes, cfg.MaxTotalBytes = 64<<20, 256<<20, 256<<20
	h := testHandlerWith(t, cfg)
	newSession(t, h, "2025-11-25")
	up := &pipelinedUpstream{k: 8, pad: 300}
	srv := pipelinedServer(t, h, up)

	inline0 := inlineRelays()
	conn := dialStalled(t, srv)
	const calls = 3000
	go func() {
		bw := bufio.NewWriter(conn)
		for i := 1; i <= calls; i++ {
			body := fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"count"}}`, i)
			fmt.Fprintf(bw, "POST /mcp HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"+
				"Accept: application/json, text/event-stream\r\nMcp-Session-Id: sess-1\r\nMcp-Protocol-Version: 2025-11-25\r\nAuthorization: Bearer x\r\n"+
				"Content-Length: %d\r\n\r\n%s", len(body), body)
		}
		bw.Flush()
	}()
	// Wait until the server stops making progress.
	last, still := int64(-1), 0
	for still < 10 {
		time.Sleep(300 * time.Millisecond)
		if b := up.began.Load(); b == last {
			still++
		} else {
			last, still = b, 0
		}
	}
	up.mu.Lock()
	id, fin := up.lastBegun, up.lastBegunFinished
	up.mu.Unlock()
	inline := inlineRelays() - inline0
	t.Logf("calls begun %d, finished %d; last begun: id %s, upstream finished writing: %v; relays the tap wrote itself: %d",
		up.began.Load(), up.finished.Load(), id, fin, inline)
	if inline == 0 || inline >= up.began.Load() {
		t.Errorf("the tap wrote %d of %d calls' relays itself: the first ones should be, and none once the client's answers pile up", inline, up.began.Load())
	}
	if !fin {
		buf := make([]byte, 1<<20)
		buf = buf[:runtime.Stack(buf, true)]
		for _, g := range strings.Split(string(buf), "\n\n") {
			if strings.Contains(g, "upstreamTap") {
				t.Logf("blocked tap:\n%s", g)
			}
		}
		t.Fatalf("call %s: its upstream is blocked writing to the tap for 3s: the tap waits on a client that reads nothing", id)
	}
}

func pipelinedServer(t *testing.T, h *Engine, next Next) *httptest.Server {
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.ServeHTTP(w, r, next)
	}))
	srv.Config.ConnContext = ConnContext
	srv.Start()
	t.Cleanup(srv.CloseClientConnections)
	return srv
}
