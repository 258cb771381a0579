package security

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/internal/demoserver"
	"github.com/mcpresume/caddy-mcp-resume/internal/mcptest"
	"github.com/mcpresume/caddy-mcp-resume/tests/harness"
)

// heapReview55 is the live heap after a collection.
func heapReview55() uint64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// Review 55: a client of a session declares a body of max_request_bytes
// (Content-Length) and sends one byte of it. The proxy must hold about
// what was sent, not what was declared: otherwise a few hundred bytes of
// headers per request make it allocate 8 MiB (the default), and a client
// with a session and a few dozen connections takes the process's memory
// without sending any of it.
func TestReview55DeclaredBodyLengthIsNotAllocatedUpFront(t *testing.T) {
	upstream := harness.StartDemo(t, demoserver.Options{})
	c := harness.StartCaddy(t, mcptest.ResumeRoute(upstream, ""))
	rc := harness.NewSession(t, c.Base(), "2025-06-18")
	// One call, so everything a call touches is allocated already.
	rc.CallToEnd(2, "count", map[string]any{"n": 1, "interval_ms": 1})

	const conns = 24
	const declared = 8 << 20 // the default max_request_bytes
	before := heapReview55()
	var held []net.Conn
	t.Cleanup(func() {
		for _, cn := range held {
			cn.Close()
		}
	})
	for i := range conns {
		cn, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", c.HTTPPort))
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, cn)
		req := fmt.Sprintf("POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nContent-Type: application/json\r\n"+
			"Accept: application/json, text/event-stream\r\nMcp-Session-Id: %s\r\nMcp-Protocol-Version: 2025-06-18\r\n"+
			"Content-Length: %d\r\n\r\n{", c.HTTPPort, rc.SessionID, declared)
		if _, err := cn.Write([]byte(req)); err != nil {
			t.Fatalf("conn %d: %v", i, err)
		}
	}
	// The handlers are reading the bodies now; the heap is what they hold.
	var grown uint64
	for deadline := time.Now().Add(3 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if h := heapReview55(); h > before {
			grown = max(grown, h-before)
		}
	}
	sent := conns * 300 // headers and a byte, roughly
	t.Logf("%d requests declaring %d bytes, %d bytes sent: the heap grew by %.1f MiB", conns, declared, sent, float64(grown)/(1<<20))
	if grown > 32<<20 {
		t.Fatalf("%d requests that each declared %d MiB and sent one byte grew the heap by %.0f MiB: the declared length is allocated before the body comes",
			conns, declared>>20, float64(grown)/(1<<20))
	}
}

// Review 55: bodies of every shape reach the upstream whole, or get the
// proxy's 413, with or without a declared length.
func TestReview55BodyShapes(t *testing.T) {
	ctx := t.Context()
	var got atomic.Int64
	var gotBody atomic.Value
	up := &mcptest.Upstream{}
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if r.Method == http.MethodPost {
			got.Store(int64(len(body)))
			gotBody.Store(string(body))
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		up.ServeHTTP(w, r)
	})
	const limit = 2000
	c := harness.StartCaddy(t, mcptest.ResumeRoute(harness.StartHandler(t, h), "max_request_bytes 2000"))
	cl := mustInit(t, newClient(c.Base(), "2025-06-18", nil))
	id := 6
	call := func(size int) string {
		id++ // not a repeat of an earlier request (answered from the log)
		b := mcptest.CallBody(id, "count", map[string]any{"n": 1, "pad": ""}, "")
		if size < len(b) {
			t.Fatalf("size %d below %d", size, len(b))
		}
		return mcptest.CallBody(id, "count", map[string]any{"n": 1, "pad": strings.Repeat("x", size-len(b))}, "")
	}
	send := func(body string, chunked bool) (int, string) {
		req, err := cl.NewRequest(ctx, "POST", "x", nil)
		if err != nil {
			t.Fatal(err)
		}
		if chunked {
			req.Body, req.ContentLength = io.NopCloser(struct{ io.Reader }{strings.NewReader(body)}), -1
		} else {
			req.Body, req.ContentLength = io.NopCloser(strings.NewReader(body)), int64(len(body))
		}
		req.GetBody = nil
		got.Store(-1)
		resp, err := cl.HTTP.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		out, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp.StatusCode, string(out)
	}
	for _, chunked := range []bool{false, true} {
		for _, size := range []int{200, limit - 1, limit} {
			body := call(size)
			status, out := send(body, chunked)
			if status != 200 || got.Load() != int64(size) || gotBody.Load().(string) != body {
				t.Errorf("chunked %v, %d bytes: %d %q; upstream read %d bytes", chunked, size, status, out, got.Load())
			}
		}
		status, out := send(call(limit+1), chunked)
		if status != http.StatusRequestEntityTooLarge || got.Load() != -1 {
			t.Errorf("chunked %v, %d bytes: %d %q; upstream read %d bytes", chunked, limit+1, status, out, got.Load())
		}
	}
	// An empty body with Content-Length: 0 passes to the upstream as such.
	status, out := send("", false)
	if status >= 500 || got.Load() != 0 {
		t.Errorf("empty body: %d %q; upstream read %d", status, out, got.Load())
	}
	// A body shorter than declared: the proxy says so, the upstream never sees it.
	conn, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", c.HTTPPort))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	got.Store(-1)
	fmt.Fprintf(conn, "POST /mcp HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\n"+
		"Mcp-Session-Id: %s\r\nMcp-Protocol-Version: 2025-06-18\r\nContent-Length: 500\r\n\r\n%s", cl.SessionID, call(200))
	conn.(*net.TCPConn).CloseWrite()
	conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	short, _ := io.ReadAll(conn)
	if got.Load() != -1 {
		t.Errorf("a body shorter than declared reached the upstream (%d bytes); client got %q", got.Load(), short)
	}
	t.Logf("a short body: %q", firstLine(string(short)))
}

func firstLine(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i]
	}
	return s
}
