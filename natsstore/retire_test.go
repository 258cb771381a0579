package natsstore

import (
	"context"
	"fmt"
	"sort"
	"testing"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/buffer"
	"github.com/mcpresume/caddy-mcp-resume/policy"
)

// endedRequestStreams lists the ended request streams st's mirror holds,
// as a sweep takes them.
func endedRequestStreams(st *Store) []endedStream {
	var list []endedStream
	st.streams.each(func(key string, r *streamRecord, rev uint64) {
		if r.Kind == policy.RequestStream && r.State != policy.Live {
			list = append(list, endedStream{key, rev, r.Ended})
		}
	})
	return list
}

// Two replicas sweeping one session at once each judge on their own
// mirror which ended streams may retire. One whose list or mirror is from
// before the other's retirements must not go on to retire newer ones in
// their place: between them they retired a few more than the excess over
// EndedStreamsKept, and a late resume of one of the newest kept streams got
// a gap without its requests' IDs where it was owed a precise answer.
func TestTwoSweepsRetireNoMoreThanTheExcess(t *testing.T) {
	for _, seen := range []bool{true, false} {
		name := map[bool]string{true: "removals seen", false: "removals not seen yet"}[seen]
		t.Run(name, func(t *testing.T) {
			a, b := replicas(t, func(o *Options) { o.SweepInterval = time.Hour })
			sess, err := a.CreateSession("retire", buffer.SessionMeta{Version: "2025-06-18"})
			if err != nil {
				t.Fatal(err)
			}
			sessionOn(t, b, "retire") // B serves it too: it mirrors its streams
			const excess = 3
			calls := buffer.EndedStreamsKept + excess
			for i := range calls {
				shortCall(t, sess, fmt.Sprint(i+1))
			}
			ended := endedRequestStreams
			waitUntil(t, "B to see every call ended", 10*time.Second, func() bool { return len(ended(b)) == calls })
			late := time.Now().Add(2 * a.Limits().ResumeWindow) // every event may go
			listB := ended(b)                                   // as a sweep under way on B has it
			if seen {
				a.retire(ended(a), late)
				waitUntil(t, "B to see A's retirements", 10*time.Second, func() bool {
					return len(ended(b)) == buffer.EndedStreamsKept
				})
			} else {
				// A's retirements whose notifications have not reached B:
				// the oldest removed from KV behind both mirrors' backs.
				sort.Slice(listB, func(i, j int) bool { return listB[i].ended < listB[j].ended })
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				for _, e := range listB[:excess] {
					if err := a.streams.kv.Purge(ctx, e.key); err != nil {
						t.Fatal(err)
					}
				}
			}
			before := len(ended(b))
			b.retire(listB, late)
			if retired := before - len(ended(b)); retired != 0 {
				t.Errorf("B retired %d more ended streams: %d are kept, want %d",
					retired, calls-excess-retired, buffer.EndedStreamsKept)
			}
		})
	}
}
