package buffer

// Test-only access, in the manner of Caddy's encode package: tests drive the
// sweeper by hand after moving their clock, and acknowledge positions
// directly instead of through a resume decision.

// Sweep runs one pass of the sweeper.
func (st *MemoryStore) Sweep() { st.sweep() }

// Ack records that the client holds everything up to seq.
func (s *memStream) Ack(seq uint64) {
	s.mu.Lock()
	n := s.ackLocked(seq)
	s.mu.Unlock()
	s.sess.store.budget.release(s, n)
}
