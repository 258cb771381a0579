package natsstore

import (
	"context"
	"testing"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/buffer"
	"github.com/mcpresume/caddy-mcp-resume/internal/testnet"
)

// Review 48: a session's stream number written by A, its acknowledgement
// lost with A's connection; before A reconnects and looks for its tagged
// write, B opens a call of the same session: B's compare-and-set lands on
// top of A's write. A's look-up (kvLastTag) reads only the key's last
// message, B's, and A makes its change again: the number A's lost write
// took is never used (the skip e4d3f78 meant to end). Mended: whether the
// write was stored is asked of JetStream's duplicate window (kvStored).
func TestReview48InterleavedWriteMakesALostNumberApplyTwice(t *testing.T) {
	t.Parallel()
	ns := testnet.NATS(t)
	mod := func(o *Options) { o.LeaseTTL = 21 * time.Second; o.TakeoverWait = time.Hour }
	b := openAt(t, []string{ns.ClientURL()}, mod)
	waitUntil(t, "the sweeper", 10*time.Second, b.sweeps)
	cut := newAckCutter(t, ns.Addr().String())
	a := openAt(t, []string{"nats://" + cut.addr()}, mod)
	sa, err := a.CreateSession("sess", buffer.SessionMeta{})
	if err != nil {
		t.Fatal(err)
	}
	sb := sessionOn(t, b, "sess")
	s := sa.(*session)
	cut.arm("HPUB $KV."+a.names.sessions+"."+s.sh+" ", `"next"`)
	type res struct {
		str buffer.Stream
		err error
		at  time.Duration
	}
	ch := make(chan res, 1)
	began := time.Now()
	go func() {
		str, err := sa.NewStream([]string{"1"}, [32]byte{1})
		ch <- res{str, err, time.Since(began)}
	}()
	waitUntil(t, "the cutter", 5*time.Second, cut.fired.Load)
	strB, errB := sb.NewStream([]string{"2"}, [32]byte{2})
	ra := <-ch
	if errB != nil {
		t.Fatalf("B's NewStream: %v", errB)
	}
	if ra.err != nil {
		t.Fatalf("A's NewStream (its number's ack lost) failed after %v: %v", ra.at, ra.err)
	}
	na, nb := ra.str.(*stream).num, strB.(*stream).num
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	rec, _, _ := b.sessions.lookupErr(ctx, s.sh)
	var next uint32
	if rec != nil {
		next = rec.NextStream
	}
	t.Logf("A got %d after %v, B got %d; the session record's next: %d", na, ra.at.Round(time.Millisecond), nb, next)
	if !(na == 1 && nb == 2 || na == 2 && nb == 1) {
		t.Fatalf("FAULT: the session's first two calls got numbers %d (A, whose write's ack was lost) and %d (B): "+
			"a number was skipped, A's change applied twice (next is %d)", na, nb, next)
	}
}
