package buffer

import "unsafe"

// Test-only access for the external tests (package buffer_test), in the
// manner of Caddy's encode package: they drive the sweeper and blocked
// appends by hand after moving their clock, acknowledge positions
// directly instead of through a resume decision, and count bytes exactly
// with one chunk per event.

// Sweep runs one pass of the sweeper.
func (st *MemoryStore) Sweep() { st.sweep() }

// Wake makes blocked appends decide again now, as a sweep that frees room
// would.
func (st *MemoryStore) Wake() { st.budget.wake() }

// ReserveRounds counts the decisions blocked appends have taken.
func (st *MemoryStore) ReserveRounds() uint64 { return st.reserveRounds.Load() }

// OneChunkPerEvent makes a store built with o put each event in a chunk of
// its own, so that an event's cost is its framed bytes and ChunkOverhead.
func OneChunkPerEvent(o Options) Options {
	o.chunkSize = 1
	return o
}

// ChunkOverhead is what a chunk holding one event costs beyond its bytes.
const ChunkOverhead = minIndex*indexEntry + chunkOverhead

// Ack records that the client holds everything up to seq on str.
func Ack(str Stream, seq uint64) {
	s := str.(*memStream)
	s.mu.Lock()
	n := s.ackLocked(seq)
	s.mu.Unlock()
	s.sess.store.budget.release(s, n)
}

// EvictUnder evicts up to seq whatever reads the stream: what no path may
// do, for tests of what happens if one did.
func EvictUnder(str Stream, seq uint64) {
	s := str.(*memStream)
	s.mu.Lock()
	s.log.evict(seq)
	s.mu.Unlock()
}

// StreamBytes is what a stream holds against the bounds now.
func StreamBytes(str Stream) int64 {
	s := str.(*memStream)
	s.sess.store.budget.mu.Lock()
	defer s.sess.store.budget.mu.Unlock()
	return s.bytes
}

// Accounting is what a stream's log holds (Size), what its chunks' memory
// is (Held), and what the stream, its session and the store count.
type Accounting struct{ Size, Held, Stream, Session, Store int64 }

// AccountingOf reads the accounting of str, a stream of st.
func AccountingOf(st *MemoryStore, str Stream) Accounting {
	s := str.(*memStream)
	s.mu.Lock()
	a := Accounting{Size: s.log.size, Held: capacityOf(&s.log)}
	s.mu.Unlock()
	st.budget.mu.Lock()
	a.Stream, a.Session, a.Store = s.bytes, s.sess.bytes, st.budget.total
	st.budget.mu.Unlock()
	return a
}

// ChunkMemory returns the memory of each of str's chunks, by its first
// byte, and the log's floor.
func ChunkMemory(str Stream) ([]*byte, uint64) {
	s := str.(*memStream)
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]*byte, 0, len(s.log.chunks))
	for _, c := range s.log.chunks {
		out = append(out, unsafe.SliceData(c.buf))
	}
	return out, s.log.floor
}
