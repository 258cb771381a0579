package natsstore

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/buffer"
	"github.com/mcpresume/caddy-mcp-resume/policy"
)

// Review 37 (against stream numbers reserved in blocks per replica, tried
// for issue 23 and dropped): the latest stream of a request must be the
// run made last whatever the replicas' clocks say. Numbers taken one by
// one by compare-and-set on the session record order the runs; a record's
// Created, stamped by its replica's clock, does not (B's clock 2 s fast,
// simulated by moving its record's Created forward as B would have
// written it).
func TestReview37LatestStreamOfARequestDependsOnReplicaClocks(t *testing.T) {
	t.Parallel()
	a, b := replicas(t)
	sa, err := a.CreateSession("skew", buffer.SessionMeta{})
	if err != nil {
		t.Fatal(err)
	}
	sb := sessionOn(t, b, "skew")
	key := [32]byte{37}

	// Run 1, on B, whose clock runs 2 s fast.
	first, err := sb.NewStream([]string{"1"}, key)
	if err != nil {
		t.Fatal(err)
	}
	first.Complete()
	const skew = 2 * time.Second
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	fkey := streamKey(sessionToken("skew"), sb.Epoch(), first.Num())
	if _, err := b.streams.update(ctx, fkey, func(r *streamRecord) error {
		r.Created += int64(skew) // what B's clock said when it created it
		return nil
	}); err != nil {
		t.Fatal(err)
	}

	// Run 2 of the same request, on A, 100 ms later in real time (within
	// the skew): it is the latest run.
	time.Sleep(100 * time.Millisecond)
	second, err := sa.NewStream([]string{"1"}, key)
	if err != nil {
		t.Fatal(err)
	}
	second.Complete()

	for i, st := range []*Store{a, b} {
		s := []buffer.Session{sa, sb}[i]
		waitUntil(t, "the replica to hold both runs", 10*time.Second, func() bool {
			_, _, ok1 := st.streams.get(streamKey(sessionToken("skew"), s.Epoch(), first.Num()))
			_, _, ok2 := st.streams.get(streamKey(sessionToken("skew"), s.Epoch(), second.Num()))
			return ok1 && ok2
		})
		if got, ok := s.StreamByKey(key); !ok || got.Num() != second.Num() {
			t.Errorf("replica %d: StreamByKey = %s, want stream %d (the run made last); stream %d was made %v earlier on a replica whose clock is %v fast",
				i, review37Describe(got, ok), second.Num(), first.Num(), 100*time.Millisecond, skew)
		}
	}
}

// Review 37 (against stream numbers reserved in blocks): a tombstone
// remembers at most MaxPastStreams request streams, the highest numbers,
// which must be the newest. B makes 64 calls, then A the newest: all owed.
// The tombstone must name A's, or the client resuming it gets a held gap
// and no error for its request (pastRequestGap with no Past.Stream).
func TestReview37TombstoneForgetsTheNewestCallOfAnotherReplicasBlock(t *testing.T) {
	t.Parallel()
	a, b := replicas(t)
	sa, err := a.CreateSession("tomb", buffer.SessionMeta{})
	if err != nil {
		t.Fatal(err)
	}
	sb := sessionOn(t, b, "tomb")
	for i := range buffer.MaxPastStreams {
		if _, err := sb.NewStream([]string{fmt.Sprint("b", i)}, [32]byte{1, byte(i)}); err != nil {
			t.Fatal(err)
		}
	}
	newest, err := sa.NewStream([]string{"newest"}, [32]byte{2})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("the newest call is stream %d", newest.Num())
	waitUntil(t, "A to hold every stream record", 10*time.Second, func() bool {
		return len(a.streams.keysOf(sessionToken("tomb")+"."+sa.Epoch())) == buffer.MaxPastStreams+2 // and the standalone
	})
	if !a.Delete("tomb", policy.ReasonExpired) {
		t.Fatal("not deleted")
	}
	tomb, ok := a.Tombstone("tomb")
	if !ok {
		t.Fatal("no tombstone")
	}
	if _, ok := tomb.Past.Streams[newest.Num()]; !ok {
		t.Errorf("the tombstone remembers %d streams but not stream %d, the newest call (request \"newest\" unanswered)",
			len(tomb.Past.Streams), newest.Num())
		// What the client resuming that call gets:
		var pv *policy.PastView = &policy.PastView{Reason: tomb.Past.Reason}
		d := policy.DecideResume(policy.ResumeInput{SessionHeader: true,
			Cursor: policy.Cursor{Valid: true, Minted: true, Epoch: sa.Epoch(), Stream: newest.Num(), Seq: 0}, Past: pv})
		t.Errorf("its resume: %v then %v, lost IDs %v (want an error for \"newest\" and the end)", d.Kind, d.Then, d.LostIDs)
	}
}

func review37Describe(s buffer.Stream, ok bool) string {
	if !ok {
		return "none"
	}
	return fmt.Sprint("stream ", s.Num())
}

// Review 37 (against stream numbers reserved in blocks): README,
// "Resume decisions": a cursor naming a stream number never used gets 400.
// The resume decision takes every number below NextStream for one used
// and retired since (an evicted gap, held open), so NextStream must not run
// ahead of the numbers used, on any replica. A cursor's stream number is
// not under its MAC (its epoch is).
func TestReview37CursorOnANeverUsedStreamNumberIsRefused(t *testing.T) {
	t.Parallel()
	a, b := replicas(t)
	sa, err := a.CreateSession("never", buffer.SessionMeta{})
	if err != nil {
		t.Fatal(err)
	}
	s1, err := sa.NewStream([]string{"1"}, [32]byte{1}) // stream 1
	if err != nil {
		t.Fatal(err)
	}
	sb := sessionOn(t, b, "never")
	s2, err := sb.NewStream([]string{"2"}, [32]byte{2})
	if err != nil {
		t.Fatal(err)
	}
	used := map[uint32]bool{s1.Num(): true, s2.Num(): true}
	for _, c := range []struct {
		s   buffer.Session
		num uint32
	}{{sa, 2}, {sa, 3}, {sa, 20}, {sb, 2}, {sb, 3}, {sb, 20}} {
		if used[c.num] {
			continue
		}
		waitUntil(t, "the replica to see both streams made", 10*time.Second, func() bool { return c.s.NextStream() > s2.Num() })
		if _, ok := c.s.Stream(c.num); ok {
			t.Fatalf("stream %d exists", c.num)
		}
		d := policy.DecideResume(policy.ResumeInput{SessionHeader: true,
			Session: policy.SessionView{Known: true, Epoch: c.s.Epoch(), NextStream: c.s.NextStream()},
			Cursor:  policy.Cursor{Valid: true, Minted: true, Epoch: c.s.Epoch(), Stream: c.num, Seq: 3}})
		if d.Kind != policy.Reject || d.Status != 400 {
			t.Errorf("a cursor on stream %d (never used; NextStream %d): %v (reason %s, then %v), want 400",
				c.num, c.s.NextStream(), d.Kind, d.Reason, d.Then)
		}
	}
}
