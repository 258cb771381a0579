package resume

// Linux only: the send queue is asked with SIOCOUTQ (sendqueue_linux.go).

import (
	"testing"
	"time"
)

func TestSendQueue(t *testing.T) {
	srv, cli := tcpPair(t, true)
	sc := socketOf(srv)
	if sc == nil || !sendQueueEmpty(sc) {
		t.Fatal("a fresh connection: its send queue should be empty")
	}
	// A write the client reads: once acknowledged, the queue is empty again.
	if _, err := srv.Write([]byte("hello")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 5)
	if _, err := cli.Read(buf); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "the write to be acknowledged", func() bool { return sendQueueEmpty(sc) })
	// A client that reads nothing: what the server writes piles up.
	go srv.Write(make([]byte, 4<<20)) // blocks once the buffers are full; the cleanup's close ends it
	waitFor(t, 5*time.Second, "the send queue to fill", func() bool { return !sendQueueEmpty(sc) })
}
