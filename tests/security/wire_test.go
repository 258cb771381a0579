package security

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/internal/demoserver"
	"github.com/mcpresume/caddy-mcp-resume/internal/eventid"
	"github.com/mcpresume/caddy-mcp-resume/internal/mcptest"
	"github.com/mcpresume/caddy-mcp-resume/tests/harness"
)

// A takeover over HTTP/2 aborts the old stream (review item 9): its client
// sees a reset, not a clean end, as over HTTP/1.1 (older clients reconnect
// only on errors).
func TestHTTP2TakeoverAbortsTheOldStream(t *testing.T) {
	ctx := t.Context()
	upstream := harness.StartDemo(t, demoserver.Options{})
	c := harness.StartCaddyWithGlobal(t, "servers {\n\t\tprotocols h1 h2c\n\t}", mcptest.ResumeRoute(upstream, ""))
	var p http.Protocols
	p.SetUnencryptedHTTP2(true)
	h2c := &http.Client{Transport: &http.Transport{Protocols: &p}, Timeout: 30 * time.Second}
	cl := mcptest.NewClient(c.Base(), "2025-06-18", h2c)
	if err := cl.Initialize(ctx); err != nil {
		t.Fatal(err)
	}
	first, err := cl.Call(ctx, 1, "count", map[string]any{"n": 40, "interval_ms": 100}, "p")
	if err != nil {
		t.Fatal(err)
	}
	defer first.Body.Close()
	if first.ProtoMajor != 2 {
		t.Fatalf("the call went over HTTP/%d", first.ProtoMajor)
	}
	br := bufio.NewReader(first.Body)
	evs, err := mcptest.ReadEvents(br, 2, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	second, err := cl.Resume(ctx, evs[0].ID)
	if err != nil {
		t.Fatal(err)
	}
	defer second.Body.Close()
	if second.StatusCode != 200 {
		t.Fatalf("takeover: %d", second.StatusCode)
	}
	done := make(chan error, 1)
	go func() { _, err := io.Copy(io.Discard, br); done <- err }()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("the taken-over HTTP/2 stream ended cleanly; want it reset")
		}
		t.Logf("old stream: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("the taken-over stream was not ended")
	}
}

// Review item 10: the loose ends.
func TestLooseEnds(t *testing.T) {
	ctx := t.Context()
	t.Run("a repeated Mcp-Session-Id is refused", func(t *testing.T) {
		upstream := harness.StartDemo(t, demoserver.Options{})
		c := harness.StartCaddy(t, mcptest.ResumeRoute(upstream, ""))
		cl := mustInit(t, newClient(c.Base(), "2025-06-18", nil))
		for _, second := range []string{cl.SessionID, "other", ""} {
			req, _ := cl.NewRequest(ctx, "POST", mcptest.CallBody(1, "echo", map[string]any{"text": "x"}, ""), nil)
			req.Header["Mcp-Session-Id"] = []string{cl.SessionID, second}
			harness.RPCError(t, harness.Must(t)(http.DefaultClient.Do(req)), http.StatusBadRequest)
		}
	})

	t.Run("changing bind_headers on reload keeps the sessions", func(t *testing.T) {
		upstream := harness.StartDemo(t, demoserver.Options{})
		c := harness.StartCaddy(t, mcptest.ResumeRoute(upstream, ""))
		old := mustInit(t, newClient(c.Base(), "2025-06-18", cred("Authorization", "Bearer a")))
		c.Load(t, mcptest.ResumeRoute(upstream, "bind_headers X-Api-Key"))
		old.HTTP.CloseIdleConnections()
		x := harness.Must(t)(old.Call(ctx, 2, "echo", map[string]any{"text": "still mine"}, ""))
		if !strings.Contains(string(x.Body), "still mine") {
			t.Fatalf("a session bound before the reload: %s", x)
		}
		echo := mcptest.CallBody(3, "echo", map[string]any{"text": "x"}, "")
		harness.RPCError(t, harness.Must(t)(old.WithHeader(cred("Authorization", "Bearer b")).Do(ctx, "POST", echo, nil)), http.StatusForbidden)
		fresh := mustInit(t, newClient(c.Base(), "2025-06-18", cred("X-Api-Key", "k1")))
		harness.RPCError(t, harness.Must(t)(fresh.WithHeader(cred("X-Api-Key", "k2")).Do(ctx, "POST", echo, nil)), http.StatusForbidden)
	})

	t.Run("the admin API takes session IDs with a slash", func(t *testing.T) {
		up := slashUpstream{&mcptest.Upstream{}}
		c := harness.StartCaddy(t, mcptest.ResumeRoute(harness.StartHandler(t, up), ""))
		cl := mustInit(t, newClient(c.Base(), "2025-06-18", nil))
		if !strings.Contains(cl.SessionID, "/") {
			t.Fatalf("session %q", cl.SessionID)
		}
		if _, held := adminSession(t, c, cl.SessionID); !held {
			t.Fatalf("GET of session %q through the admin API", cl.SessionID)
		}
		purge(t, c, cl.SessionID)
	})

	t.Run("sites in their own zones cannot end each other's sessions", func(t *testing.T) {
		a, b := harness.StartDemo(t, demoserver.Options{}), harness.StartDemo(t, demoserver.Options{})
		portB := harness.CaddyPort(t)
		c := harness.StartCaddyWithSites(t, "", mcptest.ResumeRoute(a, "zone site_a"),
			mcptest.Site{Port: portB, Body: mcptest.ResumeRoute(b, "zone site_b")})
		cl := mustInit(t, newClient(c.Base(), "2025-06-18", nil))
		other := *cl
		other.URL = fmt.Sprintf("http://127.0.0.1:%d/mcp", portB)
		x := harness.Must(t)(other.Do(ctx, "POST", mcptest.CallBody(2, "echo", map[string]any{"text": "x"}, ""), nil))
		if x.Status != http.StatusNotFound {
			t.Fatalf("site B: %s, want its upstream's 404", x)
		}
		if _, held := adminSession(t, c, cl.SessionID); !held {
			t.Fatal("site B's upstream 404 ended site A's session")
		}
	})

	t.Run("a large body for a session the proxy does not hold passes through", func(t *testing.T) {
		var got atomic.Int64
		up := &mcptest.Upstream{}
		h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			body, _ := io.ReadAll(r.Body)
			got.Store(int64(len(body)))
			r.Body = io.NopCloser(bytes.NewReader(body))
			up.ServeHTTP(w, r)
		})
		c := harness.StartCaddy(t, mcptest.ResumeRoute(harness.StartHandler(t, h), "max_request_bytes 1MiB"))
		cl := newClient(c.Base(), "2025-06-18", nil)
		cl.SessionID = "not-held"
		body := mcptest.CallBody(1, "count", map[string]any{"n": 1, "pad": strings.Repeat("x", 200<<10)}, "")
		x := harness.Must(t)(cl.Do(ctx, "POST", body, nil))
		if x.Status != 200 || got.Load() != int64(len(body)) {
			t.Fatalf("upstream read %d of %d bytes; client got %s", got.Load(), len(body), x)
		}
		for _, ev := range x.Events {
			if ev.ID != "" {
				t.Fatalf("tapped: %s", x)
			}
		}
	})
}

// slashUpstream issues session IDs with a slash in them, as the spec
// allows (any visible ASCII).
type slashUpstream struct{ *mcptest.Upstream }

func (s slashUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.Upstream.ServeHTTP(sessionRewriter{ResponseWriter: w}, r)
}

type sessionRewriter struct{ http.ResponseWriter }

func (w sessionRewriter) WriteHeader(status int) {
	if sid := w.Header().Get("Mcp-Session-Id"); sid != "" && !strings.HasPrefix(sid, "tenant/") {
		w.Header().Set("Mcp-Session-Id", "tenant/"+sid)
	}
	w.ResponseWriter.WriteHeader(status)
}

func (w sessionRewriter) Write(p []byte) (int, error) {
	w.WriteHeader(http.StatusOK) // the first Write sends the header: rewrite it first
	return w.ResponseWriter.Write(p)
}

func (w sessionRewriter) Flush() { http.NewResponseController(w.ResponseWriter).Flush() }

// A compressing upstream loses nothing (review item 15.1). Clients send
// Accept-Encoding: gzip by default; the proxy does not pass it on when it
// taps, so an upstream behind compression middleware answers in plain bytes
// (or in gzip that reverse_proxy's transport asked for and decodes) and the
// call is resumable; one that answers in an encoding nobody asked for and
// the proxy cannot read is passed through untouched (never parsed as SSE),
// counted and logged.
func TestCompressingUpstreams(t *testing.T) {
	ctx := t.Context()
	for _, always := range []bool{false, true} {
		t.Run(fmt.Sprintf("encodes unasked %v", always), func(t *testing.T) {
			demo := demoserver.New(demoserver.Options{})
			var h http.Handler = gzipMiddleware(demo, false)
			if always {
				h = brotliLiar(demo)
			}
			upstream := harness.StartHandler(t, h)
			c := harness.StartCaddy(t, mcptest.ResumeRoute(upstream, ""))
			cl := mustInit(t, newClient(c.Base(), "2025-06-18", nil))
			before, _ := c.Metrics()
			resp, err := cl.Call(ctx, 2, "count", map[string]any{"n": 3, "interval_ms": 10}, "p")
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			after, _ := c.Metrics()
			k := `caddy_mcp_resume_untapped_total{reason="compressed"}`
			if always {
				raw, _ := io.ReadAll(resp.Body)
				if resp.Header.Get("Content-Encoding") != "br" || !bytes.HasPrefix(raw, []byte(brotliMagic)) ||
					after.Series[k] <= before.Series[k] {
					t.Fatalf("an encoded reply must pass through untouched and be counted: %v %q", resp.Header, raw)
				}
				return
			}
			evs, err := mcptest.ReadEvents(resp.Body, 0, 10*time.Second)
			if err != nil || len(evs) != 4 || !strings.Contains(evs[3].Data, "counted to 3") {
				t.Fatalf("client got %+v %v", evs, err)
			}
			for _, ev := range evs {
				if !eventidOK(ev.ID) {
					t.Fatalf("not tapped: %+v", evs)
				}
			}
		})
	}
}

func eventidOK(id string) bool { _, err := eventid.Parse(id); return err == nil }

const brotliMagic = "\x8b\x05\x80not really brotli"

// brotliLiar answers SSE as if brotli-encoded (the bytes are not), an
// encoding nobody asked for: the proxy must pass it on, not parse it.
func brotliLiar(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost || !strings.Contains(r.Header.Get("Accept"), "event-stream") {
			next.ServeHTTP(w, r)
			return
		}
		body, _ := io.ReadAll(r.Body)
		if !bytes.Contains(body, []byte("tools/call")) {
			r.Body = io.NopCloser(bytes.NewReader(body))
			next.ServeHTTP(w, r)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		w.Header().Set("Content-Encoding", "br")
		w.WriteHeader(http.StatusOK)
		io.WriteString(w, brotliMagic)
	})
}

// gzipMiddleware compresses responses for clients that accept gzip (or
// always), flushing after every write as SSE needs.
func gzipMiddleware(next http.Handler, always bool) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !always && !strings.Contains(r.Header.Get("Accept-Encoding"), "gzip") {
			next.ServeHTTP(w, r)
			return
		}
		w.Header().Set("Content-Encoding", "gzip")
		gz := gzip.NewWriter(w)
		defer gz.Close()
		next.ServeHTTP(&gzipWriter{ResponseWriter: w, gz: gz}, r)
	})
}

type gzipWriter struct {
	http.ResponseWriter
	gz *gzip.Writer
	mu sync.Mutex
}

func (g *gzipWriter) WriteHeader(status int) {
	g.Header().Del("Content-Length")
	g.ResponseWriter.WriteHeader(status)
}

func (g *gzipWriter) Write(p []byte) (int, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	n, err := g.gz.Write(p)
	if err == nil {
		err = g.gz.Flush()
	}
	http.NewResponseController(g.ResponseWriter).Flush()
	return n, err
}

func (g *gzipWriter) Flush() {
	g.mu.Lock()
	g.gz.Flush()
	g.mu.Unlock()
	http.NewResponseController(g.ResponseWriter).Flush()
}

// A batch answered in part before the upstream broke gets errors only for
// the requests still waiting (review item 15.3).
func TestPartlyAnsweredBatch(t *testing.T) {
	ctx := t.Context()
	up := &mcptest.Upstream{}
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if !bytes.HasPrefix(bytes.TrimSpace(body), []byte("[")) {
			r.Body = io.NopCloser(bytes.NewReader(body))
			up.ServeHTTP(w, r)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(200)
		io.WriteString(w, "data: {\"jsonrpc\":\"2.0\",\"id\":\"a\",\"result\":{}}\n\n")
		http.NewResponseController(w).Flush()
		time.Sleep(50 * time.Millisecond) // the upstream's own pace: a's answer is on its way before the break
		panic(http.ErrAbortHandler)       // the upstream breaks before answering b
	})
	c := harness.StartCaddy(t, mcptest.ResumeRoute(harness.StartHandler(t, h), ""))
	cl := mustInit(t, newClient(c.Base(), "2025-03-26", nil))
	batch := `[{"jsonrpc":"2.0","id":"a","method":"tools/call","params":{"name":"x"}},{"jsonrpc":"2.0","id":"b","method":"tools/call","params":{"name":"y"}}]`
	x := harness.Must(t)(cl.Do(ctx, "POST", batch, nil))
	answers := map[string]int{}
	for _, ev := range x.Events {
		m, err := mcptest.DecodeMessage(ev.Data)
		if err != nil || ev.Type == "gap" {
			continue
		}
		answers[string(m.ID)]++
		if string(m.ID) == `"a"` && m.Error != nil {
			t.Fatalf("request a, answered, got an error too: %s", x)
		}
		if string(m.ID) == `"b"` && (m.Error == nil || m.Error.Code != -32010) {
			t.Fatalf("request b: %s", ev.Data)
		}
	}
	if answers[`"a"`] != 1 || answers[`"b"`] != 1 {
		t.Fatalf("answers %v in %s", answers, x)
	}
}

// Retained events of the standalone stream are the client's whatever the
// upstream says now (review item 15.4): after the upstream's GET ended, a
// resume gets the retained rest at once, even if the upstream now answers
// 502, 405 or 409, or not at all; no gap is counted that was not sent.
func TestStandaloneResumeDoesNotDependOnTheUpstream(t *testing.T) {
	ctx := t.Context()
	for _, now := range []int{http.StatusBadGateway, http.StatusMethodNotAllowed, http.StatusConflict, 0} {
		t.Run(fmt.Sprintf("upstream answers %d", now), func(t *testing.T) {
			var gets atomic.Int64
			up := &mcptest.Upstream{}
			release := make(chan struct{})
			t.Cleanup(func() { close(release) })
			h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.Method != http.MethodGet {
					up.ServeHTTP(w, r)
					return
				}
				if gets.Add(1) > 1 {
					if now == 0 {
						select { // a slow upstream
						case <-release:
						case <-r.Context().Done():
						}
						return
					}
					http.Error(w, "not now", now)
					return
				}
				w.Header().Set("Content-Type", "text/event-stream")
				w.WriteHeader(200)
				for i := 1; i <= 8; i++ {
					fmt.Fprintf(w, "data: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/message\",\"params\":{\"level\":\"info\",\"data\":%d}}\n\n", i)
					http.NewResponseController(w).Flush()
					time.Sleep(30 * time.Millisecond) // the upstream's pace: the client leaves after 3, mid-stream
				}
			})
			c := harness.StartCaddy(t, mcptest.ResumeRoute(harness.StartHandler(t, h), ""))
			cl := mustInit(t, newClient(c.Base(), "2025-06-18", nil))
			resp, err := cl.Do(ctx, "GET", "", nil)
			if err != nil {
				t.Fatal(err)
			}
			evs, err := mcptest.ReadEvents(resp.Body, 3, 10*time.Second)
			resp.Body.Close()
			if err != nil {
				t.Fatal(err)
			}
			harness.WaitFor(t, 10*time.Second, "the proxy to retain events 4..8", func() bool {
				s, _ := adminSession(t, c, cl.SessionID)
				for _, st := range s.Streams {
					if st.Kind == "standalone" && st.Head == 8 && !st.Producing {
						return true
					}
				}
				return false
			})
			before, _ := c.Metrics()
			r, err := cl.Resume(ctx, evs[2].ID)
			if err != nil {
				t.Fatal(err)
			}
			defer r.Body.Close()
			if r.StatusCode != 200 {
				t.Fatalf("resume: %d", r.StatusCode)
			}
			rest, err := mcptest.ReadEvents(r.Body, 5, 5*time.Second)
			if err != nil || len(rest) != 5 {
				t.Fatalf("resume got %+v %v, want events 4..8", rest, err)
			}
			for i, ev := range rest {
				if !strings.HasSuffix(ev.ID, fmt.Sprintf("-0-%d", i+4)) {
					t.Fatalf("event %d: %+v", i, ev)
				}
			}
			after, _ := c.Metrics()
			if g, _ := after.Sum("caddy_mcp_resume_gaps_total"); g != func() float64 { v, _ := before.Sum("caddy_mcp_resume_gaps_total"); return v }() {
				t.Fatalf("a gap was counted that was not sent")
			}
		})
	}
}
