package natsstore

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/policy"
)

// A session's end forgets its records through the session index, not a
// walk of the mirror: exactly its keys go (live and deleted ones, the
// groups and the live count kept right), another session's stay, even one
// whose token begins like it.
func TestForgetSessionDropsExactlyItsKeys(t *testing.T) {
	t.Parallel()
	m := newMirror[streamRecord](nil, incarnationOf, nil)
	rec := &streamRecord{Kind: policy.RequestStream}
	rev := uint64(0)
	put := func(key string, deleted bool) {
		rev++
		if deleted {
			m.apply(key, rev, nil, nil)
			return
		}
		m.apply(key, rev, []byte("{}"), rec)
	}
	for _, sh := range []string{"aaa", "aaab", "bbb"} {
		for n := 1; n <= 3; n++ {
			put(fmt.Sprintf("%s.e1.%d", sh, n), false)
		}
		put(sh+".e1.2", true) // a deleted key stays as a marker entry
	}
	m.forgetSession("aaa")
	for k := range m.entries {
		if sessionOfKey(k) == "aaa" {
			t.Errorf("key %s of the forgotten session is still held", k)
		}
	}
	if len(m.entries) != 6 || m.live != 4 || len(m.keysOf("aaab.e1")) != 2 || len(m.keysOf("aaa.e1")) != 0 {
		t.Fatalf("after forgetting aaa: %d entries, %d live, aaab's live keys %v", len(m.entries), m.live, m.keysOf("aaab.e1"))
	}
	if _, ok := m.bySession["aaa"]; ok || len(m.bySession["aaab"]) != 3 {
		t.Fatalf("session index: %v", m.bySession)
	}
	// The tidy queue forgets a deleted key: the index with it.
	m.due(-time.Hour, 100)
	if len(m.bySession["bbb"]) != 2 || len(m.entries) != 4 {
		t.Fatalf("after tidy: index %v, %d entries", m.bySession, len(m.entries))
	}
}

// The running sum of the changes since a reading counts what walking them
// counted: changes before, within a second of and after each reading, in
// and out of order, across new readings.
func TestZoneTallySumsAsTheWalkDid(t *testing.T) {
	t.Parallel()
	rnd := rand.New(rand.NewPCG(1, 2))
	var z zoneTally
	var all []tallyChange
	walk := func() [4]int64 {
		var n [4]int64
		copy(n[:], z.read.Counts[:])
		n[tombSlot] = int64(z.read.Tombs)
		for _, c := range all {
			if c.at > z.read.At {
				n[c.slot] += c.delta
			}
		}
		return n
	}
	now := int64(10 * time.Second)
	for step := 0; step < 5000; step++ {
		switch rnd.IntN(20) {
		case 0: // a new reading, taken a moment ago (never before the last)
			z.mu.Lock()
			z.read = publishedTally{Counts: [3]int64{rnd.Int64N(50), rnd.Int64N(10), rnd.Int64N(10)}, Tombs: rnd.IntN(20),
				At: max(z.read.At, now-rnd.Int64N(int64(2*time.Second)))}
			z.mu.Unlock()
		default:
			c := tallyChange{at: now - rnd.Int64N(int64(500*time.Millisecond)), slot: rnd.IntN(4), delta: int64(rnd.IntN(2))*2 - 1}
			all = append(all, c)
			z.add(c)
		}
		now += int64(time.Millisecond)
		c, tombs := z.counts()
		want := walk()
		got := [4]int64{int64(c.Sessions), int64(c.Adopted), int64(c.Untapped), int64(tombs)}
		for i := range want {
			want[i] = max(want[i], 0)
		}
		if got != want {
			t.Fatalf("step %d: counts %v, the walk %v", step, got, want)
		}
	}
}

// What a session's end costs the mirrors of a replica that holds n other
// sessions' records: the walk it was (forget with a predicate) against the
// session index.
func BenchmarkForgetSession(b *testing.B) {
	for _, n := range []int{100, 10000} {
		m := newMirror[streamRecord](nil, incarnationOf, nil)
		rec := &streamRecord{Kind: policy.RequestStream}
		rev := uint64(0)
		for i := 0; i < n; i++ {
			for k := 0; k < 4; k++ {
				rev++
				m.apply(fmt.Sprintf("s%05d.e1.%d", i, k), rev, []byte("{}"), rec)
			}
		}
		put := func() {
			for k := 0; k < 4; k++ {
				rev++
				m.apply(fmt.Sprintf("gone.e1.%d", k), rev, []byte("{}"), rec)
			}
		}
		b.Run(fmt.Sprintf("walk/%d", n), func(b *testing.B) {
			for b.Loop() {
				put()
				m.forget(func(key string) bool { return sessionOfKey(key) != "gone" })
			}
		})
		b.Run(fmt.Sprintf("index/%d", n), func(b *testing.B) {
			for b.Loop() {
				put()
				m.forgetSession("gone")
			}
		})
	}
}
