package natsstore

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/buffer"
	"github.com/mcpresume/caddy-mcp-resume/policy"
)

// Review 37: a stream made on replica B while replica A ends the session
// (expiry, a DELETE, an upstream 404). A judges the session on what its
// mirror holds; B's stream record, written after that judgement, was
// unknown to the tombstone A wrote, and the client coming back for the
// call got a held gap and no error for its request. Now the tombstone
// names every stream B made (A waits for the record of a number taken, see
// awaitStreamsMade), or B's NewStream fails (ErrSessionGone: the call
// passes through untapped).
func TestReview37StreamMadeWhileAnotherReplicaEndsTheSession(t *testing.T) {
	t.Parallel()
	a, b := replicas(t)
	const rounds = 60
	raced := 0
	for i := range rounds {
		id := fmt.Sprint("race", i)
		if _, err := a.CreateSession(id, buffer.SessionMeta{}); err != nil {
			t.Fatal(err)
		}
		sb := sessionOn(t, b, id)
		var wg sync.WaitGroup
		var made buffer.Stream
		var deleted bool
		wg.Add(2)
		go func() { defer wg.Done(); deleted = a.Delete(id, policy.ReasonExpired) }()
		go func() {
			defer wg.Done()
			time.Sleep(time.Duration(i%6) * 500 * time.Microsecond)
			made, _ = sb.NewStream([]string{"call"}, [32]byte{2})
		}()
		wg.Wait()
		if made == nil || !deleted {
			continue
		}
		raced++
		tomb, ok := a.Tombstone(id)
		if !ok {
			t.Fatalf("%s: no tombstone", id)
		}
		v, named := tomb.Past.Streams[made.Num()]
		if !named {
			t.Fatalf("%s: stream %d was made on B while A ended the session, and the tombstone does not name it", id, made.Num())
		}
		// What the client of that call gets when it comes back: an error
		// for its request, and the end.
		d := policy.DecideResume(policy.ResumeInput{SessionHeader: true,
			Cursor: policy.Cursor{Valid: true, Minted: true, Epoch: sb.Epoch(), Stream: made.Num(), Seq: 0},
			Past:   &policy.PastView{Reason: tomb.Past.Reason, Stream: &v}})
		if d.Kind != policy.Gap || d.Then != policy.ThenEnd || len(d.LostIDs) != 1 || d.LostIDs[0] != "call" {
			t.Fatalf("%s: resuming stream %d: %v then %v, lost %v; want a gap naming the request, then the end", id, made.Num(), d.Kind, d.Then, d.LostIDs)
		}
	}
	t.Logf("%d of %d rounds made a stream on B while A deleted the session", raced, rounds)
}

// A number taken for a stream whose record never came (its stream failed
// after taking it: a lease or record write that failed) holds a delete up
// for streamMadeWait at most, and the session goes.
func TestDeleteWaitsBoundedForAStreamNeverMade(t *testing.T) {
	t.Parallel()
	st := openEmbedded(t, testLimits())
	s, err := st.CreateSession("burned", buffer.SessionMeta{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := st.opCtx()
	defer cancel()
	if _, err := st.sessions.update(ctx, sessionToken("burned"), func(r *sessionRecord) error {
		r.NextStream++ // number 1 taken, its record never written
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	if !st.Delete("burned", policy.ReasonDeleted) {
		t.Fatal("not deleted")
	}
	if took := time.Since(began); took < streamMadeWait || took > streamMadeWait+3*time.Second {
		t.Fatalf("the delete took %v; want the wait for the record, %v, and no more", took, streamMadeWait)
	}
	if s.Context().Err() == nil {
		t.Fatal("the session's handle did not end")
	}
	if _, ok := st.Tombstone("burned"); !ok {
		t.Fatal("no tombstone")
	}
}
