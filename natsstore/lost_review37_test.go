package natsstore

import (
	"errors"
	"net"
	"testing"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/buffer"
	"github.com/mcpresume/caddy-mcp-resume/internal/testnet"
)

// Review 37 (against stream numbers reserved in blocks): NATS comes back
// without its data and another replica (C) has made the zone again; A has
// not noticed yet (two probes, a second apart). A stream of the session
// NATS lost must fail at once (ErrSessionGone: the call's answer passes
// through untapped, to its client), not be tapped into a session no longer
// in the zone, whose end moments later would lose the answer. Taking the
// number by compare-and-set on the session record is what asks KV.
// Not parallel, as TestNATSBackWithoutItsData.
func TestReview37StreamOfASessionNATSLost(t *testing.T) {
	srv, err := testnet.StartNATS(t.TempDir(), 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { testnet.ShutdownNATS(srv) })
	url, port := srv.ClientURL(), srv.Addr().(*net.TCPAddr).Port
	a := openAt(t, []string{url})
	sa, err := a.CreateSession("lost37", buffer.SessionMeta{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sa.NewStream([]string{"1"}, [32]byte{1}); err != nil {
		t.Fatal(err)
	}

	testnet.ShutdownNATS(srv)
	srv, err = testnet.StartNATS(t.TempDir(), port)
	if err != nil {
		t.Fatal(err)
	}
	c := openAt(t, []string{url}) // the zone made again, empty
	if _, ok := c.Session("lost37"); ok {
		t.Fatal("setup: the new zone has the session")
	}
	var str buffer.Stream
	deadline := time.Now().Add(10 * time.Second)
	for {
		str, err = sa.NewStream([]string{"2"}, [32]byte{2})
		if err == nil || errorsIsGone(err) || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond) // A's connection coming back
	}
	if err == nil {
		t.Fatalf("stream %d of session lost37 made, though NATS lost the session (C sees none: %v)", str.Num(), !sessionKnown(c, "lost37"))
	}
	t.Logf("NewStream: %v", err)
}

func errorsIsGone(err error) bool { return errors.Is(err, buffer.ErrSessionGone) }

func sessionKnown(st *Store, id string) bool { _, ok := st.Session(id); return ok }
