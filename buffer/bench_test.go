package buffer

import (
	"context"
	"io"
	"testing"
	"time"
)

var benchSizes = []struct {
	name string
	size int
}{{"100B", 100}, {"1KiB", 1 << 10}, {"16KiB", 16 << 10}}

// BenchmarkAppend: one op is one Append; the log is acked in batches so
// bounds never block (the cost of eviction by ack is included). Allocations
// per op must stay 0: events are framed into chunks, not allocated one by one.
func BenchmarkAppend(b *testing.B) {
	for _, sz := range benchSizes {
		b.Run(sz.name, func(b *testing.B) {
			st := NewMemoryStore(Options{Limits: bigLimits(), SweepInterval: time.Hour})
			defer st.Close()
			s, _ := st.CreateSession("bench", SessionMeta{})
			str, _ := s.NewStream([]string{"1"}, [32]byte{})
			data := fields(make([]byte, sz.size))
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
					ack(str, seq)
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
			st := NewMemoryStore(Options{Limits: bigLimits(), SweepInterval: time.Hour})
			defer st.Close()
			s, _ := st.CreateSession("bench", SessionMeta{})
			str, _ := s.NewStream([]string{"1"}, [32]byte{})
			data := fields(make([]byte, sz.size))
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
