package natsstore

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/buffer"
	"github.com/mcpresume/caddy-mcp-resume/internal/testnet"
)

// Review 48: a session's stream number written while A's connection is
// down (the write waits in the client's reconnect buffer) for longer than
// the attempt's 3 s bound. The attempt ends unknown, and its look-up
// (kvLastTag, a direct get) is buffered behind the write: both reach NATS
// together on the reconnection. nats-server answers a client's direct get
// inline, in the connection's read loop, while the publish waits in the
// stream's queue: the get may see the key as it was before the write, the
// change is made again, and applies twice. Mended: the question is a
// publish (kvStored), which reaches the stream after the write.
func TestReview48BufferedWriteAndItsCheckApplyTwice(t *testing.T) {
	t.Parallel()
	ns := testnet.NATS(t)
	mod := func(o *Options) { o.LeaseTTL = 21 * time.Second; o.TakeoverWait = time.Hour }
	b := openAt(t, []string{ns.ClientURL()}, mod)
	waitUntil(t, "the sweeper", 10*time.Second, b.sweeps)
	relay := newFaultRelay(t, strings.TrimPrefix(ns.ClientURL(), "nats://"))
	a := openAt(t, []string{"nats://" + relay.addr()}, mod)
	const tries = 4
	skipped := 0
	for i := range tries {
		id := "sess" + string(rune('a'+i))
		sa, err := a.CreateSession(id, buffer.SessionMeta{})
		if err != nil {
			t.Fatal(err)
		}
		s := sa.(*session)
		relay.cut()
		waitUntil(t, "A to see the cut", 10*time.Second, func() bool { return !a.nc.IsConnected() })
		type res struct {
			str buffer.Stream
			err error
		}
		ch := make(chan res, 1)
		go func() {
			str, err := sa.NewStream([]string{"1"}, [32]byte{1})
			ch <- res{str, err}
		}()
		time.Sleep(4 * time.Second) // past the attempt's 3 s bound
		relay.mend()
		r := <-ch
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		rec, _, lerr := b.sessions.lookupErr(ctx, s.sh)
		cancel()
		var num uint32
		if r.str != nil {
			num = r.str.(*stream).num
		}
		var next uint32
		if rec != nil {
			next = rec.NextStream
		}
		t.Logf("try %d: NewStream err %v, number %d; the record's next %d (%v)", i, r.err, num, next, lerr)
		if next != 2 || (r.err == nil && num != 1) {
			skipped++
		}
		waitUntil(t, "A to reconnect", 10*time.Second, a.nc.IsConnected)
	}
	if skipped > 0 {
		t.Fatalf("FAULT: in %d of %d tries the session's first call's number write (buffered through a cut longer than its "+
			"attempt's bound) was applied twice: the look-up of its tag overtook it", skipped, tries)
	}
}
