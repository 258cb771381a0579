package natsstore

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/buffer"
	"github.com/mcpresume/caddy-mcp-resume/internal/testnet"
)

// 87e4d8f: a stream that ended after one the sweep passes by (st.idle)
// "waits for it". A call whose answer no client ever took (its client
// went and never resumed it) can never retire and is passed by for good
// (its idle entry has no delivery time: st.idle.note's math.MaxInt64):
// every stream that ends after it then waits forever, and the session's
// ended records grow without bound, where the memory store (and this
// one before the commit) retires them past the held one.
func TestReview54AnUndeliveredCallHoldsEveryLaterRecord(t *testing.T) {
	st := openAt(t, []string{testnet.NATS(t).ClientURL()}, func(o *Options) { o.SweepInterval = time.Hour })
	sess, err := st.CreateSession("retire", buffer.SessionMeta{Version: "2025-06-18"})
	if err != nil {
		t.Fatal(err)
	}
	// Call "u": ended, its answer never delivered (no client read it).
	var key [32]byte
	copy(key[:], "u")
	str, p, rd, err := sess.(buffer.CallOpener).OpenCall(context.Background(), []string{"u"}, key)
	if err != nil {
		t.Fatal(err)
	}
	rd.Close()
	if _, err := str.Append(context.Background(), buffer.Entry{Fields: []byte(`data: {"jsonrpc":"2.0","id":"u","result":{}}` + "\n"), Answers: []string{"u"}}); err != nil {
		t.Fatal(err)
	}
	str.Complete()
	p.Done()
	ended := func() []endedStream { return endedRequestStreams(st) }
	sweep := func(now time.Time) {
		st.idle.pass++
		defer st.idle.forget()
		st.retire(ended(), now)
	}
	n := 0
	calls := func(k int) {
		for range k {
			n++
			time.Sleep(time.Millisecond) // distinct end times
			shortCall(t, sess, fmt.Sprint(n))
		}
	}
	calls(buffer.EndedStreamsKept + 3)
	waitUntil(t, "every call ended", 10*time.Second, func() bool { return len(ended()) == n+1 })
	sweep(time.Now().Add(2 * st.Limits().ResumeWindow))
	t.Logf("after the first sweep: %d ended records (want %d: the undelivered one and the newest kept)", len(ended()), buffer.EndedStreamsKept+1)
	for round := 1; round <= 3; round++ {
		calls(10)
		waitUntil(t, "the calls ended", 10*time.Second, func() bool { return len(ended()) >= buffer.EndedStreamsKept+1+10 })
		for range 2 {
			sweep(time.Now().Add(2 * st.Limits().ResumeWindow))
		}
		if got := len(ended()); got > buffer.EndedStreamsKept+1 {
			t.Errorf("round %d: %d ended records kept after sweeps where every event may go, want %d (the undelivered call and the newest %d)",
				round, got, buffer.EndedStreamsKept+1, buffer.EndedStreamsKept)
		}
	}
}
