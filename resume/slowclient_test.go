package resume

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/policy"
)

// The relay beside a tap, on real HTTP/1.1 connections: whatever its
// client does, the tap reads the upstream to the end, and the client gets
// every event in order, keep-alives while the upstream is quiet, and each
// answer as it comes. (Guards for any change of who writes to the client:
// a relay run in the tap's own goroutine was tried and dropped, see
// pipelining_test.go.)

// dialStalled connects to srv with the smallest receive buffer, for a
// client that reads nothing: the connection closes with the test.
func dialStalled(t *testing.T, srv *httptest.Server) net.Conn {
	t.Helper()
	d := net.Dialer{Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		c.Control(func(fd uintptr) { serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 1024) })
		return serr
	}}
	conn, err := d.Dial("tcp", srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// callOver is post's tools/call (id 1) as a request to srv.
func callOver(t *testing.T, srv *httptest.Server) *http.Request {
	t.Helper()
	r := post("1")
	req, err := http.NewRequest("POST", srv.URL+"/mcp", r.Body)
	if err != nil {
		t.Fatal(err)
	}
	req.Header = r.Header
	return req
}

// callThrough makes post's tools/call through h, served on a real
// HTTP/1.1 server with next as upstream; the body closes with the test.
func callThrough(t *testing.T, h *Engine, next *upstream) *http.Response {
	t.Helper()
	srv := relayServer(t, h, next)
	resp, err := srv.Client().Do(callOver(t, srv))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	return resp
}

// A client that stops reading never holds the tap up: a stream far larger
// than any socket buffer is read from the upstream to its end, while the
// client's socket takes nothing more.
func TestAStalledClientNeverHoldsTheTap(t *testing.T) {
	cfg := Config{}
	cfg.MaxStreamBytes, cfg.MaxSessionBytes, cfg.MaxTotalBytes = 64<<20, 64<<20, 64<<20
	h := testHandlerWith(t, cfg)
	sess := newSession(t, h, "2025-11-25")
	const n, size = 400, 8 << 10
	upstreamDone := make(chan struct{})
	next := &upstream{steps: []func(http.ResponseWriter, *http.Request) error{
		func(w http.ResponseWriter, r *http.Request) error {
			defer close(upstreamDone)
			w.Header().Set("Content-Type", "text/event-stream")
			w.WriteHeader(http.StatusOK)
			pad := strings.Repeat("x", size)
			for i := range n {
				fmt.Fprintf(w, "event: message\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/message\",\"params\":{\"n\":%d,\"pad\":%q}}\n\n", i, pad)
				http.NewResponseController(w).Flush()
			}
			io.WriteString(w, result("", "1"))
			return nil
		},
	}}
	srv := relayServer(t, h, next)

	conn := dialStalled(t, srv) // reads nothing
	if err := callOver(t, srv).Write(conn); err != nil {
		t.Fatal(err)
	}
	select {
	case <-upstreamDone:
	case <-time.After(20 * time.Second):
		t.Fatal("the upstream could not send its stream while the client read nothing: the tap waited on the client")
	}
	waitFor(t, 10*time.Second, "the stream complete in the log", func() bool {
		st, ok := sess.Stream(1)
		return ok && st.View().State == policy.Complete && st.View().Head == n+1
	})
}

// A call whose upstream goes quiet gets keep-alives meanwhile, then the
// rest.
func TestAQuietCallIsKeptAlive(t *testing.T) {
	h := testHandler(t) // keep-alive every second
	newSession(t, h, "2025-11-25")
	sawKeepalive := make(chan struct{})
	next := &upstream{steps: []func(http.ResponseWriter, *http.Request) error{
		func(w http.ResponseWriter, r *http.Request) error {
			w.Header().Set("Content-Type", "text/event-stream")
			w.WriteHeader(http.StatusOK)
			io.WriteString(w, progress("", 1))
			http.NewResponseController(w).Flush()
			select {
			case <-sawKeepalive:
			case <-time.After(10 * time.Second):
			}
			io.WriteString(w, result("", "1"))
			return nil
		},
	}}
	resp := callThrough(t, h, next)
	var got []string
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == ": keepalive":
			if !strings.Contains(strings.Join(got, "\n"), "keepalive") {
				close(sawKeepalive)
			}
		case strings.HasPrefix(line, "data: "):
		default:
			continue
		}
		got = append(got, line)
	}
	all := strings.Join(got, "\n")
	progressAt, keepaliveAt, resultAt := strings.Index(all, "notifications/progress"), strings.Index(all, "keepalive"), strings.Index(all, `"result"`)
	if progressAt < 0 || keepaliveAt < progressAt || resultAt < keepaliveAt {
		t.Fatalf("want the progress, a keep-alive, then the result; got:\n%s", all)
	}
}

// A stream of many small writes reaches its client whole and in order.
func TestALongStreamReachesItsClientWhole(t *testing.T) {
	h := testHandler(t)
	newSession(t, h, "2025-11-25")
	const n = 300       // ~30 KiB in writes of one event each
	var writes []string // one event each
	for i := range n {
		writes = append(writes, progress("", i+1))
	}
	next := &upstream{steps: []func(http.ResponseWriter, *http.Request) error{sseStep("eof", append(writes, result("", "1"))...)}}
	resp := callThrough(t, h, next)
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	evs := events(t, string(body))
	var data []sseEvent
	for _, e := range evs {
		if e.Data != "" {
			data = append(data, e)
		}
	}
	if len(data) != n+1 || !strings.Contains(data[n].Data, `"result"`) {
		t.Fatalf("got %d events, want %d progress and the result", len(data), n)
	}
	for i, e := range data[:n] {
		if !strings.Contains(e.Data, fmt.Sprintf(`"progress":%d}`, i+1)) {
			t.Fatalf("event %d is %q", i, e.Data)
		}
	}
	checkContiguous(t, data)
}

// The last answer is not held by an upstream that keeps the stream open
// after it: it reaches the client while the upstream still holds the
// response.
func TestTheLastAnswerIsNotHeldByAnUpstreamThatStaysOpen(t *testing.T) {
	h := testHandler(t)
	newSession(t, h, "2025-11-25")
	gotResult := make(chan struct{})
	next := &upstream{steps: []func(http.ResponseWriter, *http.Request) error{
		func(w http.ResponseWriter, r *http.Request) error {
			w.Header().Set("Content-Type", "text/event-stream")
			w.WriteHeader(http.StatusOK)
			io.WriteString(w, progress("", 1)+result("", "1"))
			http.NewResponseController(w).Flush()
			select { // open until the client has the result
			case <-gotResult:
			case <-time.After(10 * time.Second):
			}
			return nil
		},
	}}
	resp := callThrough(t, h, next)
	start := time.Now()
	evs, _ := readSSE(t, resp.Body, 3) // the priming event, the progress, the result
	close(gotResult)
	if len(evs) != 3 || !strings.Contains(evs[2].Data, `"result"`) {
		t.Fatalf("got %+v", evs)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("the result came after %v: held until the upstream's end", d)
	}
}
