package security

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"github.com/mcpresume/caddy-mcp-resume/internal/mcptest"
	"github.com/mcpresume/caddy-mcp-resume/tests/harness"
)

// Review 56: bodies around presizeMax (4 KiB) over h2c with raw frames:
// exact, longer than declared, shorter than declared, with trailers, in
// many DATA frames. The upstream gets every byte of a good body and
// nothing of a bad one.
func TestReview56H2CBodiesAroundPresize(t *testing.T) {
	var got atomic.Int64
	var gotBody atomic.Value
	up := &mcptest.Upstream{}
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if r.Method == http.MethodPost && err == nil {
			got.Store(int64(len(body)))
			gotBody.Store(string(body))
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		up.ServeHTTP(w, r)
	})
	c := harness.StartCaddyWithGlobal(t, "servers {\n\t\tprotocols h1 h2c\n\t}", mcptest.ResumeRoute(harness.StartHandler(t, h), ""))
	cl := mustInit(t, newClient(c.Base(), "2025-06-18", nil))
	id := 100
	call := func(size int) string {
		id++
		b := mcptest.CallBody(id, "count", map[string]any{"n": 1, "pad": ""}, "")
		return mcptest.CallBody(id, "count", map[string]any{"n": 1, "pad": strings.Repeat("x", size-len(b))}, "")
	}
	type result struct {
		status string
		rst    bool
		body   string
	}
	send := func(declared int, body string, frames int, trailers bool) result {
		conn, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", c.HTTPPort))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		conn.SetDeadline(time.Now().Add(10 * time.Second))
		conn.Write([]byte(http2.ClientPreface))
		fr := http2.NewFramer(conn, conn)
		fr.WriteSettings()
		var hb bytes.Buffer
		enc := hpack.NewEncoder(&hb)
		for _, f := range [][2]string{{":method", "POST"}, {":scheme", "http"}, {":authority", "127.0.0.1"}, {":path", "/mcp"},
			{"content-type", "application/json"}, {"accept", "application/json, text/event-stream"},
			{"mcp-session-id", cl.SessionID}, {"mcp-protocol-version", "2025-06-18"}} {
			enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
		}
		if declared >= 0 {
			enc.WriteField(hpack.HeaderField{Name: "content-length", Value: fmt.Sprint(declared)})
		}
		fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: hb.Bytes(), EndHeaders: true})
		step := max(1, (len(body)+frames-1)/frames)
		for i := 0; i < len(body); i += step {
			end := min(len(body), i+step)
			fr.WriteData(1, end == len(body) && !trailers, []byte(body[i:end]))
		}
		if len(body) == 0 && !trailers {
			fr.WriteData(1, true, nil)
		}
		if trailers {
			hb.Reset()
			enc.WriteField(hpack.HeaderField{Name: "x-trailer", Value: "1"})
			fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: hb.Bytes(), EndHeaders: true, EndStream: true})
		}
		var res result
		dec := hpack.NewDecoder(4096, nil)
		for {
			f, err := fr.ReadFrame()
			if err != nil {
				return res
			}
			switch f := f.(type) {
			case *http2.SettingsFrame:
				if !f.IsAck() {
					fr.WriteSettingsAck()
				}
			case *http2.HeadersFrame:
				fs, _ := dec.DecodeFull(f.HeaderBlockFragment())
				for _, hf := range fs {
					if hf.Name == ":status" && res.status == "" {
						res.status = hf.Value
					}
				}
				if f.StreamEnded() {
					return res
				}
			case *http2.DataFrame:
				res.body += string(f.Data())
				if f.StreamEnded() || strings.Contains(res.body, `"result"`) {
					return res
				}
			case *http2.RSTStreamFrame:
				res.rst = true
				return res
			case *http2.GoAwayFrame:
				return res
			}
		}
	}
	for _, size := range []int{4095, 4096, 4097, 9000} {
		for _, frames := range []int{1, 7} {
			for _, trailers := range []bool{false, true} {
				for _, decl := range []string{"exact", "none"} {
					body := call(size)
					d := len(body)
					if decl == "none" {
						d = -1
					}
					got.Store(-1)
					r := send(d, body, frames, trailers)
					if r.status != "200" || got.Load() != int64(size) || gotBody.Load().(string) != body {
						t.Errorf("%d bytes declared %s, %d frames, trailers %v: %+v; upstream read %d", size, decl, frames, trailers, r, got.Load())
					}
				}
			}
		}
		// Longer than declared, and shorter: nothing reaches the upstream.
		for _, delta := range []int{+1, +100, -1} {
			body := call(size)
			got.Store(-1)
			r := send(size+delta*-1, body, 3, false)
			if got.Load() != -1 || r.status == "200" && strings.Contains(r.body, "result") {
				t.Errorf("%d bytes sent, %d declared: %+v; upstream read %d", size, size-delta, r, got.Load())
			}
			t.Logf("%d bytes sent, %d declared: status %q rst %v", size, size-delta, r.status, r.rst)
		}
	}
}
