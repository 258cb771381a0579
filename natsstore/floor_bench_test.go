package natsstore

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// BenchmarkJetStreamFloor measures what JetStream itself costs for the
// writes a short call makes, with no store around them: on the embedded
// server (in-process connection, file storage, the store's stream and
// bucket settings), 32 workers each run "calls" of w acknowledged writes
// back to back: the record's create, the events' publish (message ID,
// expected last sequence on its subject), the record's end, the session's
// stream number, and the lease's create and delete, in that order, the
// first w of them. CPU/op is the process's CPU (client and server) per
// call: the least a call of w writes can cost through the shared store,
// to hold against a plain reverse_proxy call's CPU (issue 23's budget is
// 3 times it, all of the call's HTTP included).
//
// The tcp variants connect over loopback TCP to a server set up the same
// way but listening, as replicas reach a nats-server of their own: the
// in-process connection the embedded store uses is a net.Pipe, whose
// every write waits for the server's read, and costs more per write.
func BenchmarkJetStreamFloor(b *testing.B) {
	for _, conn := range []string{"inprocess", "tcp"} {
		for _, w := range []int{1, 2, 4, 6} {
			b.Run(fmt.Sprintf("conn=%s/writes=%d", conn, w), func(b *testing.B) { jetStreamFloor(b, conn == "tcp", w) })
		}
	}
}

func jetStreamFloor(b *testing.B, tcp bool, writes int) {
	var srv *server.Server
	var err error
	if tcp {
		srv, err = server.NewServer(&server.Options{
			JetStream: true, StoreDir: b.TempDir(), Host: "127.0.0.1", Port: server.RANDOM_PORT,
			MaxPayload: embeddedMaxPayload, MaxPending: embeddedMaxPayload, NoLog: true, NoSigs: true,
		})
		if err == nil {
			srv.Start()
			if !srv.ReadyForConnections(30 * time.Second) {
				err = fmt.Errorf("the server did not start")
			}
		}
	} else {
		srv, err = StartEmbedded(b.TempDir(), false)
	}
	if err != nil {
		b.Fatal(err)
	}
	defer srv.Shutdown()
	var nc *nats.Conn
	if tcp {
		nc, err = nats.Connect(srv.ClientURL())
	} else {
		nc, err = nats.Connect("", nats.InProcessServer(srv))
	}
	if err != nil {
		b.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{
		Name: "FLOOR", Subjects: []string{"floor.>"}, Storage: jetstream.FileStorage, Duplicates: 2 * time.Minute,
	}); err != nil {
		b.Fatal(err)
	}
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "FLOOR_KV", History: 1, Storage: jetstream.FileStorage, LimitMarkerTTL: time.Second})
	if err != nil {
		b.Fatal(err)
	}
	const workers = 32
	record := make([]byte, 160) // a stream record's JSON is about this long
	events := make([]byte, 300) // a progress notification and the result, as SSE
	call := func(wk int, i int64) error {
		key := fmt.Sprintf("s%d.e.%d", wk, i)
		rev, err := kv.Create(ctx, key, record)
		if err != nil || writes == 1 {
			return err
		}
		subj := fmt.Sprintf("floor.s%d.%d", wk, i)
		if _, err := js.Publish(ctx, subj, events, jetstream.WithMsgID(subj+".1"), jetstream.WithExpectLastSequencePerSubject(0)); err != nil || writes == 2 {
			return err
		}
		if _, err := kv.Update(ctx, key, record, rev); err != nil {
			return err
		}
		sess := fmt.Sprintf("s%d", wk)
		if _, err := kv.Put(ctx, sess, record); err != nil || writes == 4 {
			return err
		}
		lease := fmt.Sprintf("l%d.%d", wk, i)
		lrev, err := kv.Create(ctx, lease, record[:60], jetstream.KeyTTL(time.Minute))
		if err != nil {
			return err
		}
		return kv.Delete(ctx, lease, jetstream.LastRevision(lrev))
	}
	runCalls(b, workers, call)
}

// runCalls runs b.N calls from workers goroutines, call(worker, i) for i
// from 1, and reports the process's CPU (client and server) and calls per
// second.
func runCalls(b *testing.B, workers int, call func(wk int, i int64) error) {
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	b.ReportAllocs()
	cpu0 := processCPU()
	b.ResetTimer()
	for wk := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := next.Add(1)
				if i > int64(b.N) {
					return
				}
				if err := call(wk, i); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	b.StopTimer()
	select {
	case err := <-errs:
		b.Fatal(err)
	default:
	}
	b.ReportMetric(float64(processCPU()-cpu0)/float64(b.N)/1e3, "cpu-µs/op")
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "calls/s")
}
