package resume

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/buffer"
)

// BenchmarkTap: the proxy's work per upstream event besides reading the
// upstream and writing the client: parsing, peeking for the response,
// framing and storing, and a reader taking the events out and reporting
// them delivered, as the relay does. The upstream's bytes come in writes of
// 32 KiB at most (reverse_proxy's copy buffer), framed as SDKs frame them.
func BenchmarkTap(b *testing.B) {
	for _, size := range []int{100, 1024, 16384} {
		b.Run(sizeLabel(size), func(b *testing.B) {
			h := testHandler(b)
			lim := h.Limits()
			lim.ResumeWindow = 0 // delivered events may go: the log recycles its chunks
			h.rt.store.SetLimits(lim)
			s := newSession(b, h, "2025-06-18")
			str, err := s.NewStream([]string{`1`}, [32]byte{})
			if err != nil {
				b.Fatal(err)
			}
			t := &upstreamTap{h: h, sess: s, stream: str, ctx: context.Background(), pending: []string{`1`}}
			tw := &tapWriter{t: t, tapping: true, status: 200}
			rd, err := str.Attach(1)
			if err != nil {
				b.Fatal(err)
			}
			defer rd.Close()
			var upstream []byte
			for i := 1; len(upstream) < 1<<20; i++ {
				msg := fmt.Sprintf(`{"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":"b","progress":%d,"message":"`, i)
				msg += strings.Repeat("x", max(size-len(msg)-3, 0)) + `"}}`
				upstream = append(upstream, "event: message\ndata: "+msg+"\n\n"...)
			}
			dst := make([][]byte, 0, 8)
			events := 0
			write := func() {
				for rest := upstream; len(rest) > 0; {
					n := min(len(rest), 32<<10)
					if _, err := tw.Write(rest[:n]); err != nil {
						b.Fatal(err)
					}
					rest = rest[n:]
					for {
						batch, err := rd.Read(context.Background(), dst, 256<<10, time.Nanosecond)
						if err == buffer.ErrIdle {
							break
						}
						if err != nil {
							b.Fatal(err)
						}
						rd.Delivered(batch.Last)
						events += int(batch.Last - batch.First + 1)
					}
				}
			}
			write() // to the steady state
			var ms0, ms1 runtime.MemStats
			runtime.ReadMemStats(&ms0)
			events = 0
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				write()
			}
			b.StopTimer()
			runtime.ReadMemStats(&ms1)
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(events), "ns/event")
			b.ReportMetric(float64(ms1.Mallocs-ms0.Mallocs)/float64(events), "allocs/event")
		})
	}
}

func sizeLabel(n int) string {
	if n >= 1024 {
		return fmt.Sprintf("%dKiB", n/1024)
	}
	return fmt.Sprintf("%dB", n)
}

// BenchmarkShortCall: one short tools/call as MCP traffic mostly is (a
// progress notification and the result, ~300 B of SSE), in process, on
// the memory store: "upstream" is the upstream handler alone, "engine" the
// same call through the engine. Their difference is what the engine adds
// to a call; allocs/op is steady on a loaded machine, ns/op is not.
func BenchmarkShortCall(b *testing.B) {
	id := 0 // the call's request id, also in its result
	upstream := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		io.WriteString(w, "event: message\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\",\"params\":{\"progressToken\":1,\"progress\":1,\"total\":1,\"message\":\"step 1 of 1\"}}\n\n")
		http.NewResponseController(w).Flush()
		fmt.Fprintf(w, "event: message\ndata: {\"jsonrpc\":\"2.0\",\"id\":%d,\"result\":{\"content\":[{\"type\":\"text\",\"text\":\"counted to 1\"}]}}\n\n", id)
	})
	request := func() *http.Request {
		id++                          // a new call each time: a repeated one is answered from its stream
		return post(strconv.Itoa(id)) // tap_test.go's tools/call of session sess-1
	}
	check := func(b *testing.B, rec *httptest.ResponseRecorder) {
		if rec.Code != http.StatusOK || !strings.Contains(rec.Body.String(), "counted to 1") {
			b.Fatalf("call answered %d: %q", rec.Code, rec.Body.String())
		}
	}
	b.Run("upstream", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			rec := httptest.NewRecorder()
			upstream.ServeHTTP(rec, request())
			check(b, rec)
		}
	})
	b.Run("engine", func(b *testing.B) {
		h := testHandler(b)
		newSession(b, h, "2025-11-25")
		next := NextHandler(upstream)
		b.ReportAllocs()
		for b.Loop() {
			rec := httptest.NewRecorder()
			if err := h.ServeHTTP(rec, request(), next); err != nil {
				b.Fatal(err)
			}
			check(b, rec)
		}
	})
	// Over a real HTTP/1.1 connection (the client's work counted too): the
	// engine's relay is then written by the tap itself (handoff.go).
	overSocket := func(b *testing.B, handler http.Handler) {
		srv := httptest.NewUnstartedServer(handler)
		srv.Config.ConnContext = ConnContext
		srv.Start()
		defer srv.Close()
		client := srv.Client()
		inline0 := inlineRelays()
		defer func() { b.ReportMetric(float64(inlineRelays()-inline0)/float64(b.N), "inline/op") }()
		b.ReportAllocs()
		for b.Loop() {
			r := request()
			req, _ := http.NewRequest("POST", srv.URL+"/mcp", r.Body)
			req.Header = r.Header
			resp, err := client.Do(req)
			if err != nil {
				b.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if !strings.Contains(string(body), "counted to 1") {
				b.Fatalf("call answered %d: %q", resp.StatusCode, body)
			}
		}
	}
	b.Run("upstream-socket", func(b *testing.B) { overSocket(b, upstream) })
	b.Run("engine-socket", func(b *testing.B) {
		h := testHandler(b)
		newSession(b, h, "2025-11-25")
		overSocket(b, h.Handler(upstream))
	})
}
