package buffer_test

import (
	"context"
	"testing"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/buffer"
	"github.com/mcpresume/caddy-mcp-resume/buffer/storetest"
	"github.com/mcpresume/caddy-mcp-resume/policy"
)

type batchResult struct {
	last uint64
	n    int
	err  error
}

func entries(from uint64, n int) []buffer.Entry {
	out := make([]buffer.Entry, n)
	for i := range out {
		out[i] = buffer.Entry{Fields: storetest.Fields(storetest.Payload(from+uint64(i), evSize))}
	}
	return out
}

func asyncBatch(str buffer.Stream, es []buffer.Entry) <-chan batchResult {
	return storetest.Async(func() batchResult {
		last, n, err := str.(buffer.BatchAppender).AppendBatch(context.Background(), es)
		return batchResult{last, n, err}
	})
}

// A batch is appended in order under the IDs Append would give, with its
// answers recorded, and costs what appending its events one by one costs.
func TestAppendBatch(t *testing.T) {
	st, _ := newStore(t, buffer.Options{Limits: storetest.BigLimits()})
	str := storetest.MustStream(t, storetest.MustSession(t, st, "s1"), `1`, `2`)
	storetest.AppendN(t, str, 2, evSize)
	es := entries(3, 5)
	es[1].Answers = []string{`2`}
	es[4].Answers = []string{`1`}
	last, n, err := str.(buffer.BatchAppender).AppendBatch(context.Background(), es)
	if err != nil || n != 5 || last != 7 {
		t.Fatalf("AppendBatch = %d, %d, %v", last, n, err)
	}
	r, _ := str.Attach(1)
	evs, err := storetest.ReadUntil(t, r, 7)
	if err != nil {
		t.Fatal(err)
	}
	storetest.CheckSeqs(t, evs, 1, evSize)
	v := str.View()
	if v.Requests[0].AnsweredAt != 7 || v.Requests[1].AnsweredAt != 4 {
		t.Fatalf("answers recorded at %+v", v.Requests)
	}
	if b := buffer.StreamBytes(str); b != 7*evBytes {
		t.Fatalf("stream holds %d bytes, want %d", b, 7*evBytes)
	}
	if got := st.Counters().EventsEnqueued.Load(); got != 7 {
		t.Fatalf("EventsEnqueued = %d", got)
	}
}

// A batch that does not fit appends what does, blocks for the rest (the
// reader sees the first ones meanwhile), and goes on as room appears; if
// the stream fails meanwhile it reports how many went in.
func TestAppendBatchBackpressure(t *testing.T) {
	lim := storetest.BigLimits()
	lim.MaxStreamBytes = 4 * evBytes
	st, _ := newStore(t, buffer.Options{Limits: lim})
	str := storetest.MustStream(t, storetest.MustSession(t, st, "s1"), `1`)
	blocked := asyncBatch(str, entries(1, 6))
	storetest.WaitFor(t, "the first 4 events", func() bool { return str.View().Head == 4 })
	select {
	case r := <-blocked:
		t.Fatalf("AppendBatch returned %+v while the log was full", r)
	case <-time.After(50 * time.Millisecond):
	}
	buffer.Ack(str, 2)
	r := <-blocked
	if r.err != nil || r.n != 6 || r.last != 6 {
		t.Fatalf("AppendBatch = %+v", r)
	}
	if v := str.View(); v.Floor != 3 || v.Head != 6 || buffer.StreamBytes(str) != 4*evBytes {
		t.Fatalf("view %+v, %d bytes", v, buffer.StreamBytes(str))
	}

	blocked = asyncBatch(str, entries(7, 3))
	select {
	case r := <-blocked:
		t.Fatalf("AppendBatch returned %+v while the log was full", r)
	case <-time.After(50 * time.Millisecond):
	}
	str.Fail(policy.ReasonStalled)
	if r := <-blocked; r.err != buffer.ErrStreamEnded || r.n != 0 || r.last != 0 {
		t.Fatalf("AppendBatch on a failed stream = %+v", r)
	}
	if b := buffer.StreamBytes(str); b != 4*evBytes {
		t.Fatalf("the failed batch left %d bytes counted, want %d", b, 4*evBytes)
	}
}
