package follow

// Review 34: attacks on the relay hand-off as of 01ea7c7 (the tap writing
// the start of a response itself; 1 ms header timer, 5 ms answer timer,
// 200 ms quiet timer), on the in-process Caddy with real sockets.

import (
	"bufio"
	"crypto/tls"
	"fmt"
	"io"
	"math/rand"
	"net"
	"net/http"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/internal/mcptest"
	"github.com/mcpresume/caddy-mcp-resume/tests/harness"
)

// r34Tool behaves by the request id's pattern (id % 7), around each timer
// of the hand-off. Every data event is unique: "c<id>-<k>".
func r34Tool(w http.ResponseWriter, r *http.Request, req *mcptest.Request) {
	id, _ := strconv.Atoi(string(req.ID))
	sseHeaders(w)
	rc := http.NewResponseController(w)
	ev := func(k int, pad int) {
		fmt.Fprintf(w, "id: u%d\ndata: %s\n\n", k, notice(fmt.Sprintf("c%d-%d%s", id, k, strings.Repeat("x", pad))))
		rc.Flush()
	}
	res := func() {
		fmt.Fprintf(w, "id: r\ndata: %s\n\n", resultFor(req.ID))
		rc.Flush()
	}
	switch id % 7 {
	case 0: // all at once
		ev(0, 0)
		ev(1, 0)
		res()
	case 1: // around the 1 ms header timer
		time.Sleep(time.Duration(id%3) * 500 * time.Microsecond)
		ev(0, 0)
		time.Sleep(time.Millisecond)
		res()
	case 2: // answer, then the stream stays open past the 5 ms timer
		ev(0, 0)
		res()
		time.Sleep(time.Duration(3+id%5) * time.Millisecond)
	case 3: // answer, then events after it
		res()
		for k := range 3 {
			time.Sleep(2 * time.Millisecond)
			ev(k, 0)
		}
	case 4: // an event around the 4 KiB budget, then the answer
		ev(0, 3300+(id*37)%900)
		res()
	case 5: // many small events crossing the budget
		for k := range 60 {
			ev(k, 40)
		}
		res()
	case 6: // a pause near the quiet hand-off
		ev(0, 0)
		time.Sleep(time.Duration(190+id%20) * time.Millisecond)
		res()
	}
}

// r34Expected is the data events pattern id%7 sends, in order ("R" for the result).
func r34Expected(id int) []string {
	var out []string
	add := func(n int) {
		for k := range n {
			out = append(out, fmt.Sprintf("c%d-%d", id, k))
		}
	}
	switch id % 7 {
	case 0:
		add(2)
		out = append(out, "R")
	case 1, 2, 4, 6:
		add(1)
		out = append(out, "R")
	case 3:
		out = append(out, "R")
		add(3)
	case 5:
		add(60)
		out = append(out, "R")
	}
	return out
}

// r34Label names a data event: its "c<id>-<k>", or "R" for a result.
func r34Label(data string) string {
	if strings.Contains(data, `"result"`) {
		return "R"
	}
	i := strings.Index(data, `"c`)
	if i < 0 {
		return "?" + data
	}
	s := data[i+1:]
	j := strings.IndexAny(s, `x"`)
	if j < 0 {
		return "?" + data
	}
	return s[:j]
}

// readRaw reads a raw HTTP/1.1 response's events from conn into the
// returned channel-backed recorder until the connection ends.
type r34Rec struct {
	mu     sync.Mutex
	evs    []mcptest.Event
	done   chan struct{}
	err    error
	status int
	doneAt time.Time
}

func r34Read(conn net.Conn) *r34Rec {
	rec := &r34Rec{done: make(chan struct{})}
	go func() {
		defer close(rec.done)
		defer func() { rec.doneAt = time.Now() }()
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			rec.err = err
			return
		}
		rec.status = resp.StatusCode
		r := mcptest.NewSSEReader(resp.Body, 4096)
		for {
			ev, err := r.Next()
			if err != nil {
				rec.err = err
				return
			}
			rec.mu.Lock()
			rec.evs = append(rec.evs, ev)
			rec.mu.Unlock()
		}
	}()
	return rec
}

func (rec *r34Rec) snapshot() []mcptest.Event {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	return append([]mcptest.Event(nil), rec.evs...)
}

// A client drops its connection at a random moment in the first 10 ms of
// a call (around the header, answer and quiet timers, and the 4 KiB
// budget), then resumes from the last ID it has: what it had plus what the
// resume gives must be every data event exactly once, in order.
func TestReview34DropAtRandomMomentsThenResumeExactlyOnce(t *testing.T) {
	harness.MemoryStoreOnly(t, "the tap writes to its client itself only with the memory store's ReadyReader")
	up := &mcptest.Upstream{Tools: map[string]mcptest.Tool{"t": r34Tool}}
	_, cl, host := sessionBehind(t, up)
	r34Drops(t, cl, func() net.Conn { return dialTuned(t, host, 0, 0) }, 140)
}

// Over HTTP/1.1 on TLS, the same.
func TestReview34TLSDropAtRandomMomentsThenResumeExactlyOnce(t *testing.T) {
	harness.MemoryStoreOnly(t, "the tap writes to its client itself only with the memory store's ReadyReader")
	up := &mcptest.Upstream{Tools: map[string]mcptest.Tool{"t": r34Tool}}
	addr := harness.StartHandler(t, up)
	port := harness.CaddyPort(t)
	harness.StartCaddyWithSites(t, "", mcptest.ResumeRoute(addr, ""),
		mcptest.Site{Port: port, Body: "\ttls internal {\n\t\ton_demand\n\t}\n" + mcptest.ResumeRoute(addr, "")})
	tr := &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true, ServerName: "localhost"},
		TLSNextProto: map[string]func(string, *tls.Conn) http.RoundTripper{}}
	t.Cleanup(tr.CloseIdleConnections)
	cl := harness.NewRawClientOver(t, fmt.Sprintf("https://127.0.0.1:%d", port), "2025-11-25", &http.Client{Transport: tr, Timeout: 10 * time.Second})
	cl.Initialize()
	host := fmt.Sprintf("127.0.0.1:%d", port)
	r34Drops(t, cl, func() net.Conn {
		tc := tls.Client(dialTuned(t, host, 0, 0), &tls.Config{InsecureSkipVerify: true, ServerName: "localhost", NextProtos: []string{"http/1.1"}})
		if err := tc.Handshake(); err != nil {
			t.Fatal(err)
		}
		return tc
	}, 100)
}

func r34Drops(t *testing.T, cl *harness.RawClient, dial func() net.Conn, n int) {
	rng := rand.New(rand.NewSource(time.Now().UnixNano()))
	noID, bad := 0, 0
	for i := range n {
		id := 1000 + i
		conn := dial()
		if _, err := io.WriteString(conn, rawCall("x", cl.SessionID, "2025-11-25", id, "t")); err != nil {
			t.Fatal(err)
		}
		rec := r34Read(conn)
		time.Sleep(time.Duration(rng.Intn(10000)) * time.Microsecond)
		conn.Close()
		<-rec.done
		got := rec.snapshot()
		last := ""
		var labels []string
		for _, ev := range got {
			if ev.ID != "" {
				last = ev.ID
			}
			if strings.TrimSpace(ev.Data) != "" {
				labels = append(labels, r34Label(ev.Data))
			}
		}
		if last == "" {
			noID++
			continue
		}
		resp := cl.Resume(last)
		evs, err := mcptest.ReadEvents(resp.Body, 0, 5*time.Second)
		resp.Body.Close()
		if err != nil {
			t.Errorf("call %d: resume from %s: %v", id, last, err)
			bad++
			continue
		}
		before := len(labels)
		for _, ev := range evs {
			if strings.TrimSpace(ev.Data) != "" {
				labels = append(labels, r34Label(ev.Data))
			}
		}
		want := r34Expected(id)
		if strings.Join(labels, ",") != strings.Join(want, ",") {
			bad++
			t.Errorf("call %d (pattern %d): before the drop %d data events (last ID %s), then the resume: got %v, want %v",
				id, id%7, before, last, labels, want)
		}
	}
	t.Logf("%d calls dropped at random: %d without an ID to resume from, %d wrong", n, noID, bad)
}

// A resume of the call's stream on a second connection while the first
// is still open and the tap writes to it: the resume must get every event
// after its Last-Event-ID exactly once, at once, and the first connection
// must be cut, not left open silently.
func TestReview34ResumeTakesOverAnInlineRelay(t *testing.T) {
	harness.MemoryStoreOnly(t, "the tap writes to its client itself only with the memory store's ReadyReader")
	gaps := []time.Duration{0, 500 * time.Microsecond, time.Millisecond, 3 * time.Millisecond, 20 * time.Millisecond, 150 * time.Millisecond}
	up := &mcptest.Upstream{Tools: map[string]mcptest.Tool{
		"slow": func(w http.ResponseWriter, r *http.Request, req *mcptest.Request) {
			id, _ := strconv.Atoi(string(req.ID))
			gap := gaps[id%len(gaps)]
			sseHeaders(w)
			rc := http.NewResponseController(w)
			for k := range 4 {
				fmt.Fprintf(w, "id: u%d\ndata: %s\n\n", k, notice(fmt.Sprintf("c%d-%d", id, k)))
				rc.Flush()
				time.Sleep(gap)
			}
			fmt.Fprintf(w, "id: r\ndata: %s\n\n", resultFor(req.ID))
			rc.Flush()
		},
	}}
	_, cl, host := sessionBehind(t, up)
	var cutAfter []time.Duration
	for i := range 24 {
		id := 2000 + i
		conn := dialTuned(t, host, 0, 0)
		io.WriteString(conn, rawCall("x", cl.SessionID, "2025-11-25", id, "slow"))
		rec := r34Read(conn)
		// Wait for the first event with an ID (the priming event, or later
		// ones on odd calls).
		wantEvs := 1 + i%2
		var from string
		ok := mcptest.Eventually(3*time.Second, 100*time.Microsecond, func() bool {
			evs := rec.snapshot()
			if len(evs) >= wantEvs {
				from = evs[wantEvs-1].ID
				return true
			}
			return false
		})
		if !ok || from == "" {
			t.Fatalf("call %d: no event on the first connection", id)
		}
		began := time.Now()
		resp := cl.Resume(from)
		r := mcptest.NewSSEReader(resp.Body, 4096)
		var labels []string
		var firstAt time.Duration
		for {
			ev, err := r.Next()
			if err != nil {
				if err != io.EOF {
					t.Errorf("call %d: resume: %v", id, err)
				}
				break
			}
			if strings.TrimSpace(ev.Data) != "" {
				if firstAt == 0 {
					firstAt = time.Since(began)
				}
				labels = append(labels, r34Label(ev.Data))
			}
		}
		resp.Body.Close()
		resumedAt := time.Since(began)
		// What the first connection had before the resume's position.
		prior := rec.snapshot()
		var want []string
		for k := range 4 {
			want = append(want, fmt.Sprintf("c%d-%d", id, k))
		}
		want = append(want, "R")
		skip := 0
		for _, ev := range prior[:wantEvs] {
			if strings.TrimSpace(ev.Data) != "" {
				skip++
			}
		}
		if strings.Join(labels, ",") != strings.Join(want[skip:], ",") {
			t.Errorf("call %d (gap %v): resume from %s got %v, want %v", id, gaps[id%len(gaps)], from, labels, want[skip:])
		}
		select {
		case <-rec.done:
			cutAfter = append(cutAfter, rec.doneAt.Sub(began))
			if d := rec.doneAt.Sub(began); d > resumedAt+50*time.Millisecond || (gaps[id%len(gaps)] >= 20*time.Millisecond && d > 300*time.Millisecond) {
				t.Errorf("call %d (gap %v): the first connection ended %v after the resume took over (the resume's stream ended after %v)", id, gaps[id%len(gaps)], d, resumedAt)
			}
		case <-time.After(3 * time.Second):
			t.Errorf("call %d (gap %v): the first connection still open 3 s after the resume took over (resume ended after %v); it had %d events",
				id, gaps[id%len(gaps)], resumedAt, len(rec.snapshot()))
		}
		conn.Close()
		_ = firstAt
	}
	t.Logf("first connections closed after (since the resume): %v", cutAfter)
}

// The upstream sends its answer and keeps the stream open (the tap writes
// the answer unflushed, 5 ms timer); Caddy stops 0–4.5 ms after the answer
// left the upstream. Plain reverse_proxy had flushed it at once: the client
// must have the answer. (On exit the memory store's zone drains: the call
// goes on until the upstream ends it, 1.5 s here, so each stop takes that
// long, and the relay's cut is not reached within the 5 ms window.)
func TestReview34StopRightAfterAnUnflushedAnswer(t *testing.T) {
	harness.MemoryStoreOnly(t, "the tap writes to its client itself only with the memory store's ReadyReader")
	sent := make(chan struct{}, 1)
	up := &mcptest.Upstream{Tools: map[string]mcptest.Tool{
		"open": func(w http.ResponseWriter, r *http.Request, req *mcptest.Request) {
			sseHeaders(w)
			rc := http.NewResponseController(w)
			fmt.Fprintf(w, "id: p\ndata: %s\n\n", notice("p"))
			fmt.Fprintf(w, "id: r\ndata: %s\n\n", resultFor(req.ID))
			rc.Flush()
			select {
			case sent <- struct{}{}:
			default:
			}
			select {
			case <-r.Context().Done():
			case <-time.After(1500 * time.Millisecond):
			}
		},
	}}
	addr := harness.StartHandler(t, up)
	lost := 0
	const n = 4
	for i := range n {
		c := harness.StartCaddy(t, mcptest.ResumeRoute(addr, ""))
		cl := harness.NewSession(t, c.Base(), "2025-11-25")
		conn := dialTuned(t, fmt.Sprintf("127.0.0.1:%d", c.HTTPPort), 0, 0)
		io.WriteString(conn, rawCall("x", cl.SessionID, "2025-11-25", 1, "open"))
		rec := r34Read(conn)
		select {
		case <-sent:
		case <-time.After(3 * time.Second):
			t.Fatal("the upstream never answered")
		}
		time.Sleep(time.Duration(i) * 1500 * time.Microsecond)
		harness.StopCaddy(t)
		select {
		case <-rec.done:
		case <-time.After(5 * time.Second):
			t.Fatalf("stop %d: the client's connection still open 5 s after Caddy stopped", i)
		}
		got := false
		for _, ev := range rec.snapshot() {
			got = got || strings.Contains(ev.Data, `"result"`)
		}
		if !got {
			lost++
			t.Errorf("stop %d (%v after the answer): the client never got the answer the upstream sent; it got %+v (%v)",
				i, time.Duration(i)*1500*time.Microsecond, rec.snapshot(), rec.err)
		}
		conn.Close()
	}
	t.Logf("answers lost to a stop: %d of %d", lost, n)
}

// Many short inline calls, some with their client gone at once: the
// process's goroutines come back to where they were.
func TestReview34NoGoroutineLeakAfterManyInlineCalls(t *testing.T) {
	harness.MemoryStoreOnly(t, "the tap writes to its client itself only with the memory store's ReadyReader")
	up := &mcptest.Upstream{Tools: map[string]mcptest.Tool{"t": r34Tool}}
	_, cl, host := sessionBehind(t, up)
	run := func(k int) {
		for i := range k {
			id := 7*i + []int{0, 1, 2, 3, 4, 5}[i%6] // no pattern 6
			conn := dialTuned(t, host, 0, 0)
			io.WriteString(conn, rawCall("x", cl.SessionID, "2025-11-25", 5000+id, "t"))
			rec := r34Read(conn)
			if i%3 == 0 {
				time.Sleep(time.Duration(i%5) * time.Millisecond)
				conn.Close()
			}
			<-rec.done
			conn.Close()
		}
	}
	run(20)
	time.Sleep(300 * time.Millisecond)
	base := runtime.NumGoroutine()
	run(180)
	var end int
	mcptest.Eventually(3*time.Second, 50*time.Millisecond, func() bool {
		end = runtime.NumGoroutine()
		return end <= base+10
	})
	t.Logf("goroutines: %d before, %d after 180 calls", base, end)
	if end > base+10 {
		buf := make([]byte, 1<<20)
		buf = buf[:runtime.Stack(buf, true)]
		t.Fatalf("goroutines grew from %d to %d over 180 calls:\n%.6000s", base, end, buf)
	}
}

// HTTP/1.1 over TLS: the send-queue check must find the socket under
// Caddy's TLS connection (or skip the inline path), and the call must be
// whole either way.
func TestReview34TLSHTTP1Calls(t *testing.T) {
	harness.MemoryStoreOnly(t, "the tap writes to its client itself only with the memory store's ReadyReader")
	up := &mcptest.Upstream{Tools: map[string]mcptest.Tool{"t": r34Tool}}
	addr := harness.StartHandler(t, up)
	port := harness.CaddyPort(t)
	c := harness.StartCaddyWithSites(t, "metrics", mcptest.ResumeRoute(addr, ""),
		mcptest.Site{Port: port, Body: "\ttls internal {\n\t\ton_demand\n\t}\n" + mcptest.ResumeRoute(addr, "")})
	_ = c
	// The site address ":PORT" with tls internal serves HTTPS on PORT.
	tr := &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true, ServerName: "localhost"},
		ForceAttemptHTTP2: false, TLSNextProto: map[string]func(string, *tls.Conn) http.RoundTripper{}}
	t.Cleanup(tr.CloseIdleConnections)
	base := fmt.Sprintf("https://127.0.0.1:%d", port)
	cl := harness.NewRawClientOver(t, base, "2025-11-25", &http.Client{Transport: tr, Timeout: 10 * time.Second})
	cl.Initialize()
	m0, err := c.Metrics()
	if err != nil {
		t.Fatal(err)
	}
	for i := range 14 {
		id := 3000 + i
		if id%7 == 6 {
			continue
		}
		resp := cl.Call(id, "t", nil)
		if resp.ProtoMajor != 1 {
			t.Fatalf("HTTP/%d", resp.ProtoMajor)
		}
		evs := harness.ReadEvents(t, resp, 0)
		resp.Body.Close()
		var labels []string
		for _, ev := range evs {
			if strings.TrimSpace(ev.Data) != "" {
				labels = append(labels, r34Label(ev.Data))
			}
		}
		if strings.Join(labels, ",") != strings.Join(r34Expected(id), ",") {
			t.Errorf("call %d over TLS: %v, want %v", id, labels, r34Expected(id))
		}
	}
	m1, err := c.Metrics()
	if err != nil {
		t.Fatal(err)
	}
	key := func(w string) string { return `caddy_mcp_resume_relays_total{writer="` + w + `"}` }
	tap := m1.Series[key("tap")] - m0.Series[key("tap")]
	gor := m1.Series[key("goroutine")] - m0.Series[key("goroutine")]
	t.Logf("TLS HTTP/1.1 calls: relays by the tap %v, by a goroutine %v", tap, gor)
	if tap == 0 {
		t.Logf("no call over TLS HTTP/1.1 took the tap's way (the send-queue check did not find the socket)")
	}
}

// HTTP/1.0 clients (no chunking: the response ends with the connection)
// and HTTP/1.1 with Connection: close get every call whole.
func TestReview34HTTP10AndConnectionClose(t *testing.T) {
	harness.MemoryStoreOnly(t, "the tap writes to its client itself only with the memory store's ReadyReader")
	up := &mcptest.Upstream{Tools: map[string]mcptest.Tool{"t": r34Tool}}
	_, cl, host := sessionBehind(t, up)
	for i := range 24 {
		id := 4000 + i
		if id%7 == 6 {
			continue
		}
		req := rawCall("x", cl.SessionID, "2025-11-25", id, "t", "Connection: close")
		if i%2 == 0 {
			req = strings.Replace(req, "HTTP/1.1", "HTTP/1.0", 1)
		}
		conn := dialTuned(t, host, 0, 0)
		conn.SetDeadline(time.Now().Add(5 * time.Second))
		io.WriteString(conn, req)
		rec := r34Read(conn)
		<-rec.done
		var labels []string
		for _, ev := range rec.snapshot() {
			if strings.TrimSpace(ev.Data) != "" {
				labels = append(labels, r34Label(ev.Data))
			}
		}
		if strings.Join(labels, ",") != strings.Join(r34Expected(id), ",") || rec.err != io.EOF {
			t.Errorf("call %d (%s): %v (%v), want %v", id, map[bool]string{true: "HTTP/1.0", false: "Connection: close"}[i%2 == 0],
				labels, rec.err, r34Expected(id))
		}
		conn.Close()
	}
}

// DELETE of the session while the tap writes the call's response itself
// (headers and a progress event out, the upstream working): the client
// must learn its call failed (a JSON-RPC error for its request), promptly,
// never a clean end with nothing.
func TestReview34DeleteDuringAnInlineRelay(t *testing.T) {
	harness.MemoryStoreOnly(t, "the tap writes to its client itself only with the memory store's ReadyReader")
	up := &mcptest.Upstream{Tools: map[string]mcptest.Tool{
		"work": func(w http.ResponseWriter, r *http.Request, req *mcptest.Request) {
			sseHeaders(w)
			rc := http.NewResponseController(w)
			fmt.Fprintf(w, "id: p\ndata: %s\n\n", notice("p"))
			rc.Flush()
			select {
			case <-r.Context().Done():
				return
			case <-time.After(2 * time.Second):
			}
			fmt.Fprintf(w, "id: r\ndata: %s\n\n", resultFor(req.ID))
		},
	}}
	c := harness.StartCaddy(t, mcptest.ResumeRoute(harness.StartHandler(t, up), ""))
	host := fmt.Sprintf("127.0.0.1:%d", c.HTTPPort)
	waits := []time.Duration{0, 500 * time.Microsecond, 2 * time.Millisecond, 30 * time.Millisecond, 150 * time.Millisecond, 250 * time.Millisecond}
	for i, wait := range waits {
		cl := harness.NewSession(t, c.Base(), "2025-11-25")
		conn := dialTuned(t, host, 0, 0)
		io.WriteString(conn, rawCall("x", cl.SessionID, "2025-11-25", 1, "work"))
		rec := r34Read(conn)
		if !mcptest.Eventually(3*time.Second, 100*time.Microsecond, func() bool {
			for _, ev := range rec.snapshot() {
				if strings.Contains(ev.Data, `"p"`) {
					return true
				}
			}
			return false
		}) {
			t.Fatalf("delete %d: no progress event", i)
		}
		time.Sleep(wait)
		began := time.Now()
		resp := cl.Request("DELETE", "", nil)
		resp.Body.Close()
		select {
		case <-rec.done:
		case <-time.After(3 * time.Second):
			t.Errorf("delete %d (%v after the progress): the call's response still open 3 s after DELETE", i, wait)
			conn.Close()
			<-rec.done
		}
		took := time.Since(began)
		errs := 0
		for _, ev := range rec.snapshot() {
			if strings.Contains(ev.Data, `"error"`) && strings.Contains(ev.Data, `"id":1`) {
				errs++
			}
		}
		t.Logf("delete %d (%v after the progress): the response ended %v after DELETE (%v) with %d errors for request 1: %+v", i, wait, took, rec.err, errs, rec.snapshot())
		if errs != 1 {
			t.Errorf("delete %d: the call's client got %d JSON-RPC errors for its request, want 1", i, errs)
		}
		conn.Close()
	}
}

// An upstream that closes the POST's stream before the answer (SSE
// polling, retry 5 ms): the tap reconnects with GET + Last-Event-ID, and
// the relay the tap writes itself must pass the reconnect's events on
// promptly, in order, once.
func TestReview34PollingUpstreamThroughTheInlineRelay(t *testing.T) {
	harness.MemoryStoreOnly(t, "the tap writes to its client itself only with the memory store's ReadyReader")
	var sentAt atomic.Int64
	up := &scripted{Upstream: &mcptest.Upstream{Tools: map[string]mcptest.Tool{
		"poll": func(w http.ResponseWriter, r *http.Request, req *mcptest.Request) {
			sseHeaders(w)
			fmt.Fprintf(w, "id: %s-0\nretry: 5\ndata: %s\n\n", req.ID, notice("p0"))
		},
	}}}
	up.get = func(w http.ResponseWriter, r *http.Request, n int) {
		last := r.Header.Get("Last-Event-ID")
		id, _, _ := strings.Cut(last, "-")
		sseHeaders(w)
		rc := http.NewResponseController(w)
		if strings.HasSuffix(last, "-0") {
			fmt.Fprintf(w, "id: %s-1\ndata: %s\n\n", id, notice("p1"))
			rc.Flush()
			time.Sleep(time.Duration(n%3) * time.Millisecond)
			sentAt.Store(time.Now().UnixNano())
			fmt.Fprintf(w, "id: %s-2\ndata: %s\n\n", id, resultFor([]byte(id)))
			rc.Flush()
		}
	}
	_, cl, host := sessionBehind(t, up)
	var lat []time.Duration
	for i := range 8 {
		id := 10 + i
		conn := dialTuned(t, host, 0, 0)
		conn.SetDeadline(time.Now().Add(5 * time.Second))
		io.WriteString(conn, rawCall("x", cl.SessionID, "2025-11-25", id, "poll"))
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			t.Fatal(err)
		}
		r := mcptest.NewSSEReader(resp.Body, 4096)
		var labels []string
		for {
			ev, err := r.Next()
			if err != nil {
				t.Fatalf("call %d: %v after %v", id, err, labels)
			}
			if strings.TrimSpace(ev.Data) == "" {
				continue
			}
			switch {
			case strings.Contains(ev.Data, `"result"`):
				labels = append(labels, "R")
				lat = append(lat, time.Duration(time.Now().UnixNano()-sentAt.Load()))
			case strings.Contains(ev.Data, "p0"):
				labels = append(labels, "p0")
			case strings.Contains(ev.Data, "p1"):
				labels = append(labels, "p1")
			default:
				labels = append(labels, "?")
			}
			if labels[len(labels)-1] == "R" {
				break
			}
		}
		if strings.Join(labels, ",") != "p0,p1,R" {
			t.Errorf("call %d: %v, want p0,p1,R", id, labels)
		}
		conn.Close()
	}
	t.Logf("from the upstream's result (on the reconnect GET) to the client: %v", lat)
	slow := 0
	for _, d := range lat {
		if d > 50*time.Millisecond {
			slow++
		}
	}
	if slow > len(lat)/2 {
		t.Errorf("%d of %d results reached the client over 50 ms after the upstream sent them: %v", slow, len(lat), lat)
	}
}

// The smallest events an upstream can send ("data: x", 9 bytes stored),
// each in a read of its own, so the tap flushes each alone: per event the
// client's connection carries the proxy's id line, chunk framing and, over
// TLS, a record's overhead, none of which the 4 KiB budget counts. A
// client with the smallest MSS and receive buffer that reads nothing: the
// tap must not end up blocked in a write with its upstream unread.
func TestReview34TinyEventsTLSClientThatReadsNothing(t *testing.T) {
	r34TinyEvents(t, true)
}

func TestReview34TinyEventsPlainClientThatReadsNothing(t *testing.T) {
	r34TinyEvents(t, false)
}

func r34TinyEvents(t *testing.T, useTLS bool) {
	harness.MemoryStoreOnly(t, "the tap writes to its client itself only with the memory store's ReadyReader")
	var finished atomic.Bool
	var events atomic.Int64
	up := &mcptest.Upstream{Tools: map[string]mcptest.Tool{
		"tiny": func(w http.ResponseWriter, r *http.Request, req *mcptest.Request) {
			sseHeaders(w)
			rc := http.NewResponseController(w)
			for i := range 2000 {
				if _, err := io.WriteString(w, "data: x\n\n"); err != nil {
					return
				}
				rc.Flush()
				events.Add(1)
				if i < 400 {
					time.Sleep(300 * time.Microsecond) // a read of its own for each
				}
			}
			fmt.Fprintf(w, "data: %s\n\n", resultFor(req.ID))
			rc.Flush()
			finished.Store(true)
		},
	}}
	addr := harness.StartHandlerSndbuf(t, up, 4096)
	port := harness.CaddyPort(t)
	c := harness.StartCaddyWithSites(t, "metrics", mcptest.ResumeRoute(addr, ""),
		mcptest.Site{Port: port, Body: "\ttls internal {\n\t\ton_demand\n\t}\n" + mcptest.ResumeRoute(addr, "")})
	host := fmt.Sprintf("127.0.0.1:%d", c.HTTPPort)
	var cl *harness.RawClient
	if useTLS {
		host = fmt.Sprintf("127.0.0.1:%d", port)
		tr := &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true, ServerName: "localhost"},
			TLSNextProto: map[string]func(string, *tls.Conn) http.RoundTripper{}}
		t.Cleanup(tr.CloseIdleConnections)
		cl = harness.NewRawClientOver(t, "https://"+host, "2025-11-25", &http.Client{Transport: tr, Timeout: 10 * time.Second})
		cl.Initialize()
	} else {
		cl = harness.NewSession(t, c.Base(), "2025-11-25")
	}
	key := func(w string) string { return `caddy_mcp_resume_relays_total{writer="` + w + `"}` }
	stuck := 0
	const rounds = 3
	for k := range rounds {
		finished.Store(false)
		events.Store(0)
		m0, _ := c.Metrics()
		var conn net.Conn = dialTuned(t, host, 88, 1024)
		if useTLS {
			tc := tls.Client(conn, &tls.Config{InsecureSkipVerify: true, ServerName: "localhost", NextProtos: []string{"http/1.1"}})
			if err := tc.Handshake(); err != nil {
				t.Fatal(err)
			}
			conn = tc
		}
		if _, err := io.WriteString(conn, rawCall("x", cl.SessionID, "2025-11-25", 100+k, "tiny")); err != nil {
			t.Fatal(err)
		}
		// The client reads nothing.
		ok := mcptest.Eventually(6*time.Second, 20*time.Millisecond, finished.Load)
		m1, _ := c.Metrics()
		t.Logf("round %d (TLS %v): upstream wrote %d of 2000 events; finished: %v; relays by the tap %v, by a goroutine %v",
			k, useTLS, events.Load(), ok, m1.Series[key("tap")]-m0.Series[key("tap")], m1.Series[key("goroutine")]-m0.Series[key("goroutine")])
		if !ok {
			stuck++
			buf := make([]byte, 4<<20)
			buf = buf[:runtime.Stack(buf, true)]
			for _, g := range strings.Split(string(buf), "\n\n") {
				if strings.Contains(g, "handOff") || strings.Contains(g, "upstreamTap") {
					t.Logf("goroutine:\n%.3000s", g)
					break
				}
			}
		}
		conn.Close()
		mcptest.Eventually(5*time.Second, 20*time.Millisecond, finished.Load)
	}
	if stuck > 0 {
		t.Fatalf("in %d of %d rounds the upstream could not finish in 6 s: the tap waits on a client that reads nothing", stuck, rounds)
	}
}

// The random drops, from 6 clients at once (each its own session): the
// timers fire late on a loaded machine, the tap and the timer goroutines
// interleave more.
func TestReview34ParallelDropsThenResumeExactlyOnce(t *testing.T) {
	harness.MemoryStoreOnly(t, "the tap writes to its client itself only with the memory store's ReadyReader")
	up := &mcptest.Upstream{Tools: map[string]mcptest.Tool{"t": r34Tool}}
	c := harness.StartCaddy(t, mcptest.ResumeRoute(harness.StartHandler(t, up), ""))
	host := fmt.Sprintf("127.0.0.1:%d", c.HTTPPort)
	var wg sync.WaitGroup
	for w := range 6 {
		cl := harness.NewSession(t, c.Base(), "2025-11-25")
		wg.Add(1)
		go func() {
			defer wg.Done()
			t.Run(fmt.Sprint("client", w), func(t *testing.T) {
				r34Drops(t, cl, func() net.Conn { return dialTuned(t, host, 0, 0) }, 50)
			})
		}()
	}
	wg.Wait()
}
