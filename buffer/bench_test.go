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
}{{"100B", 100}, {"4KiB", 4 << 10}}

// BenchmarkAppend: one op is one Append; the log is acked in batches so
// bounds never block (the cost of eviction by ack is included).
func BenchmarkAppend(b *testing.B) {
	for _, sz := range benchSizes {
		b.Run(sz.name, func(b *testing.B) {
			st := NewMemoryStore(Options{Limits: bigLimits(), SweepInterval: time.Hour})
			defer st.Close()
			s, _ := st.NewSession("bench", SessionMeta{})
			str, _ := s.NewStream(0, nil)
			data := make([]byte, sz.size)
			ctx := context.Background()
			b.ReportAllocs()
			b.SetBytes(int64(sz.size))
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				seq, err := str.Append(ctx, data, false)
				if err != nil {
					b.Fatal(err)
				}
				if seq%1024 == 0 {
					str.Ack(seq)
				}
			}
		})
	}
}

// BenchmarkReplay: one op is one event replayed from history to a reader
// that attaches at the start of a retained, complete stream.
func BenchmarkReplay(b *testing.B) {
	const retained = 1024
	for _, sz := range benchSizes {
		b.Run(sz.name, func(b *testing.B) {
			st := NewMemoryStore(Options{Limits: bigLimits(), SweepInterval: time.Hour})
			defer st.Close()
			s, _ := st.NewSession("bench", SessionMeta{})
			str, _ := s.NewStream(0, nil)
			for i := 0; i < retained; i++ {
				if _, err := str.Append(context.Background(), make([]byte, sz.size), false); err != nil {
					b.Fatal(err)
				}
			}
			str.Complete()
			ctx := context.Background()
			buf := make([]Event, 64)
			b.ReportAllocs()
			b.SetBytes(int64(sz.size))
			b.ResetTimer()
			for n := 0; n < b.N; {
				r, err := str.Attach(1)
				if err != nil {
					b.Fatal(err)
				}
				for n < b.N {
					evs, err := r.Read(ctx, buf)
					n += len(evs)
					if err == io.EOF {
						break
					}
					if err != nil {
						b.Fatal(err)
					}
				}
				r.Close()
			}
		})
	}
}
