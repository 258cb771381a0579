package natsstore

import (
	"strings"
	"testing"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/buffer"
	"github.com/mcpresume/caddy-mcp-resume/internal/testnet"
	"github.com/mcpresume/caddy-mcp-resume/policy"
)

// Review 42: with failed() moved out of the session record's create
// failure for review 41's mend, and undo() kept in its ErrKeyExists branch
// only, a create that fails otherwise (here a record over NATS's max payload, refused at
// once; a NATS outage past opTimeout is the same) neither drops the
// interest begun nor undoes the admission told to the other replicas. The
// session was never made, so no record's deletion ever ends the interest,
// and near the bound the others count a session that does not exist.
func TestReview42FailedCreateLeaksInterestAndTally(t *testing.T) {
	t.Parallel()
	urls := []string{testnet.StockNATS(t).ClientURL()} // max_payload 1 MiB
	mod := func(o *Options) { o.Limits.MaxSessions = 4; o.SweepInterval = 200 * time.Millisecond }
	sweeper := openAt(t, urls, mod)
	waitUntil(t, "the sweeper", 10*time.Second, func() bool { return sweeper.sweeps() })
	a, b := openAt(t, urls, mod), openAt(t, urls, mod)
	const id = "never-made"
	sh := sessionToken(id)
	huge := "/" + strings.Repeat("x", 2<<20) // the record exceeds max_payload: its create fails
	_, err := a.CreateSession(id, buffer.SessionMeta{Endpoint: huge})
	if err == nil {
		t.Fatal("the create succeeded")
	}
	t.Logf("create failed: %.120v", err)
	time.Sleep(2 * time.Second) // several sweeps and tally polls
	if _, _, ok := a.sessions.get(sh); ok {
		t.Fatal("the session exists")
	}
	a.interest.mu.Lock()
	_, kept := a.interest.subs[sh]
	a.interest.mu.Unlock()
	if kept {
		t.Errorf("A keeps an interest in session %s that was never made (nothing will ever end it)", sh)
	}
	if c := b.sessionCounts(); c.Sessions != 0 {
		t.Errorf("B counts %d sessions in an empty zone (A's failed creation never undone)", c.Sessions)
	}
	// Fill the zone from B: all 4 places must be there.
	for i := range 4 {
		if _, err := b.CreateSession("fill-"+string(rune('a'+i)), buffer.SessionMeta{Origin: policy.Initialized}); err != nil {
			t.Errorf("B refuses session %d of 4: %v", i+1, err)
		}
	}
}
