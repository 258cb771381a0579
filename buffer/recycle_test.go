package buffer_test

import (
	"bytes"
	"context"
	"sync"
	"testing"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/buffer"
	"github.com/mcpresume/caddy-mcp-resume/buffer/storetest"
)

// recycleStore is a store with real chunk sizing (not one chunk per event)
// on a fake clock.
func recycleStore(t *testing.T) (*buffer.MemoryStore, *fakeClock, buffer.Limits) {
	t.Helper()
	lim := storetest.BigLimits()
	lim.MaxStreamBytes = 256 << 10 // chunks of at most 32 KiB
	clk := &fakeClock{now: time.Date(2025, 6, 18, 12, 0, 0, 0, time.UTC)}
	st := buffer.NewMemoryStore(buffer.Options{Limits: lim, Now: clk.Now, SweepInterval: time.Hour})
	t.Cleanup(st.Close)
	return st, clk, lim
}

// checkBytes checks that the stream, its session and the store count what
// the log holds.
func checkBytes(t *testing.T, st *buffer.MemoryStore, str buffer.Stream) {
	t.Helper()
	a := buffer.AccountingOf(st, str)
	if a.Size != a.Held || a.Stream != a.Size || a.Session != a.Size || a.Store != a.Size {
		t.Fatalf("log size %d, chunks hold %d, stream counts %d, session %d, store %d", a.Size, a.Held, a.Stream, a.Session, a.Store)
	}
}

// A busy stream whose client keeps up reuses its oldest chunk for new
// events once policy lets that chunk's events go: the events read back
// exactly, the counts stay exact, eviction is counted, and no new chunk
// memory is taken once the ring is full.
func TestRecycleReusesChunks(t *testing.T) {
	st, clk, lim := recycleStore(t)
	str := storetest.MustStream(t, storetest.MustSession(t, st, "s"))
	r, err := str.Attach(1)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	const size = 1000
	bufs := map[*byte]bool{}
	for round := 0; round < 20; round++ {
		storetest.AppendN(t, str, 100, size)
		evs, err := storetest.ReadUntil(t, r, 100)
		if err != nil {
			t.Fatal(err)
		}
		storetest.CheckSeqs(t, evs, uint64(round*100+1), size)
		r.Delivered(evs[len(evs)-1].Seq)
		// As a relay does after a write: back to Read, which waits (and
		// lets go of the batch written).
		if _, err := r.Read(context.Background(), nil, 1<<20, time.Millisecond); err != buffer.ErrIdle {
			t.Fatalf("read at head: %v", err)
		}
		checkBytes(t, st, str)
		mem, floor := buffer.ChunkMemory(str)
		for _, p := range mem {
			bufs[p] = true
		}
		if got := st.Counters().EventsEvicted.Load(); got != floor-1 {
			t.Fatalf("round %d: floor %d, %d events counted evicted", round, floor, got)
		}
		// The log holds at most the round being appended and the one
		// before, in chunks of 32 KiB, whatever the rounds before.
		if b := buffer.StreamBytes(str); b > 2*100*(size+30)+2*(32<<10+1<<10) {
			t.Fatalf("round %d: the stream holds %d bytes", round, b)
		}
		clk.Advance(lim.ResumeWindow) // what was delivered may go
	}
	if v := str.View(); v.Floor < 1800 {
		t.Fatalf("floor %d: the front chunks were not recycled", v.Floor)
	}
	// The chunks of the ramp-up (smaller) and of the ring, not 2000 events'
	// worth (over 60 chunks of 32 KiB).
	if len(bufs) > 30 {
		t.Fatalf("%d distinct chunk buffers for 2000 events: not recycled", len(bufs))
	}
	// What is retained still reads back whole, from the floor.
	r2, err := str.Attach(str.View().Floor)
	if err != nil {
		t.Fatal(err)
	}
	defer r2.Close()
	v := str.View()
	evs, err := storetest.ReadUntil(t, r2, int(v.Head-v.Floor+1))
	if err != nil {
		t.Fatal(err)
	}
	storetest.CheckSeqs(t, evs, v.Floor, size)
	assertNoEarlyEviction(t, st)
}

// A chunk a reader's latest batch holds slices of is never rewritten, even
// once its events may go: the client write of that batch may be under way
// until the reader's next Read. The chunk is evicted instead, and new events
// go to new memory.
func TestPinnedChunkIsNotRecycled(t *testing.T) {
	st, clk, lim := recycleStore(t)
	str := storetest.MustStream(t, storetest.MustSession(t, st, "s"))
	const size = 1000
	storetest.AppendN(t, str, 100, size)
	r, err := str.Attach(1)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	b, err := r.Read(context.Background(), nil, 50<<10, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	kept := bytes.Join(b.Data, nil) // what the client is being sent
	r.Delivered(b.Last)             // written; the next Read has not come yet
	clk.Advance(lim.ResumeWindow)   // and the window has passed
	storetest.AppendN(t, str, 100, size)
	if got := bytes.Join(b.Data, nil); !bytes.Equal(got, kept) {
		t.Fatalf("a batch being written was overwritten by later events")
	}
	// The pinned chunks went (whole chunks only: the last also holds
	// undelivered events), and new memory took the new events.
	if v := str.View(); v.Floor == 1 || v.Floor > b.Last+1 {
		t.Fatalf("floor %d: the chunks of the delivered events 1..%d should have gone", v.Floor, b.Last)
	}
	checkBytes(t, st, str)
	evs, err := storetest.Decode(b)
	if err != nil {
		t.Fatal(err)
	}
	storetest.CheckSeqs(t, evs, 1, size)
}

// Under the race detector: a producer appends while a reader reads,
// inspects every batch after reporting it delivered (as a relay writes,
// then reports, then reads again) and policy lets delivered events go at
// once, so chunks are recycled as fast as they can be. A chunk rewritten
// while a batch still held it would be a data race, and wrong bytes.
func TestRecycleWhileReading(t *testing.T) {
	lim := storetest.BigLimits()
	lim.MaxStreamBytes = 64 << 10
	lim.ResumeWindow = 0
	st := buffer.NewMemoryStore(buffer.Options{Limits: lim, SweepInterval: time.Millisecond})
	defer st.Close()
	str := storetest.MustStream(t, storetest.MustSession(t, st, "s"))
	const n, size = 20000, 300
	r, err := str.Attach(1)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 1; i <= n; i++ {
			if _, err := str.Append(context.Background(), buffer.Entry{Fields: storetest.Fields(storetest.Payload(uint64(i), size))}); err != nil {
				t.Error(err)
				return
			}
		}
		str.Complete()
	}()
	next := uint64(1)
	for {
		b, err := r.Read(context.Background(), nil, 4<<10, 5*time.Second)
		if err != nil {
			if next != n+1 {
				t.Fatalf("read ended at %d: %v", next, err)
			}
			break
		}
		r.Delivered(b.Last)
		time.Sleep(time.Duration(next%3) * time.Microsecond) // let the producer run
		evs, err := storetest.Decode(b)
		if err != nil {
			t.Fatal(err)
		}
		storetest.CheckSeqs(t, evs, next, size)
		next = b.Last + 1
	}
	r.Close()
	wg.Wait()
	checkBytes(t, st, str)
	assertNoEarlyEviction(t, st)
}
