package natsstore

import (
	"sync"

	"github.com/mcpresume/caddy-mcp-resume/policy"
)

// incIndex is what each call asks of its session's streams, kept as the
// stream records change instead of walked for: a session keeps 64 ended
// streams and those its window still holds, hundreds at a busy rate, and
// admission, the repeated-request index and the session bound each walked
// them all per call.
type incIndex struct {
	mu   sync.Mutex
	incs map[string]*incStats
}

type incStats struct {
	live     int                 // live request streams
	retained int64               // the bytes their records say the streams hold
	byKey    map[string][]uint32 // request key -> the request streams with it
}

// changed takes a record's change (old or cur nil: created, deleted). It
// runs under the streams mirror's lock, in revision order, so old is what
// the index counted for key.
func (x *incIndex) changed(key string, old, cur *streamRecord) {
	inc, num, ok := splitStreamKey(key)
	if !ok {
		return
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.incs == nil {
		x.incs = make(map[string]*incStats)
	}
	s := x.incs[inc]
	if s == nil {
		s = &incStats{byKey: make(map[string][]uint32)}
		x.incs[inc] = s
	}
	if old != nil {
		s.count(old, num, -1)
	}
	if cur != nil {
		s.count(cur, num, 1)
	}
	if s.live == 0 && s.retained == 0 && len(s.byKey) == 0 {
		delete(x.incs, inc)
	}
}

func (s *incStats) count(r *streamRecord, num uint32, sign int) {
	if r.Kind == policy.RequestStream && r.State == policy.Live {
		s.live += sign
	}
	s.retained += int64(sign) * r.retained()
	if r.Kind != policy.RequestStream || len(r.Key) == 0 {
		return
	}
	k := string(r.Key)
	nums := s.byKey[k]
	if sign > 0 {
		s.byKey[k] = append(nums, num)
		return
	}
	for i, n := range nums {
		if n == num {
			nums = append(nums[:i], nums[i+1:]...)
			break
		}
	}
	if len(nums) == 0 {
		delete(s.byKey, k)
	} else {
		s.byKey[k] = nums
	}
}

// liveRequests counts an incarnation's live request streams.
func (x *incIndex) liveRequests(inc string) int {
	x.mu.Lock()
	defer x.mu.Unlock()
	if s := x.incs[inc]; s != nil {
		return s.live
	}
	return 0
}

// retained is what an incarnation's stream records say its streams hold.
func (x *incIndex) retained(inc string) int64 {
	x.mu.Lock()
	defer x.mu.Unlock()
	if s := x.incs[inc]; s != nil {
		return s.retained
	}
	return 0
}

// latest is the highest-numbered request stream of an incarnation with the
// request key, 0 if none.
func (x *incIndex) latest(inc string, key []byte) uint32 {
	x.mu.Lock()
	defer x.mu.Unlock()
	var found uint32
	if s := x.incs[inc]; s != nil {
		for _, n := range s.byKey[string(key)] {
			found = max(found, n)
		}
	}
	return found
}
