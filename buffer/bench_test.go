package buffer_test

import (
	"context"
	"fmt"
	"io"
	"runtime"
	"strconv"
	"sync/atomic"
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

// perEvent reports, besides testing's per-op figures (which round
// allocations down to a whole number), the allocations and bytes allocated
// per event as fractions, so an amortised 0.02 allocs/event shows.
type perEvent struct {
	b    *testing.B
	ms   runtime.MemStats
	t0   time.Time
	seen bool
}

func startPerEvent(b *testing.B) *perEvent {
	b.ReportAllocs()
	p := &perEvent{b: b}
	b.ResetTimer()
	runtime.ReadMemStats(&p.ms)
	p.t0 = time.Now()
	return p
}

func (p *perEvent) stop(events int) {
	elapsed := time.Since(p.t0)
	p.b.StopTimer()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	n := float64(events)
	p.b.ReportMetric(float64(elapsed.Nanoseconds())/n, "ns/event")
	p.b.ReportMetric(float64(ms.Mallocs-p.ms.Mallocs)/n, "allocs/event")
	p.b.ReportMetric(float64(ms.TotalAlloc-p.ms.TotalAlloc)/n, "B/event")
}

// BenchmarkAppend: one op is one Append to a stream whose client keeps up,
// as on a busy proxy: a reader takes the events in batches of 64 and
// reports them delivered, and the clock moves 1µs per event with a 1ms
// resume window, so the log holds about 1000 events and reaches its steady
// state, in which a new chunk reuses the memory of the oldest (recycling).
// The reader's work is in the figure; allocations per event must stay 0
// amortised.
func BenchmarkAppend(b *testing.B) {
	for _, sz := range benchSizes {
		b.Run(sz.name, func(b *testing.B) {
			lim := storetest.BigLimits()
			lim.ResumeWindow = time.Millisecond
			var clock atomic.Int64
			clock.Store(time.Now().UnixNano())
			now := func() time.Time { return time.Unix(0, clock.Load()) }
			st := buffer.NewMemoryStore(buffer.Options{Limits: lim, SweepInterval: time.Hour, Now: now})
			defer st.Close()
			s, _ := st.CreateSession("bench", buffer.SessionMeta{})
			str, _ := s.NewStream([]string{"1"}, [32]byte{})
			r, err := str.Attach(1)
			if err != nil {
				b.Fatal(err)
			}
			defer r.Close()
			data := storetest.Fields(make([]byte, sz.size))
			ctx := context.Background()
			dst := make([][]byte, 0, 16)
			appendOne := func(consume bool) {
				clock.Add(int64(time.Microsecond))
				seq, err := str.Append(ctx, buffer.Entry{Fields: data})
				if err != nil {
					b.Fatal(err)
				}
				for consume && r.Next() <= seq {
					batch, err := r.Read(ctx, dst, 256<<10, time.Second)
					if err != nil {
						b.Fatal(err)
					}
					r.Delivered(batch.Last)
				}
			}
			for i := 0; i < 4096; i++ { // to the steady state
				appendOne(i%64 == 63)
			}
			b.SetBytes(int64(sz.size))
			p := startPerEvent(b)
			for i := 0; i < b.N; i++ {
				appendOne(i%64 == 63)
			}
			p.stop(b.N)
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
				if _, err := str.Append(context.Background(), buffer.Entry{Fields: data}); err != nil {
					b.Fatal(err)
				}
			}
			str.Complete()
			ctx := context.Background()
			dst := make([][]byte, 0, 16)
			b.SetBytes(int64(sz.size))
			p := startPerEvent(b)
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
			p.stop(b.N)
		})
	}
}

// BenchmarkSweep: one op is one pass of the sweeper over a session holding
// n ended calls, each delivered to its client and inside the resume
// window: what every call costs the sweeper each interval while its events
// are kept (a 2-minute window, a 500 ms interval: 240 passes). ns/stream
// is per call held, per pass; a pass should find them set aside.
func BenchmarkSweep(b *testing.B) {
	for _, n := range []int{1000, 10000} {
		b.Run(fmt.Sprintf("calls=%d", n), func(b *testing.B) {
			lim := storetest.BigLimits()
			lim.ResumeWindow = 2 * time.Minute
			st := buffer.NewMemoryStore(buffer.Options{Limits: lim, SweepInterval: time.Hour})
			defer st.Close()
			s, _ := st.CreateSession("bench", buffer.SessionMeta{})
			ctx := context.Background()
			event := storetest.Fields(make([]byte, 100))
			for i := 0; i < n; i++ {
				str, err := s.NewStream([]string{strconv.Itoa(i)}, [32]byte{byte(i), byte(i >> 8)})
				if err != nil {
					b.Fatal(err)
				}
				r, _ := str.Attach(1)
				str.Append(ctx, buffer.Entry{Fields: event})
				str.Append(ctx, buffer.Entry{Fields: event, Answers: []string{strconv.Itoa(i)}})
				str.Complete()
				for {
					batch, err := r.Read(ctx, nil, 256<<10, time.Second)
					if len(batch.Data) > 0 {
						r.Delivered(batch.Last)
					}
					if err != nil {
						break
					}
				}
				r.Close()
			}
			st.Sweep() // each stream judged once, after its client left
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				st.Sweep()
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(n), "ns/stream")
		})
	}
}
