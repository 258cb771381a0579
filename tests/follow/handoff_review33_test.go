package follow

// Review 33: attacks on the relay hand-off of commit 6d994aa (the tap
// writing a short answer to an HTTP/1 client itself when the client's
// connection has an empty kernel send queue), on the in-process Caddy with
// real sockets.

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/mcpresume/caddy-mcp-resume/internal/mcptest"
	"github.com/mcpresume/caddy-mcp-resume/tests/harness"
)

// dialTuned dials addr with the client's advertised MSS and receive buffer
// set (0: the kernel's default): a small MSS makes the server's send buffer
// small (Linux sizes it from the MSS), a small receive buffer makes the
// client's window small.
func dialTuned(t *testing.T, addr string, mss, rcvbuf int) net.Conn {
	t.Helper()
	d := net.Dialer{Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		c.Control(func(fd uintptr) {
			if mss > 0 {
				if err := unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_MAXSEG, mss); err != nil {
					serr = err
				}
			}
			if rcvbuf > 0 {
				if err := unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUF, rcvbuf); err != nil {
					serr = err
				}
			}
		})
		return serr
	}}
	conn, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// sessionBehind starts a Caddy in front of up, opens a 2025-11-25 session
// through it, and returns the address raw clients dial.
func sessionBehind(t *testing.T, up http.Handler) (*harness.Caddy, *harness.RawClient, string) {
	t.Helper()
	c := harness.StartCaddy(t, mcptest.ResumeRoute(harness.StartHandler(t, up), ""))
	return c, harness.NewSession(t, c.Base(), "2025-11-25"), fmt.Sprintf("127.0.0.1:%d", c.HTTPPort)
}

// rawCall is a tools/call as raw HTTP/1.1 bytes for session sid.
func rawCall(host, sid, version string, id int, tool string, extra ...string) string {
	body := fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":%q,"arguments":{},"_meta":{"progressToken":"tok"}}}`, id, tool)
	var b strings.Builder
	fmt.Fprintf(&b, "POST /mcp HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\n"+
		"Mcp-Session-Id: %s\r\nMcp-Protocol-Version: %s\r\n", host, sid, version)
	for _, l := range extra {
		b.WriteString(l + "\r\n")
	}
	fmt.Fprintf(&b, "Content-Length: %d\r\n\r\n%s", len(body), body)
	return b.String()
}

// An upstream whose answer to a call carries large response headers
// (reverse_proxy copies them to the client's response): the first version
// of the hand-off counted them as 512 bytes and the tap wrote them itself
// to a client that reads nothing (review 33; now their size decides). Its
// connection's send queue was empty, but the headers do not fit in its
// send buffer: the tap blocks in the write with its upstream unread. The
// upstream's own send buffer is small, so it finishes writing the call
// only if the proxy reads it.
func TestReview33LargeUpstreamHeadersDoNotHoldTheTap(t *testing.T) {
	harness.MemoryStoreOnly(t, "the tap writes to its client itself only with the memory store's ReadyReader")
	var finished atomic.Bool
	var events atomic.Int64
	up := &mcptest.Upstream{Tools: map[string]mcptest.Tool{
		"big": func(w http.ResponseWriter, r *http.Request, req *mcptest.Request) {
			w.Header().Set("X-Pad", strings.Repeat("a", 256<<10))
			sseHeaders(w)
			rc := http.NewResponseController(w)
			pad := strings.Repeat("n", 500)
			for i := range 1000 {
				if _, err := fmt.Fprintf(w, "id: e%d\ndata: %s\n\n", i, notice(pad)); err != nil {
					return
				}
				rc.Flush()
				events.Add(1)
			}
			fmt.Fprintf(w, "id: r\ndata: %s\n\n", resultFor(req.ID))
			rc.Flush()
			finished.Store(true)
		},
	}}
	addr := harness.StartHandlerSndbuf(t, up, 4096)
	c := harness.StartCaddy(t, mcptest.ResumeRoute(addr, ""))
	cl := harness.NewSession(t, c.Base(), "2025-11-25")

	conn := dialTuned(t, fmt.Sprintf("127.0.0.1:%d", c.HTTPPort), 88, 1024)
	if _, err := io.WriteString(conn, rawCall("x", cl.SessionID, "2025-11-25", 1, "big")); err != nil {
		t.Fatal(err)
	}
	// The client reads nothing.
	began := time.Now()
	ok := mcptest.Eventually(2*time.Second, 20*time.Millisecond, finished.Load)
	t.Logf("upstream wrote %d of 1000 events in %v; finished: %v", events.Load(), time.Since(began), ok)
	if !ok {
		buf := make([]byte, 4<<20)
		buf = buf[:runtime.Stack(buf, true)]
		for _, g := range strings.Split(string(buf), "\n\n") {
			if strings.Contains(g, "startRelay") || strings.Contains(g, "handOff") {
				t.Logf("the tap's goroutine:\n%s", g)
			}
		}
		more := mcptest.Eventually(8*time.Second, 20*time.Millisecond, finished.Load)
		t.Logf("then: %d events, finished %v, %v after the request", events.Load(), more, time.Since(began))
		conn.SetReadDeadline(time.Now().Add(5 * time.Second))
		n, err := io.Copy(io.Discard, conn)
		t.Logf("the client then read %d bytes: %v", n, err)
		t.Fatalf("the upstream could not finish writing its 1000 events in 2 s: the tap is held by a client that reads nothing (the response's 256 KiB of headers, written by the tap itself)")
	}
}

// The same without large headers, with the smallest MSS and receive buffer
// a client can ask for, and a progress event per write (many small
// segments, each with the kernel's per-buffer overhead): the at most 4 KiB
// the tap writes itself must still fit in the send buffer.
func TestReview33TinyMSSClientThatReadsNothingDoesNotHoldTheTap(t *testing.T) {
	harness.MemoryStoreOnly(t, "the tap writes to its client itself only with the memory store's ReadyReader")
	var finished atomic.Bool
	var events atomic.Int64
	up := &mcptest.Upstream{Tools: map[string]mcptest.Tool{
		"many": func(w http.ResponseWriter, r *http.Request, req *mcptest.Request) {
			sseHeaders(w)
			rc := http.NewResponseController(w)
			for i := range 3000 {
				if _, err := fmt.Fprintf(w, "id: e%d\ndata: %s\n\n", i, notice("x")); err != nil {
					return
				}
				rc.Flush()
				events.Add(1)
				if i < 60 {
					time.Sleep(time.Millisecond) // one event per tap read while the tap writes itself
				}
			}
			fmt.Fprintf(w, "id: r\ndata: %s\n\n", resultFor(req.ID))
			rc.Flush()
			finished.Store(true)
		},
	}}
	addr := harness.StartHandlerSndbuf(t, up, 4096)
	c := harness.StartCaddy(t, mcptest.ResumeRoute(addr, ""))
	cl := harness.NewSession(t, c.Base(), "2025-11-25")
	for _, mss := range []int{88, 200, 536} {
		finished.Store(false)
		events.Store(0)
		conn := dialTuned(t, fmt.Sprintf("127.0.0.1:%d", c.HTTPPort), mss, 1024)
		if _, err := io.WriteString(conn, rawCall("x", cl.SessionID, "2025-11-25", mss, "many")); err != nil {
			t.Fatal(err)
		}
		ok := mcptest.Eventually(10*time.Second, 20*time.Millisecond, finished.Load)
		t.Logf("mss %d: upstream wrote %d of 3000 events; finished: %v", mss, events.Load(), ok)
		if !ok {
			t.Fatalf("mss %d: the upstream could write only %d of 3000 events in 10 s: the tap is held by a client that reads nothing", mss, events.Load())
		}
	}
}

// A client that drops its connection right after the call's result reached
// it (the last answer goes out unflushed, with the response's end), or just
// before, resumes with the last ID it has and must get the result: never
// a lost answer, never one twice.
func TestReview33DropAroundTheResultThenResume(t *testing.T) {
	harness.MemoryStoreOnly(t, "the tap writes to its client itself only with the memory store's ReadyReader")
	const progress = 5
	up := &mcptest.Upstream{Tools: map[string]mcptest.Tool{
		"quick": func(w http.ResponseWriter, r *http.Request, req *mcptest.Request) {
			sseHeaders(w)
			rc := http.NewResponseController(w)
			for i := range progress {
				fmt.Fprintf(w, "id: e%d\ndata: %s\n\n", i, notice(fmt.Sprint("p", i)))
				rc.Flush()
			}
			fmt.Fprintf(w, "id: r\ndata: %s\n\n", resultFor(req.ID))
			rc.Flush()
			// A conforming upstream closes now; this one keeps the
			// stream open a little (the unflushed answer's timer).
			if id, _ := strconv.Atoi(string(req.ID)); id >= 200 {
				time.Sleep(30 * time.Millisecond)
			}
		},
	}}
	_, cl, host := sessionBehind(t, up)
	for i := range 40 {
		id := 100 + i
		if i%2 == 1 {
			id = 200 + i // the upstream keeps these open 30 ms after the result
		}
		conn := dialTuned(t, host, 0, 0)
		io.WriteString(conn, rawCall("x", cl.SessionID, "2025-11-25", id, "quick"))
		br := bufio.NewReader(conn)
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("call %d: %v", id, err)
		}
		// Read up to the k-th data event, k = i%(progress+2): 0..progress
		// progress events, then the result too.
		want := i % (progress + 2)
		r := mcptest.NewSSEReader(resp.Body, 4096)
		lastID, got, sawResult := "", 0, false
		for got < want || lastID == "" {
			ev, err := r.Next()
			if err != nil {
				t.Fatalf("call %d: reading: %v", id, err)
			}
			if strings.TrimSpace(ev.Data) == "" {
				if ev.ID != "" {
					lastID = ev.ID
				}
				continue
			}
			got++
			lastID = ev.ID
			if strings.Contains(ev.Data, `"result"`) {
				sawResult = true
			}
		}
		conn.Close() // drop, mid-stream or right after the result
		if lastID == "" {
			t.Fatalf("call %d: no event ID before the drop", id)
		}
		resp2 := cl.Resume(lastID)
		evs := harness.ReadEvents(t, resp2, 0)
		resp2.Body.Close()
		results := 0
		if sawResult {
			results++
		}
		for _, ev := range evs {
			if strings.Contains(ev.Data, `"result"`) {
				results++
			}
		}
		if results != 1 {
			t.Fatalf("call %d (dropped after %d data events, last ID %s): the result came %d times over the call and its resume; resume gave %+v", id, got, lastID, results, evs)
		}
	}
}

// A standalone GET that resumes with Last-Event-ID while events wait in
// the log and the upstream GET it opens is quiet: the replay goes out at
// once (review 33 found it left to the tap's next append or the quiet
// hand-off, 200 ms, where the relay in its own goroutine wrote it at once).
func TestReview33StandaloneReplayGoesOutAtOnce(t *testing.T) {
	harness.MemoryStoreOnly(t, "the tap writes to its client itself only with the memory store's ReadyReader")
	stop := make(chan struct{})
	up := &scripted{Upstream: &mcptest.Upstream{}, get: func(w http.ResponseWriter, r *http.Request, n int) {
		switch {
		case n == 1:
			sseHeaders(w)
			for i := 1; i <= 3; i++ {
				fmt.Fprintf(w, "id: u%d\ndata: %s\n\n", i, notice(fmt.Sprint("s", i)))
			}
		case n == 2:
			http.Error(w, "no more", http.StatusMethodNotAllowed) // the tap lets go of the stream
		default:
			sseHeaders(w) // open, quiet
			http.NewResponseController(w).Flush()
			select {
			case <-r.Context().Done():
			case <-stop:
			}
		}
	}}
	defer close(stop)
	c := harness.StartCaddy(t, mcptest.ResumeRoute(harness.StartHandler(t, up), ""))
	cl := harness.NewSession(t, c.Base(), "2025-11-25")
	resp := cl.Request("GET", "", nil)
	evs := harness.ReadEvents(t, resp, 0) // ends once the tap lets go
	resp.Body.Close()
	var first string
	for _, ev := range evs {
		if strings.Contains(ev.Data, `"s1"`) {
			first = ev.ID
		}
	}
	if first == "" {
		t.Fatalf("no s1 in the first GET: %+v", evs)
	}
	var lat []time.Duration
	for range 3 {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		began := time.Now()
		resp, err := cl.Client.Resume(ctx, first)
		if err != nil {
			cancel()
			t.Fatal(err)
		}
		r := mcptest.NewSSEReader(resp.Body, 4096)
		var took time.Duration
		for {
			ev, err := r.Next()
			if err != nil {
				t.Fatalf("resume: %v", err)
			}
			if strings.Contains(ev.Data, `"s2"`) {
				took = time.Since(began)
				break
			}
		}
		resp.Body.Close()
		cancel()
		lat = append(lat, took)
		time.Sleep(100 * time.Millisecond)
	}
	// Only the first resume opens a new upstream GET (its tap keeps it
	// after the client leaves; later resumes relay in their own goroutine).
	t.Logf("resumes of the standalone stream to their first replayed event: %v (the first opened the upstream GET)", lat)
	if lat[0] >= 150*time.Millisecond {
		t.Fatalf("a standalone resume with events waiting got its replay after %v (later resumes, relayed at once: %v): held back until the quiet hand-off", lat[0], lat[1:])
	}
}

// Quiet standalone stream: keep-alives must still come (the relay is
// handed off after the quiet period), and events after the first 4 KiB
// must arrive.
func TestReview33StandaloneKeepalivesAndBulk(t *testing.T) {
	harness.MemoryStoreOnly(t, "the tap writes to its client itself only with the memory store's ReadyReader")
	stop := make(chan struct{})
	up := &scripted{Upstream: &mcptest.Upstream{}, get: func(w http.ResponseWriter, r *http.Request, n int) {
		sseHeaders(w)
		rc := http.NewResponseController(w)
		fmt.Fprintf(w, "id: a%d\ndata: %s\n\n", n, notice("first"))
		rc.Flush()
		select { // quiet for 2.5 s
		case <-time.After(2500 * time.Millisecond):
		case <-r.Context().Done():
			return
		}
		pad := strings.Repeat("b", 200)
		for i := range 100 { // 30 KB
			fmt.Fprintf(w, "id: b%d-%d\ndata: %s\n\n", n, i, notice(fmt.Sprint(pad, i)))
			rc.Flush()
		}
		select {
		case <-r.Context().Done():
		case <-stop:
		}
	}}
	defer close(stop)
	c := harness.StartCaddy(t, mcptest.ResumeRoute(harness.StartHandler(t, up), "keepalive 1s"))
	cl := harness.NewSession(t, c.Base(), "2025-11-25")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := cl.Do(ctx, "GET", "", nil)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("GET: %v %v", resp, err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	keepalives, bs := 0, 0
	for bs < 100 {
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatalf("after %d keep-alives, %d of 100 bulk events: %v", keepalives, bs, err)
		}
		if strings.HasPrefix(line, ":") {
			keepalives++
		}
		if strings.HasPrefix(line, "data:") && strings.Contains(line, "bbbb") {
			bs++
		}
	}
	t.Logf("keep-alives during 2.5 s of quiet: %d; bulk events: %d", keepalives, bs)
	if keepalives < 2 {
		t.Fatalf("%d keep-alives in 2.5 s of quiet with keepalive 1s", keepalives)
	}
}

// Pipelined calls on one connection whose client reads slowly, with a
// small MSS and receive buffer: each call's upstream must finish as soon
// as it is read whatever the client does.
func TestReview33PipelinedSlowReaderNeverHoldsTheTap(t *testing.T) {
	harness.MemoryStoreOnly(t, "the tap writes to its client itself only with the memory store's ReadyReader")
	up := &mcptest.Upstream{FlushEach: true, KeepCalls: true}
	addr := harness.StartHandlerSndbuf(t, up, 4096)
	c := harness.StartCaddy(t, mcptest.ResumeRoute(addr, ""))
	cl := harness.NewSession(t, c.Base(), "2025-11-25")
	conn := dialTuned(t, fmt.Sprintf("127.0.0.1:%d", c.HTTPPort), 200, 1024)
	const calls = 200
	go func() {
		bw := bufio.NewWriter(conn)
		for i := 1; i <= calls; i++ {
			body := mcptest.CallBody(i, "count", mcptest.StreamArgs{N: 8 + i%40, Size: 20 + 7*(i%50)}, "tok")
			fmt.Fprintf(bw, "POST /mcp HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\n"+
				"Mcp-Session-Id: %s\r\nMcp-Protocol-Version: 2025-11-25\r\nContent-Length: %d\r\n\r\n%s", cl.SessionID, len(body), body)
		}
		bw.Flush()
	}()
	// The slow reader: 300 bytes every 5 ms.
	done := make(chan struct{})
	var read atomic.Int64
	go func() {
		defer close(done)
		buf := make([]byte, 300)
		for {
			n, err := conn.Read(buf)
			read.Add(int64(n))
			if err != nil {
				return
			}
			time.Sleep(5 * time.Millisecond)
		}
	}()
	var last *mcptest.Call
	since := time.Now()
	deadline := time.Now().Add(8 * time.Second)
	worst := time.Duration(0)
	for time.Now().Before(deadline) {
		cur := up.LastCall(cl.SessionID)
		if cur != last {
			last, since = cur, time.Now()
		}
		if last != nil && !last.Finished.Load() {
			if d := time.Since(since); d > worst {
				worst = d
			}
			if time.Since(since) > 3*time.Second {
				t.Fatalf("a pipelined call's upstream has written %d of %d events for 3 s (client read %d bytes): the tap waits on the client",
					last.Events.Load(), last.Args.N, read.Load())
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Logf("client read %d bytes in 8 s; longest unfinished upstream call: %v", read.Load(), worst)
}

// Two mcp_resume handlers (two zones) on one server, reloaded several times
// (forced reloads of changed configs), with a call in flight across each
// reload whose first events the tap wrote itself: every call gets its
// result, and the process's goroutines do not grow with the reloads.
func TestReview33ReloadsWithTwoHandlers(t *testing.T) {
	harness.MemoryStoreOnly(t, "the tap writes to its client itself only with the memory store's ReadyReader")
	up := &mcptest.Upstream{FlushEach: true}
	addr := harness.StartHandler(t, up)
	site := func(k int) string {
		return fmt.Sprintf(`	route /mcp* {
		mcp_resume {
			zone za
			keepalive %ds
		}
		reverse_proxy %s
	}
	route /other* {
		mcp_resume {
			zone zb
		}
		reverse_proxy %s
	}`, 10+k, addr, addr)
	}
	c := harness.StartCaddy(t, site(0))
	a := harness.NewRawClient(t, c.Base(), "2025-11-25")
	a.Initialize()
	b := harness.NewRawClient(t, c.Base(), "2025-11-25")
	b.URL = c.Base() + "/other"
	b.Initialize()
	check := func(cl *harness.RawClient, id int, what string) {
		t.Helper()
		cl.Reconnect()
		evs := cl.CallToEnd(id, "count", map[string]any{"n": 5, "size": 100})
		if len(evs) == 0 || !strings.Contains(evs[len(evs)-1].Data, `"result"`) {
			t.Fatalf("%s: call %d got no result: %+v", what, id, evs)
		}
	}
	check(a, 1, "before reloads")
	check(b, 1, "before reloads")
	time.Sleep(500 * time.Millisecond)
	base := runtimeGoroutines()
	reloads := 6
	if v := os.Getenv("R33_RELOADS"); v != "" {
		reloads, _ = strconv.Atoi(v)
	}
	for k := 1; k <= reloads; k++ {
		token := fmt.Sprint("hold", k)
		up.Hold(token)
		a.Reconnect()
		resp := a.Call(100+k, "count", map[string]any{"n": 6, "size": 50, "hold": token, "pre": 2})
		got := make(chan []mcptest.Event, 1)
		go func() {
			evs, _ := mcptest.ReadEvents(resp.Body, 0, 20*time.Second)
			resp.Body.Close()
			got <- evs
		}()
		time.Sleep(50 * time.Millisecond) // the first events reach the client (the tap wrote them)
		c.Load(t, site(k))
		up.Release(token)
		evs := <-got
		results := 0
		for _, ev := range evs {
			if strings.Contains(ev.Data, `"result"`) {
				results++
			}
		}
		if results != 1 {
			// A response the reload cut: the client resumes.
			last := ""
			for _, ev := range evs {
				if ev.ID != "" {
					last = ev.ID
				}
			}
			if last == "" {
				t.Fatalf("reload %d: the in-flight call got %d events and no ID to resume from", k, len(evs))
			}
			a.Reconnect()
			r2 := a.Resume(last)
			evs2 := harness.ReadEvents(t, r2, 0)
			r2.Body.Close()
			for _, ev := range evs2 {
				if strings.Contains(ev.Data, `"result"`) {
					results++
				}
			}
			t.Logf("reload %d: the in-flight call was cut after %d events; resumed: %d more", k, len(evs), len(evs2))
		}
		if results != 1 {
			t.Fatalf("reload %d: the in-flight call's result came %d times", k, results)
		}
		check(a, 200+k, fmt.Sprintf("after reload %d", k))
		check(b, 200+k, fmt.Sprintf("after reload %d", k))
	}
	time.Sleep(time.Second)
	end := runtimeGoroutines()
	t.Logf("goroutines after the first calls: %d; after %d reloads: %d", base, reloads, end)
	if end > base+8*reloads {
		t.Errorf("goroutines grew from %d to %d over %d reloads", base, end, reloads)
	}
}

func runtimeGoroutines() int { return runtime.NumGoroutine() }

// The call's result, then more data events from the upstream, each within
// flushSoon (5 ms) of the one before (log notifications after the answer,
// on the same POST stream): the tap writes the result unflushed and resets
// its flush timer with each of them, so the client gets its answer only
// when the budget of 4 KiB runs out or the upstream pauses.
func TestReview33ResultNotHeldByEventsAfterIt(t *testing.T) {
	harness.MemoryStoreOnly(t, "the tap writes to its client itself only with the memory store's ReadyReader")
	var resultAt atomic.Int64
	up := &mcptest.Upstream{Tools: map[string]mcptest.Tool{
		"chatty": func(w http.ResponseWriter, r *http.Request, req *mcptest.Request) {
			sseHeaders(w)
			rc := http.NewResponseController(w)
			fmt.Fprintf(w, "id: p\ndata: %s\n\n", notice("working"))
			rc.Flush()
			time.Sleep(20 * time.Millisecond)
			resultAt.Store(time.Now().UnixNano())
			fmt.Fprintf(w, "id: r\ndata: %s\n\n", resultFor(req.ID))
			rc.Flush()
			for i := range 60 {
				time.Sleep(3 * time.Millisecond)
				fmt.Fprintf(w, "id: l%d\ndata: %s\n\n", i, notice("l"))
				rc.Flush()
			}
			time.Sleep(time.Second)
		},
	}}
	c := harness.StartCaddy(t, mcptest.ResumeRoute(harness.StartHandler(t, up), ""))
	cl := harness.NewSession(t, c.Base(), "2025-11-25")
	var delays []time.Duration
	for i := range 3 {
		conn := dialTuned(t, fmt.Sprintf("127.0.0.1:%d", c.HTTPPort), 0, 0)
		io.WriteString(conn, rawCall("x", cl.SessionID, "2025-11-25", 10+i, "chatty"))
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			t.Fatal(err)
		}
		r := mcptest.NewSSEReader(resp.Body, 4096)
		for {
			ev, err := r.Next()
			if err != nil {
				t.Fatal(err)
			}
			if strings.Contains(ev.Data, `"result"`) {
				delays = append(delays, time.Duration(time.Now().UnixNano()-resultAt.Load()))
				break
			}
		}
		conn.Close()
	}
	t.Logf("from the upstream's result to the client's: %v", delays)
	slow := 0
	for _, d := range delays {
		if d > 50*time.Millisecond {
			slow++
		}
	}
	if slow >= 2 {
		t.Fatalf("the result reached the client more than 50 ms after the upstream sent it in %d of 3 calls (%v): held unflushed while events follow it", slow, delays)
	}
}

// The response's headers and the priming event go out as the upstream's
// response begins, not with the first event or the quiet hand-off.
func TestReview33HeadersAndPrimingGoOutAtOnce(t *testing.T) {
	harness.MemoryStoreOnly(t, "the tap writes to its client itself only with the memory store's ReadyReader")
	var headersAt atomic.Int64
	up := &mcptest.Upstream{Tools: map[string]mcptest.Tool{
		"slow": func(w http.ResponseWriter, r *http.Request, req *mcptest.Request) {
			sseHeaders(w)
			http.NewResponseController(w).Flush()
			headersAt.Store(time.Now().UnixNano())
			if os.Getenv("R33_DUMP") != "" {
				time.Sleep(2 * time.Millisecond)
				buf := make([]byte, 4<<20)
				buf = buf[:runtime.Stack(buf, true)]
				for _, g := range strings.Split(string(buf), "\n\n") {
					if strings.Contains(g, "resume.") {
						fmt.Fprintf(os.Stderr, "R33DUMP %s\n\n", g)
					}
				}
			}
			time.Sleep(time.Second)
			fmt.Fprintf(w, "id: r\ndata: %s\n\n", resultFor(req.ID))
		},
	}}
	// R33_H1ONLY: servers { protocols h1 }, where Caddy wraps each
	// connection in a type that hides its socket: no inline writes.
	c := harness.StartCaddyWithGlobal(t, os.Getenv("R33_GLOBAL"), mcptest.ResumeRoute(harness.StartHandler(t, up), ""))
	cl := harness.NewSession(t, c.Base(), "2025-11-25")
	var hdr, prime []time.Duration
	for i := range 3 {
		conn := dialTuned(t, fmt.Sprintf("127.0.0.1:%d", c.HTTPPort), 0, 0)
		io.WriteString(conn, rawCall("x", cl.SessionID, "2025-11-25", 10+i, "slow"))
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			t.Fatal(err)
		}
		hdr = append(hdr, time.Duration(time.Now().UnixNano()-headersAt.Load()))
		ev, err := mcptest.NewSSEReader(resp.Body, 4096).Next()
		if err != nil {
			t.Fatal(err)
		}
		prime = append(prime, time.Duration(time.Now().UnixNano()-headersAt.Load()))
		if ev.ID == "" || strings.TrimSpace(ev.Data) != "" {
			t.Fatalf("first event %+v, want the priming event", ev)
		}
		conn.Close()
	}
	t.Logf("upstream's headers to the client's: %v; to its priming event: %v", hdr, prime)
	if min(prime[0], prime[1], prime[2]) > 100*time.Millisecond {
		t.Fatalf("the client got its response's priming event %v after the upstream's headers at best: not flushed at once", min(prime[0], prime[1], prime[2]))
	}
}
