package natsstore

import (
	"bytes"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/buffer"
	"github.com/mcpresume/caddy-mcp-resume/internal/testnet"
)

// A NATS server restarted with an empty store directory, under two
// replicas: both notice, recreate the stream, buckets and secret (the
// secret they held: event IDs signed before stay the proxy's), end the
// sessions they held (a tombstone remembers each, with the requests its
// client lacks an answer for), tell OnDataLost, and take new sessions.
//
// Not parallel: on a busier machine the tombstone was seen without the
// call's stream (2 runs of 3, even with B's mirror holding the stream).
func TestNATSBackWithoutItsData(t *testing.T) {
	srv, err := testnet.StartNATS(t.TempDir(), 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { testnet.ShutdownNATS(srv) }) // after the stores close (srv as it is by then)
	url, port := srv.ClientURL(), srv.Addr().(*net.TCPAddr).Port
	var mu sync.Mutex
	var losses []DataLoss
	mod := func(o *Options) {
		o.OnDataLost = func(l DataLoss) { mu.Lock(); losses = append(losses, l); mu.Unlock() }
	}
	a, b := openAt(t, []string{url}, mod), openAt(t, []string{url}, mod)
	key := bytes.Clone(a.Key())
	sa, err := a.CreateSession("lost", buffer.SessionMeta{})
	if err != nil {
		t.Fatal(err)
	}
	str, err := sa.NewStream([]string{"7"}, [32]byte{7})
	if err != nil {
		t.Fatal(err)
	}
	appendEvents(t, str, 1, 3)
	sessionOn(t, b, "lost")

	// The server goes, and comes back on the same port with nothing.
	testnet.ShutdownNATS(srv)
	srv, err = testnet.StartNATS(t.TempDir(), port)
	if err != nil {
		t.Fatal(err)
	}

	for _, st := range []*Store{a, b} {
		waitUntil(t, "the store to be available again", 30*time.Second, func() bool { return st.Available() == nil })
		waitUntil(t, "the lost session to be forgotten", 10*time.Second, func() bool { _, ok := st.Session("lost"); return !ok })
		if !bytes.Equal(st.Key(), key) {
			t.Fatal("the zone secret changed: the replicas held the same one")
		}
		tomb, ok := st.Tombstone("lost")
		if !ok {
			t.Fatal("no tombstone for the lost session")
		}
		// Only A (the stream's producer) names the live stream; B's
		// tombstone gets it when A's merge reaches B's mirror, which may be
		// a moment after B recovered (B recovering first, A merging later).
		deadline := time.Now().Add(10 * time.Second)
		for {
			v, ok := tomb.Past.Streams[str.Num()]
			if ok && len(v.Requests) == 1 && v.Requests[0].ID == "7" {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("the tombstone does not remember the call's stream: %+v", tomb.Past)
			}
			time.Sleep(5 * time.Millisecond)
			tomb, _ = st.Tombstone("lost")
		}
	}
	var got []DataLoss
	waitUntil(t, "both replicas to tell the loss", 10*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		got = append([]DataLoss(nil), losses...)
		return len(got) == 2
	})
	for _, l := range got {
		if l.Sessions != 1 || l.SecretChanged || len(l.Missing) == 0 {
			t.Fatalf("OnDataLost told %+v", got)
		}
	}
	// New sessions work, on both, and each sees the other's.
	s2, err := b.CreateSession("after", buffer.SessionMeta{})
	if err != nil {
		t.Fatalf("CreateSession after the loss: %v", err)
	}
	str2, err := s2.NewStream([]string{"1"}, [32]byte{1})
	if err != nil {
		t.Fatal(err)
	}
	appendEvents(t, str2, 1, 2)
	r, err := sessionOn(t, a, "after").Standalone().Attach(1)
	if err != nil {
		t.Fatal(err)
	}
	r.Close()
	s3, ok := a.Session("after")
	if !ok {
		t.Fatal("A does not see B's new session")
	}
	st3, ok := s3.Stream(str2.Num())
	if !ok {
		t.Fatal("A does not see the new session's stream")
	}
	r2, err := st3.Attach(1)
	if err != nil {
		t.Fatal(err)
	}
	defer r2.Close()
	if _, err := readSeqs(t, r2, s2.Epoch(), str2.Num(), 1, 2); err != nil {
		t.Fatal(err)
	}
}
