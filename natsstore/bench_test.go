package natsstore

import (
	"bytes"
	"context"
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/buffer"
	"github.com/mcpresume/caddy-mcp-resume/internal/testnet"
	"github.com/mcpresume/caddy-mcp-resume/policy"
)

// BenchmarkAppendRead appends 1 KiB events to one stream on an embedded
// single node (in-process connection) while a reader relays them as the
// Caddy glue does (read, then mark delivered), and reports events/s from
// the first append to the last event read.
func BenchmarkAppendRead(b *testing.B) {
	lim := buffer.Limits{
		MaxStreamBytes: 512 << 20, MaxSessionBytes: 512 << 20, MaxTotalBytes: 1 << 30,
		MaxSessions: 10, MaxStreamsPerSession: 10,
		ResumeWindow: time.Second, StallTimeout: time.Minute,
	}
	st := openEmbedded(b, lim, func(o *Options) { o.SweepInterval = 100 * time.Millisecond })
	s, err := st.CreateSession("bench", buffer.SessionMeta{})
	if err != nil {
		b.Fatal(err)
	}
	str, _ := s.NewStream([]string{"1"}, [32]byte{1})
	r, _ := str.Attach(1)
	defer r.Close()
	fields := append(append([]byte("data: "), bytes.Repeat([]byte("x"), 1024)...), '\n')
	read := make(chan error, 1)
	go func() {
		ctx := context.Background()
		dst := make([][]byte, 0, 8)
		for n := 0; n < b.N; {
			batch, err := r.Read(ctx, dst, 256<<10, time.Minute)
			if err != nil {
				read <- err
				return
			}
			n += int(batch.Last - batch.First + 1)
			r.Delivered(batch.Last)
		}
		read <- nil
	}()
	b.SetBytes(int64(len(fields)))
	b.ResetTimer()
	start := time.Now()
	for i := 0; i < b.N; i++ {
		if _, err := str.Append(context.Background(), buffer.Entry{Fields: fields}); err != nil {
			b.Fatal(err)
		}
	}
	if err := <-read; err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "events/s")
}

// BenchmarkLargeEvent appends one 4 MiB event and reads it back whole, on
// an embedded server (max_payload 64 MiB: one message) and on a server
// with NATS's defaults (max_payload 1 MiB: five parts), over TCP.
func BenchmarkLargeEvent(b *testing.B) {
	lim := buffer.Limits{
		MaxStreamBytes: 512 << 20, MaxSessionBytes: 512 << 20, MaxTotalBytes: 1 << 30,
		MaxSessions: 10, MaxStreamsPerSession: 10,
		ResumeWindow: time.Second, StallTimeout: time.Minute,
	}
	fields := append(append([]byte("data: "), bytes.Repeat([]byte("x"), 4<<20)...), '\n')
	for _, c := range []struct {
		name string
		open func() *Store
	}{
		{"embedded", func() *Store { return openEmbedded(b, lim) }},
		{"stock", func() *Store {
			return openStore(b, Options{URLs: []string{testnet.StockNATS(b).ClientURL()}, Limits: lim})
		}},
	} {
		b.Run(c.name, func(b *testing.B) {
			st := c.open()
			s, err := st.CreateSession("bench", buffer.SessionMeta{})
			if err != nil {
				b.Fatal(err)
			}
			str, _ := s.NewStream([]string{"1"}, [32]byte{1})
			b.SetBytes(int64(len(fields)))
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				seq, err := str.Append(context.Background(), buffer.Entry{Fields: fields})
				if err != nil {
					b.Fatal(err)
				}
				r, _ := str.Attach(seq)
				if _, err := r.Read(context.Background(), nil, 1<<20, time.Minute); err != nil {
					b.Fatal(err)
				}
				r.Delivered(seq)
				r.Close()
				ack(b, str, seq)
			}
		})
	}
}

func ack(b *testing.B, str buffer.Stream, seq uint64) {
	if _, _, err := str.Resume(seq, func(policy.StreamView) policy.Resume {
		return policy.Resume{Kind: policy.Gap, Then: policy.ThenEnd}
	}); err != nil {
		b.Fatal(err)
	}
}

// BenchmarkShortCall runs short calls back to back on one session, as
// TestWhatAShortCallCosts makes them (a progress event and the result,
// relayed to the end, the producer role taken and given up), on an
// embedded single node: the store's share of resume's BenchmarkShortCall
// with the JetStream store. CPU/op is the process's CPU (store and
// embedded server) per call, including what the sweeper does after it
// (eviction, retirement) while the calls run; ops/s is calls per second.
func BenchmarkShortCall(b *testing.B) {
	lim := testLimits()
	lim.ResumeWindow = 200 * time.Millisecond
	lim.SessionIdleTimeout = time.Hour
	st := openEmbedded(b, lim, func(o *Options) { o.SweepInterval = 50 * time.Millisecond })
	sess, err := st.CreateSession("bench", buffer.SessionMeta{Version: "2025-06-18"})
	if err != nil {
		b.Fatal(err)
	}
	for i := 0; i < 2*buffer.EndedStreamsKept; i++ { // to the steady state: ended streams retired as new ones end
		shortCall(b, sess, fmt.Sprint(1_000_000+i))
	}
	time.Sleep(2 * lim.ResumeWindow)
	b.ReportAllocs()
	cpu0 := processCPU()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		shortCall(b, sess, fmt.Sprint(i+1))
	}
	b.StopTimer()
	b.ReportMetric(float64(processCPU()-cpu0)/float64(b.N)/1e3, "cpu-µs/op")
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "calls/s")
}

// BenchmarkSessionChurn is the store's share of the bench's session churn:
// a session created, one short call on it, and the session deleted, on an
// embedded single node. CPU/op is the process's CPU per session, including
// what the sweeper does meanwhile.
func BenchmarkSessionChurn(b *testing.B) {
	lim := testLimits()
	lim.ResumeWindow = 200 * time.Millisecond
	lim.SessionIdleTimeout = time.Hour
	st := openEmbedded(b, lim, func(o *Options) { o.SweepInterval = 50 * time.Millisecond })
	churn := func(i int) {
		sess, err := st.CreateSession(fmt.Sprint("churn-", i), buffer.SessionMeta{Version: "2025-06-18"})
		if err != nil {
			b.Fatal(err)
		}
		shortCall(b, sess, "1")
		if !st.Delete(sess.ID(), policy.ReasonDeleted) {
			b.Fatal("the session was not deleted")
		}
	}
	for i := 0; i < 64; i++ {
		churn(-1 - i)
	}
	b.ReportAllocs()
	cpu0 := processCPU()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		churn(i)
	}
	b.StopTimer()
	b.ReportMetric(float64(processCPU()-cpu0)/float64(b.N)/1e3, "cpu-µs/op")
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "sessions/s")
}

// processCPU is the CPU time this process has used, in nanoseconds.
func processCPU() int64 {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return ru.Utime.Nano() + ru.Stime.Nano()
}
