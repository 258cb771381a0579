package natsstore

import (
	"fmt"
	"testing"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/buffer"
	"github.com/mcpresume/caddy-mcp-resume/internal/testnet"
)

// Review 26: max_sessions across replicas after issue 24 (interest +
// published tally). Three replicas of a zone, A opened first (it sweeps),
// the production sweep interval (500 ms). A client population creates
// sessions one after another (never two at once), alternating between the
// two replicas that do not sweep, as a round-robin load balancer would.
// With whole-bucket watches every replica saw the others' creations
// within milliseconds, so sequential creations could not pass
// max_sessions (only two replicas admitting "the last place at once").
// With the published tally, each non-sweeping replica counts only the
// tally (taken up to a sweep interval ago) plus its own creations.
func TestReview26SequentialCreatesOnTwoReplicasPassMaxSessions(t *testing.T) {
	t.Parallel()
	const maxSessions = 4
	mod := func(o *Options) {
		o.SweepInterval = 500 * time.Millisecond
		o.Limits.MaxSessions = maxSessions
	}
	urls := []string{testnet.NATS(t).ClientURL()}
	a := openAt(t, urls, mod)
	b, c := openAt(t, urls, mod), openAt(t, urls, mod)
	waitUntil(t, "A to sweep", 10*time.Second, func() bool { return a.sweeps() })
	if b.sweeps() || c.sweeps() {
		t.Fatal("B or C sweeps")
	}
	waitUntil(t, "B and C to read A's first tally", 10*time.Second, func() bool {
		read := func(st *Store) bool { st.zone.mu.Lock(); defer st.zone.mu.Unlock(); return st.zone.read.At != 0 }
		return read(b) && read(c)
	})
	created := 0
	for i := 0; i < 2*maxSessions; i++ {
		st := []*Store{b, c}[i%2]
		if _, err := st.CreateSession(fmt.Sprintf("s%d", i), buffer.SessionMeta{Version: "2025-06-18"}); err == nil {
			created++
		}
	}
	waitUntil(t, "the sweeper to count every session created", 10*time.Second, func() bool { return a.tally.counts().Sessions == created })
	zone := a.tally.counts().Sessions
	t.Logf("created %d sessions with max_sessions %d; the sweeper counts %d", created, maxSessions, zone)
	if zone > maxSessions+1 {
		t.Errorf("the zone holds %d sessions after sequential creations, max_sessions %d "+
			"(each non-sweeping replica admitted against a tally that did not include the other's creations)", zone, maxSessions)
	}
}
