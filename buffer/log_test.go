package buffer

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"runtime"
	"strings"
	"testing"
	"time"
)

// logEvent is the fields of event seq in a test log: size payload bytes,
// unlike its neighbours'.
func logEvent(seq uint64, size int) []byte {
	return fmt.Appendf(nil, "data: %s\n", bytes.Repeat([]byte{'a' + byte(seq%26)}, size))
}

// frames is events from..to of a test log of size-byte payloads as the log
// frames them.
func frames(from, to uint64, size int) string {
	var b strings.Builder
	for seq := from; seq <= to; seq++ {
		fmt.Fprintf(&b, "id: abcdefgh-7-%d\n%s\n", seq, logEvent(seq, size))
	}
	return b.String()
}

func logOf(t *testing.T, n, size int) *eventLog {
	t.Helper()
	l := new(eventLog)
	*l = newEventLog("abcdefgh", 7, 64<<10)
	for i := 1; i <= n; i++ {
		f := logEvent(uint64(i), size)
		before := l.size
		grow := l.growth(l.framedLen(len(f)), false)
		if seq := l.append(f, false); seq != uint64(i) {
			t.Fatalf("append %d gave seq %d", i, seq)
		}
		if l.size-before != grow {
			t.Fatalf("append %d grew the log by %d, growth said %d", i, l.size-before, grow)
		}
	}
	return l
}

// capacityOf recounts what a log holds from its chunks.
func capacityOf(l *eventLog) int64 {
	var n int64
	for _, c := range l.chunks {
		n += c.capacity()
	}
	return n
}

func TestLogSizeIsItsCapacity(t *testing.T) {
	for _, size := range []int{1, 100, 1000, 20000, 100000} {
		l := logOf(t, 300, size)
		if got := capacityOf(l); got != l.size {
			t.Fatalf("size %d: log counts %d, holds %d", size, l.size, got)
		}
		var framed int64
		for _, c := range l.chunks {
			framed += int64(len(c.buf))
		}
		// Chunks of about a quarter of what the log holds waste little: at
		// most a chunk's worth, plus the index and per-chunk overhead.
		if waste := l.size - framed; waste > framed/2+64<<10 {
			t.Errorf("size %d: %d framed bytes held in %d bytes of chunks", size, framed, l.size)
		}
		for seq := uint64(1); seq <= l.head; seq += 97 {
			c := l.chunks[l.chunkOf(seq)]
			s, e := c.span(seq)
			if string(c.buf[s:e]) != frames(seq, seq, size) {
				t.Fatalf("size %d: event %d framed as %q", size, seq, c.buf[s:e])
			}
		}
	}
}

func TestLogRead(t *testing.T) {
	l := logOf(t, 500, 100)
	one := len(frames(100, 100, 100))
	for _, tc := range []struct {
		from, to  uint64
		maxBytes  int
		wantLast  uint64
		wantBytes int
	}{
		{1, 500, 1 << 30, 500, -1},
		{1, 500, 1, 1, -1}, // less than one event: still one
		{100, 500, 3 * one, 102, 3 * one},
		{100, 100, 1 << 30, 100, one},
		{499, 500, 1 << 30, 500, -1},
	} {
		data, last := l.read(nil, tc.from, tc.to, tc.maxBytes)
		all := bytes.Join(data, nil)
		if last != tc.wantLast || tc.wantBytes >= 0 && len(all) != tc.wantBytes {
			t.Fatalf("read(%d, %d, %d) = last %d, %d bytes", tc.from, tc.to, tc.maxBytes, last, len(all))
		}
		if string(all) != frames(tc.from, last, 100) {
			t.Fatalf("read(%d, %d) gave %q", tc.from, tc.to, all)
		}
	}
}

func TestLogEvict(t *testing.T) {
	l := logOf(t, 1000, 100)
	before := l.size
	if freed := l.evict(0); freed != 0 || l.floor != 1 {
		t.Fatal("evicting nothing")
	}
	freed := l.evict(600)
	if l.floor != 601 || freed <= 0 || l.size != before-freed || capacityOf(l) != l.size {
		t.Fatalf("after evict(600): floor %d freed %d size %d (held %d)", l.floor, freed, l.size, capacityOf(l))
	}
	if c := l.chunks[0]; c.first > 601 || c.last() < 601 {
		t.Fatalf("first chunk %d..%d does not hold the floor", c.first, c.last())
	}
	data, last := l.read(nil, 601, 1000, 1<<30)
	held := frames(601, last, 100)
	if all := bytes.Join(data, nil); string(all) != held {
		t.Fatalf("read after evict(600) gave %d..%d: %q", 601, last, all)
	}
	if l.live != int64(len(held)) {
		t.Fatalf("live %d, events hold %d", l.live, len(held))
	}
	// Evicting everything gives every chunk back, the last one too.
	l.evict(1000)
	if l.size != 0 || len(l.chunks) != 0 || l.live != 0 || l.floor != 1001 {
		t.Fatalf("after evicting all: size %d chunks %d live %d floor %d", l.size, len(l.chunks), l.live, l.floor)
	}
	l.append([]byte("data: x\n"), false)
	if l.head != 1001 || l.floor != 1001 {
		t.Fatalf("append after emptying: head %d floor %d", l.head, l.floor)
	}
}

// Delivery records coalesce within a quantum, keep the latest time (so no
// event is taken for delivered earlier than it was), and stay few.
func TestLogDeliveries(t *testing.T) {
	l := logOf(t, 10000, 10)
	const q = 100 * time.Millisecond
	t0 := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano()
	for seq := uint64(1); seq <= 10000; seq++ {
		l.delivered(seq, t0+int64(seq)*int64(time.Millisecond), q) // one event a millisecond
	}
	if n := len(l.deliveries); n > 101 {
		t.Fatalf("%d delivery records for 10 s at a %v quantum", n, q)
	}
	now := time.Unix(0, t0+int64(5*time.Second)+int64(time.Minute))
	upTo := l.evictable(0, 0, false, now, time.Minute)
	if upTo == 0 || upTo == 10000 {
		t.Fatalf("evictable %d: the window must release some but not all", upTo)
	}
	// Nothing may go before its own window: event upTo was delivered at
	// t0+upTo ms, at most the window before now.
	if delivered := t0 + int64(upTo)*int64(time.Millisecond); now.UnixNano()-delivered < int64(time.Minute) {
		t.Fatalf("event %d released %v early", upTo, time.Minute-time.Duration(now.UnixNano()-delivered))
	}
	if slack := time.Duration(now.UnixNano()-(t0+int64(upTo+1)*int64(time.Millisecond))) - time.Minute; slack > q {
		t.Fatalf("event %d held %v past its window (quantum %v)", upTo+1, slack, q)
	}
	l.undeliver(5000)
	if last := l.deliveries[len(l.deliveries)-1]; last.seq > 5000 {
		t.Fatalf("undeliver(5000) kept a record up to %d", last.seq)
	}
	// An attached reader holds everything it has yet to read.
	if got := l.evictable(0, 3, false, now, time.Minute); got != 2 {
		t.Fatalf("evictable under a reader at 3: %d", got)
	}
}

// The review's scenario: streams that cycle many small events within the
// window, acknowledged up to head-1. What the store counts must be what the
// heap holds: no evicted event may keep memory the bounds do not see.
func TestRetainedBytesTrackTheHeap(t *testing.T) {
	if testing.Short() {
		t.Skip("short: allocates ~100 MB")
	}
	st := NewMemoryStore(Options{SweepInterval: time.Hour, Limits: Limits{
		MaxStreamBytes: 1 << 30, MaxSessionBytes: 1 << 30, MaxTotalBytes: 1 << 32, MaxSessions: 1, MaxStreamsPerSession: 5,
		ResumeWindow: time.Minute, StallTimeout: time.Hour,
	}})
	defer st.Close()
	s, err := st.CreateSession("cycle", SessionMeta{})
	if err != nil {
		t.Fatal(err)
	}
	heap := func() int64 {
		runtime.GC()
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return int64(m.HeapAlloc)
	}
	base := heap()
	var streams []Stream
	f := logEvent(1, 20)
	for cycle := 0; cycle < 5; cycle++ {
		str, err := s.NewStream([]string{"1"}, [32]byte{byte(cycle)})
		if err != nil {
			t.Fatal(err)
		}
		for i := 0; i < 150000; i++ {
			if _, err := str.Append(context.Background(), Entry{Fields: f}); err != nil {
				t.Fatal(err)
			}
		}
		Ack(str, 150000-1)
		streams = append(streams, str)
	}
	retained := st.Stats().RetainedBytes
	grown := heap() - base
	t.Logf("retained_bytes %d, heap grew %d", retained, grown)
	// Each stream still holds the chunk of its last event (64 KiB and its
	// index at most); the 150,000 evicted events of each are gone.
	if retained > 5*(64<<10+16<<10) {
		t.Fatalf("retained_bytes %d for 5 streams holding one small event each", retained)
	}
	// The heap may hold the session and stream records besides (a few KiB
	// each); it must not hold what was evicted.
	if grown > retained+256<<10 {
		t.Fatalf("heap grew %d bytes, retained_bytes says %d: evicted events still hold memory", grown, retained)
	}
	runtime.KeepAlive(streams)
}

// The recycler asks policy about a chunk's last event only: evictability
// falls with seq, so that answer must be the whole prefix's. Checked
// against the event-by-event walk over random acks, deliveries and
// reader positions.
func TestEvictableThroughAgreesWithTheWalk(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	base := time.Unix(1_000_000, 0)
	for trial := 0; trial < 2000; trial++ {
		l := newEventLog("abcdefgh", 1, 64<<10)
		n := 1 + r.IntN(50)
		for i := 0; i < n; i++ {
			l.append([]byte("data: x\n"), false)
		}
		at := base
		for seq := uint64(0); seq < l.head; {
			seq += uint64(1 + r.IntN(5))
			at = at.Add(time.Duration(r.IntN(3)) * time.Millisecond)
			l.delivered(min(seq, l.head), at.UnixNano(), time.Millisecond)
		}
		if r.IntN(3) == 0 {
			l.undeliver(uint64(r.IntN(n)))
		}
		acked, readerNext := uint64(r.IntN(n+1)), uint64(r.IntN(n+2))
		now, window := base.Add(time.Duration(r.IntN(300))*time.Millisecond), time.Duration(r.IntN(200))*time.Millisecond
		upTo := l.evictable(acked, readerNext, false, now, window)
		for seq := uint64(1); seq <= l.head; seq++ {
			if got, want := l.evictableThrough(seq, acked, readerNext, now, window), seq <= upTo; got != want {
				t.Fatalf("trial %d: through %d: %v, the walk evicts up to %d (acked %d, reader %d, deliveries %v)",
					trial, seq, got, upTo, acked, readerNext, l.deliveries)
			}
		}
	}
}
