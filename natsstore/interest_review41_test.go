package natsstore

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/buffer"
	"github.com/mcpresume/caddy-mcp-resume/internal/testnet"
	"github.com/mcpresume/caddy-mcp-resume/policy"
)

// Review 41 (mended): two requests of one client adopt its session on the
// same replica at once (resume/tap.go serveCall: the loser's
// ErrSessionExists is expected). When the loser was the first to take an
// interest in the session (interestIn begun), its failure (CreateSession's
// failed()) dropped the interest the winner's handle shares: from then on
// the replica kept nothing of the session and heard of no other replica's
// writes to it, for as long as it lived. Now a creation that finds the
// session existing keeps the interest: it ends with the session record.
func TestReview41ConcurrentAdoptionsKeepTheSessionsInterest(t *testing.T) {
	t.Parallel()
	urls := []string{testnet.NATS(t).ClientURL()}
	a, b := openAt(t, urls), openAt(t, urls)
	var last string
	adopted := 0
	for i := 0; i < 300; i++ {
		id := fmt.Sprintf("adopt-%d", i)
		var wg sync.WaitGroup
		won := make([]bool, 2)
		for j := range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, err := a.CreateSession(id, buffer.SessionMeta{Origin: policy.Adopted})
				won[j] = err == nil
			}()
		}
		wg.Wait()
		if !won[0] && !won[1] {
			continue
		}
		if !a.interested(sessionToken(id) + ".x") {
			t.Fatalf("round %d: the adoption that lost dropped the winner's interest in the session", i)
		}
		last = id
		adopted++
	}
	if adopted < 100 {
		t.Fatalf("%d adoptions of 300 succeeded", adopted)
	}
	// Another replica's call in the last session reaches A's mirror.
	str, err := sessionOn(t, b, last).NewStream([]string{"1"}, [32]byte{1})
	if err != nil {
		t.Fatal(err)
	}
	key := str.(*stream).key
	waitUntil(t, "B's call to reach A's mirror", 5*time.Second, func() bool { _, _, ok := a.streams.get(key); return ok })
}
