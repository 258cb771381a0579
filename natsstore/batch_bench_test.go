package natsstore

import (
	"context"
	"fmt"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// BenchmarkJetStreamAtomicBatch asks whether JetStream's atomic batch
// publish (nats-server 2.12+) would make a call's writes cheaper if they
// lived in one stream: the opening of a call writes three keys (the
// session's stream number, the stream record, the producer lease), each a
// compare-and-set. "separate" stores three messages, each acknowledged
// before the next, as the store does now across its buckets; "batch"
// stores the same three as one atomic batch, one acknowledgement. Same
// server and settings as BenchmarkJetStreamFloor (in-process, file
// storage), 32 workers; CPU/op is the process's per call. Measured on
// nats-server v2.15.2: separate 62-64 µs, batch 1311-1341 µs (a file
// stream stages each atomic batch in a store of its own, on disk), so
// the answer is no.
func BenchmarkJetStreamAtomicBatch(b *testing.B) {
	for _, mode := range []string{"separate", "batch"} {
		b.Run(mode, func(b *testing.B) { jetStreamBatch(b, mode == "batch") })
	}
}

func jetStreamBatch(b *testing.B, batch bool) {
	srv, err := StartEmbedded(b.TempDir(), false)
	if err != nil {
		b.Fatal(err)
	}
	defer srv.Shutdown()
	nc, err := nats.Connect("", nats.InProcessServer(srv))
	if err != nil {
		b.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{
		Name: "BATCH", Subjects: []string{"batch.>"}, Storage: jetstream.FileStorage,
		MaxMsgsPerSubject: 1, AllowAtomicPublish: true, AllowMsgTTL: true,
	}); err != nil {
		b.Fatal(err)
	}
	const workers = 32
	value := make([]byte, 160)
	var batches atomic.Int64
	msg := func(subject string) *nats.Msg {
		m := nats.NewMsg(subject)
		m.Data = value
		m.Header.Set(jetstream.ExpectedLastSubjSeqHeader, "0")
		return m
	}
	store := func(m *nats.Msg) error {
		resp, err := nc.RequestMsgWithContext(ctx, m)
		if err != nil {
			return err
		}
		if _, ok := plainAck(resp.Data); !ok {
			return fmt.Errorf("%s: %s", m.Subject, resp.Data)
		}
		return nil
	}
	call := func(wk int, i int64) error {
		ms := []*nats.Msg{
			msg(fmt.Sprintf("batch.sess.%d.%d", wk, i)),
			msg(fmt.Sprintf("batch.rec.%d.%d", wk, i)),
			msg(fmt.Sprintf("batch.lease.%d.%d", wk, i)),
		}
		if !batch {
			for _, m := range ms {
				if err := store(m); err != nil {
					return err
				}
			}
			return nil
		}
		id := "b" + strconv.FormatInt(batches.Add(1), 36)
		for n, m := range ms {
			m.Header.Set("Nats-Batch-Id", id)
			m.Header.Set("Nats-Batch-Sequence", strconv.Itoa(n+1))
			if n < len(ms)-1 {
				if err := nc.PublishMsg(m); err != nil {
					return err
				}
				continue
			}
			m.Header.Set("Nats-Batch-Commit", "1")
			return store(m)
		}
		return nil
	}
	runCalls(b, workers, call)
}
