package buffer_test

import (
	"context"
	"io"
	"testing"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/buffer"
	"github.com/mcpresume/caddy-mcp-resume/buffer/storetest"
)

var benchSizes = []struct {
	name string
	size int
}{{"100B", 100}, {"1KiB", 1 << 10}, {"16KiB", 16 << 10}}

// benchStream is a fresh stream of a store whose bounds hold a replay's
// history, and an event of size payload bytes to append to it.
func benchStream(b *testing.B, size int) (buffer.Stream, []byte) {
	lim := storetest.BigLimits()
	lim.MaxStreamBytes, lim.MaxSessionBytes, lim.MaxTotalBytes = 1<<30, 1<<30, 1<<32
	st := buffer.NewMemoryStore(buffer.Options{Limits: lim, SweepInterval: time.Hour})
	b.Cleanup(st.Close)
	s, _ := st.CreateSession("bench", buffer.SessionMeta{})
	str, _ := s.NewStream([]string{"1"}, [32]byte{})
	return str, storetest.Fields(make([]byte, size))
}

// BenchmarkAppend: one op is one Append; the log is acked in batches so
// bounds never block (the cost of eviction by ack is included). Allocations
// per op must stay 0: events are framed into chunks, not allocated one by one.
func BenchmarkAppend(b *testing.B) {
	for _, sz := range benchSizes {
		b.Run(sz.name, func(b *testing.B) {
			str, data := benchStream(b, sz.size)
			ctx := context.Background()
			b.ReportAllocs()
			b.SetBytes(int64(sz.size))
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				seq, err := str.Append(ctx, data, nil)
				if err != nil {
					b.Fatal(err)
				}
				if seq%1024 == 0 {
					buffer.Ack(str, seq)
				}
			}
		})
	}
}

// BenchmarkReplay: one op is one event replayed from history to a reader
// that attaches at the start of a retained, complete stream.
func BenchmarkReplay(b *testing.B) {
	const retained = 4096
	for _, sz := range benchSizes {
		b.Run(sz.name, func(b *testing.B) {
			str, data := benchStream(b, sz.size)
			for i := 0; i < retained; i++ {
				if _, err := str.Append(context.Background(), data, nil); err != nil {
					b.Fatal(err)
				}
			}
			str.Complete()
			ctx := context.Background()
			dst := make([][]byte, 0, 16)
			b.ReportAllocs()
			b.SetBytes(int64(sz.size))
			b.ResetTimer()
			for n := 0; n < b.N; {
				r, err := str.Attach(1)
				if err != nil {
					b.Fatal(err)
				}
				for n < b.N {
					batch, err := r.Read(ctx, dst, 256<<10, time.Second)
					if err == io.EOF {
						break
					}
					if err != nil {
						b.Fatal(err)
					}
					n += int(batch.Last - batch.First + 1)
				}
				r.Close()
			}
		})
	}
}
