package resume

import (
	"context"
	"fmt"
	"runtime"
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
