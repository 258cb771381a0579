package natsstore

import (
	"context"
	"testing"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/buffer"
)

// A reading of the events stream taken while batches are being stored
// misses them; it must not wipe out what the replica counted for them. The
// reading here is taken, two more batches are stored, then the reading
// lands: the total still counts those batches. (It did not: eight streams
// without a client then took the reserve meant for connected clients.)
func TestATotalReadingKeepsWhatWasStoredMeanwhile(t *testing.T) {
	st := openEmbedded(t, testLimits())
	s, err := st.CreateSession("total", buffer.SessionMeta{})
	if err != nil {
		t.Fatal(err)
	}
	str, _ := s.NewStream([]string{"1"}, [32]byte{1})
	str.ClaimProducer()
	stored := func(from, to uint64) {
		appendEvents(t, str, from, to)
		if head := str.(*stream).WaitStored(); head != to {
			t.Fatalf("stored up to %d, want %d", head, to)
		}
	}
	stored(1, 10)
	info, err := st.events.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	stored(11, 20)
	stored(21, 30)
	st.total.settle(int64(info.State.Bytes), info.State.LastSeq)
	now, err := st.events.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	got := st.total.get(st, time.Hour)
	t.Logf("reading %d bytes at message %d; JetStream now %d at %d; the total says %d",
		info.State.Bytes, info.State.LastSeq, now.State.Bytes, now.State.LastSeq, got)
	if now.State.LastSeq <= info.State.LastSeq {
		t.Fatal("nothing was stored after the reading: the test shows nothing")
	}
	// storedSize overestimates a little, never under.
	if got < int64(now.State.Bytes) || got > int64(now.State.Bytes)+1024 {
		t.Fatalf("the total says %d bytes, JetStream holds %d", got, now.State.Bytes)
	}
	// A later reading counts them itself: nothing is counted twice.
	st.total.settle(int64(now.State.Bytes), now.State.LastSeq)
	if got := st.total.get(st, time.Hour); got != int64(now.State.Bytes) {
		t.Fatalf("after a reading that saw everything the total says %d, JetStream %d", got, now.State.Bytes)
	}
}
