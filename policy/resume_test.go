package policy

import (
	"net/http"
	"reflect"
	"testing"
)

const (
	epoch    = "k3j7x2qa" // the held session's current epoch
	oldEpoch = "vq2xa7ab" // an earlier incarnation's, also minted for it
)

func known() SessionView {
	return SessionView{Known: true, Epoch: epoch, NextStream: 5}
}

func cursor(seq uint64) Cursor {
	return Cursor{Valid: true, Minted: true, Epoch: epoch, Stream: 3, Seq: seq}
}

func on(c Cursor, stream uint32, epoch string) Cursor {
	c.Stream, c.Epoch = stream, epoch
	return c
}

func stream(kind StreamKind, state StreamState, floor, head uint64, reqs ...RequestView) *StreamView {
	return &StreamView{Kind: kind, State: state, Floor: floor, Head: head, Requests: reqs}
}

func req(id string, at uint64) RequestView { return RequestView{ID: id, AnsweredAt: at} }

// TestDecideResume has one or more rows per branch of DecideResume, in the
// order of the README's decision table.
func TestDecideResume(t *testing.T) {
	live := stream(RequestStream, Live, 5, 10, req("7", 0)) // retained 5..10
	hdr := func(in ResumeInput) ResumeInput { in.SessionHeader = true; return in }
	tests := []struct {
		name string
		in   ResumeInput
		want Resume // Detail is not compared
	}{
		// no Mcp-Session-Id: pass through, whatever else is there
		{"no session header", ResumeInput{Cursor: cursor(7), Session: known(), Stream: live}, Resume{Kind: PassThrough}},
		{"no session header, garbage id", ResumeInput{}, Resume{Kind: PassThrough}},

		// session not held
		{"unknown session, malformed id", hdr(ResumeInput{Cursor: Cursor{}}), Resume{Kind: PassThrough}},
		{"unknown session, our shape but not minted for it", hdr(ResumeInput{Cursor: Cursor{Valid: true, Epoch: epoch, Stream: 0, Seq: 3}}), Resume{Kind: PassThrough}},
		{"unknown session, standalone: proxy restarted", hdr(ResumeInput{Cursor: on(cursor(7), 0, epoch)}),
			Resume{Kind: Adopt, Reason: ReasonProxyRestarted}},
		{"remembered expired, standalone: adopt", hdr(ResumeInput{Cursor: on(cursor(7), 0, epoch),
			Past: &PastView{Reason: ReasonExpired}}),
			Resume{Kind: Adopt, Reason: ReasonExpired}},
		{"remembered deleted: the upstream answers (404: re-initialize)", hdr(ResumeInput{Cursor: on(cursor(7), 0, epoch),
			Past: &PastView{Reason: ReasonDeleted}}),
			Resume{Kind: PassThrough}},
		{"remembered deleted, request stream: the upstream answers", hdr(ResumeInput{Cursor: cursor(7),
			Past: &PastView{Reason: ReasonDeleted, Stream: stream(RequestStream, Live, 1, 9, req("1", 0))}}),
			Resume{Kind: PassThrough}},
		{"unknown session, request stream, nothing remembered: hold", hdr(ResumeInput{Cursor: cursor(7)}),
			Resume{Kind: Gap, Reason: ReasonProxyRestarted, Lost: -1, Then: ThenHold}},
		{"remembered purged, request stream pending: errors, cursor moved past its end", hdr(ResumeInput{Cursor: cursor(7),
			Past: &PastView{Reason: ReasonPurged, Stream: stream(RequestStream, Live, 1, 9, req("1", 0), req("2", 6))}}),
			Resume{Kind: Gap, Reason: ReasonPurged, Lost: -1, LostIDs: []string{"1"}, From: 11, Then: ThenEnd}},
		{"remembered, cursor past the stream's end: it had the errors", hdr(ResumeInput{Cursor: cursor(10),
			Past: &PastView{Reason: ReasonPurged, Stream: stream(RequestStream, Live, 1, 9, req("1", 0))}}),
			Resume{Kind: Ended}},
		{"remembered, cursor beyond the id the gap handed out: ahead, not the client's", hdr(ResumeInput{Cursor: cursor(1000),
			Past: &PastView{Reason: ReasonExpired, Stream: stream(RequestStream, Live, 1, 9, req("7", 0))}}),
			Resume{Kind: Reject, Status: 400}},
		{"remembered, request answered after the cursor: its answer is gone too", hdr(ResumeInput{Cursor: cursor(4),
			Past: &PastView{Reason: ReasonExpired, Stream: stream(RequestStream, Complete, 1, 6, req("1", 6))}}),
			Resume{Kind: Gap, Reason: ReasonExpired, Lost: -1, LostIDs: []string{"1"}, From: 8, Then: ThenEnd}},
		{"remembered, every answer before the cursor: ended", hdr(ResumeInput{Cursor: cursor(6),
			Past: &PastView{Reason: ReasonExpired, Stream: stream(RequestStream, Complete, 1, 6, req("1", 6))}}),
			Resume{Kind: Ended}},
		{"remembered, stream forgotten: hold", hdr(ResumeInput{Cursor: cursor(4),
			Past: &PastView{Reason: ReasonExpired}}),
			Resume{Kind: Gap, Reason: ReasonExpired, Lost: -1, Then: ThenHold}},

		// held session: credentials and cursor
		{"malformed id", hdr(ResumeInput{Cursor: Cursor{}, Session: known(), Stream: live}),
			Resume{Kind: Reject, Status: http.StatusBadRequest}},
		{"epoch minted for another session", hdr(ResumeInput{Cursor: Cursor{Valid: true, Epoch: "aaaaaaaa", Stream: 3, Seq: 7},
			Session: known(), Stream: live}),
			Resume{Kind: Reject, Status: http.StatusBadRequest}},
		{"no such stream", hdr(ResumeInput{Cursor: on(cursor(7), 9, epoch), Session: known()}),
			Resume{Kind: Reject, Status: http.StatusBadRequest}},
		{"retired request stream: gap, hold", hdr(ResumeInput{Cursor: on(cursor(7), 2, epoch), Session: known()}),
			Resume{Kind: Gap, Reason: ReasonEvicted, Lost: -1, Then: ThenHold}},
		{"ahead of head", hdr(ResumeInput{Cursor: cursor(11), Session: known(), Stream: live}),
			Resume{Kind: Reject, Status: http.StatusBadRequest}},
		{"far ahead of head", hdr(ResumeInput{Cursor: cursor(1 << 63), Session: known(), Stream: live}),
			Resume{Kind: Reject, Status: http.StatusBadRequest}},

		// an earlier incarnation of the held session (purged, expired, restarted)
		{"earlier epoch, standalone: gap, then the current standalone stream", hdr(ResumeInput{Cursor: on(cursor(40), 0, oldEpoch),
			Session: known(), Stream: stream(StandaloneStream, Live, 3, 8), Past: &PastView{Reason: ReasonPurged}}),
			Resume{Kind: Gap, Reason: ReasonPurged, Lost: -1, From: 3, Then: ThenReplay}},
		{"earlier epoch, request stream remembered", hdr(ResumeInput{Cursor: on(cursor(2), 2, oldEpoch), Session: known(),
			Past: &PastView{Reason: ReasonPurged, Stream: stream(RequestStream, Live, 1, 3, req("5", 0))}}),
			Resume{Kind: Gap, Reason: ReasonPurged, Lost: -1, LostIDs: []string{"5"}, From: 5, Then: ThenEnd}},
		{"earlier epoch, request stream, nothing remembered", hdr(ResumeInput{Cursor: on(cursor(2), 2, oldEpoch), Session: known()}),
			Resume{Kind: Gap, Reason: ReasonProxyRestarted, Lost: -1, Then: ThenHold}},

		// at head: replay nothing; an ended stream says so with 204
		{"at head", hdr(ResumeInput{Cursor: cursor(10), Session: known(), Stream: live}),
			Resume{Kind: Noop, From: 11}},
		{"fresh stream, priming id 0 at head 0", hdr(ResumeInput{Cursor: cursor(0), Session: known(),
			Stream: stream(RequestStream, Live, 1, 0)}),
			Resume{Kind: Noop, From: 1}},
		{"at head, everything evicted", hdr(ResumeInput{Cursor: cursor(10), Session: known(),
			Stream: stream(RequestStream, Live, 11, 10)}),
			Resume{Kind: Noop, From: 11}},
		{"at head of a complete stream", hdr(ResumeInput{Cursor: cursor(10), Session: known(),
			Stream: stream(RequestStream, Complete, 5, 10, req("7", 10))}),
			Resume{Kind: Ended}},
		{"at head of a failed stream", hdr(ResumeInput{Cursor: cursor(10), Session: known(),
			Stream: stream(RequestStream, Failed, 11, 10, req("7", 10))}),
			Resume{Kind: Ended}},

		// inside the window: replay seq+1..head
		{"replay from floor-1", hdr(ResumeInput{Cursor: cursor(4), Session: known(), Stream: live}),
			Resume{Kind: Replay, From: 5}},
		{"replay from floor", hdr(ResumeInput{Cursor: cursor(5), Session: known(), Stream: live}),
			Resume{Kind: Replay, From: 6}},
		{"replay one before head", hdr(ResumeInput{Cursor: cursor(9), Session: known(), Stream: live}),
			Resume{Kind: Replay, From: 10}},
		{"replay from priming id", hdr(ResumeInput{Cursor: cursor(0), Session: known(),
			Stream: stream(RequestStream, Live, 1, 3)}),
			Resume{Kind: Replay, From: 1}},
		{"replay a complete stream", hdr(ResumeInput{Cursor: cursor(6), Session: known(),
			Stream: stream(RequestStream, Complete, 5, 10, req("7", 10))}),
			Resume{Kind: Replay, From: 7}},
		{"replay the standalone stream", hdr(ResumeInput{Cursor: on(cursor(6), 0, epoch), Session: known(),
			Stream: stream(StandaloneStream, Live, 5, 10)}),
			Resume{Kind: Replay, From: 7}},

		// below the floor: a gap, and what follows it
		{"gap, standalone: replay then live", hdr(ResumeInput{Cursor: on(cursor(2), 0, epoch), Session: known(),
			Stream: stream(StandaloneStream, Live, 5, 10)}),
			Resume{Kind: Gap, From: 5, Reason: ReasonEvicted, Lost: 2, Then: ThenReplay}},
		{"gap, response retained", hdr(ResumeInput{Cursor: cursor(3), Session: known(),
			Stream: stream(RequestStream, Complete, 5, 10, req("7", 10))}),
			Resume{Kind: Gap, From: 5, Reason: ReasonEvicted, Lost: 1, Then: ThenReplay}},
		{"gap, response is the floor", hdr(ResumeInput{Cursor: cursor(1), Session: known(),
			Stream: stream(RequestStream, Complete, 5, 5, req("7", 5))}),
			Resume{Kind: Gap, From: 5, Reason: ReasonEvicted, Lost: 3, Then: ThenReplay}},
		{"gap, response still to come on a live stream", hdr(ResumeInput{Cursor: cursor(1), Session: known(),
			Stream: stream(RequestStream, Live, 5, 10, req("7", 0))}),
			Resume{Kind: Gap, From: 5, Reason: ReasonEvicted, Lost: 3, Then: ThenReplay}},
		{"gap, response evicted: an error for it, then the rest", hdr(ResumeInput{Cursor: cursor(1), Session: known(),
			Stream: stream(RequestStream, Complete, 5, 10, req("7", 4))}),
			Resume{Kind: Gap, From: 5, Reason: ReasonEvicted, Lost: 3, LostIDs: []string{"7"}, Then: ThenReplay}},
		{"gap, batch: only the evicted answer gets an error", hdr(ResumeInput{Cursor: cursor(1), Session: known(),
			Stream: stream(RequestStream, Live, 5, 10, req("a", 3), req("b", 0), req("c", 6))}),
			Resume{Kind: Gap, From: 5, Reason: ReasonEvicted, Lost: 3, LostIDs: []string{"a"}, Then: ThenReplay}},
		{"gap, answered before the cursor: no error", hdr(ResumeInput{Cursor: cursor(3), Session: known(),
			Stream: stream(RequestStream, Complete, 6, 10, req("a", 2))}),
			Resume{Kind: Gap, From: 6, Reason: ReasonEvicted, Lost: 2, Then: ThenReplay}},
		{"gap, everything evicted from a complete stream", hdr(ResumeInput{Cursor: cursor(3), Session: known(),
			Stream: stream(RequestStream, Complete, 11, 10, req("7", 10))}),
			Resume{Kind: Gap, From: 11, Reason: ReasonEvicted, Lost: 7, LostIDs: []string{"7"}, Then: ThenEnd}},
		{"gap, everything evicted from a failed stream", hdr(ResumeInput{Cursor: cursor(0), Session: known(),
			Stream: stream(RequestStream, Failed, 11, 10, req("7", 10))}),
			Resume{Kind: Gap, From: 11, Reason: ReasonEvicted, Lost: 10, LostIDs: []string{"7"}, Then: ThenEnd}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := DecideResume(tt.in)
			if got.Kind == Reject && got.Detail == "" {
				t.Errorf("reject without detail: %+v", got)
			}
			got.Detail = ""
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("DecideResume(%+v)\n got %+v\nwant %+v", tt.in, got, tt.want)
			}
		})
	}
}

// TestDecideResumeGrid walks every (floor, head, seq) in a small range and
// checks the invariants of rule 2: at head nothing is replayed; inside the
// window exactly seq+1.. is replayed; below the floor there is always a gap,
// never a silent restart (Noop, or a Replay that skips events); ahead is 400.
func TestDecideResumeGrid(t *testing.T) {
	for head := uint64(0); head <= 8; head++ {
		for floor := uint64(1); floor <= head+1; floor++ {
			for seq := uint64(0); seq <= head+2; seq++ {
				for _, kind := range []StreamKind{RequestStream, StandaloneStream} {
					c := cursor(seq)
					if kind == StandaloneStream {
						c.Stream = StandaloneNum
					}
					in := ResumeInput{SessionHeader: true, Session: known(), Cursor: c, Stream: stream(kind, Live, floor, head)}
					got := DecideResume(in)
					switch {
					case seq > head:
						if got.Kind != Reject || got.Status != http.StatusBadRequest {
							t.Errorf("floor=%d head=%d seq=%d: got %+v, want 400", floor, head, seq, got)
						}
					case seq == head:
						if got.Kind != Noop || got.From != head+1 {
							t.Errorf("floor=%d head=%d seq=%d: got %+v, want Noop", floor, head, seq, got)
						}
					case seq+1 >= floor:
						if got.Kind != Replay || got.From != seq+1 {
							t.Errorf("floor=%d head=%d seq=%d: got %+v, want Replay from %d", floor, head, seq, got, seq+1)
						}
					default: // seq < floor-1
						if got.Kind != Gap {
							t.Errorf("floor=%d head=%d seq=%d: got %+v, want Gap (never a silent restart)", floor, head, seq, got)
							continue
						}
						if got.From != floor || got.Lost != int64(floor-1-seq) || got.Lost == 0 || got.Reason != ReasonEvicted {
							t.Errorf("floor=%d head=%d seq=%d: got %+v", floor, head, seq, got)
						}
					}
					if (got.Kind == Replay || got.Kind == Noop) && got.From != seq+1 {
						t.Errorf("floor=%d head=%d seq=%d: %v from %d skips events silently", floor, head, seq, got.Kind, got.From)
					}
				}
			}
		}
	}
}

// TestBelowFloorNeverRestartsFromHead is the explicit case: a cursor below
// the floor on a stream whose head moved on must never be answered with a
// Noop or Replay (which would silently drop floor..seq).
func TestBelowFloorNeverRestartsFromHead(t *testing.T) {
	for _, st := range []*StreamView{
		stream(RequestStream, Live, 50, 100),
		stream(RequestStream, Complete, 50, 100, req("1", 100)),
		stream(RequestStream, Failed, 101, 100, req("1", 100)),
		stream(StandaloneStream, Live, 101, 100),
	} {
		for _, seq := range []uint64{0, 1, 48} {
			c := cursor(seq)
			if st.Kind == StandaloneStream {
				c.Stream = StandaloneNum
			}
			got := DecideResume(ResumeInput{SessionHeader: true, Session: known(), Cursor: c, Stream: st})
			if got.Kind == Noop || got.Kind == Replay {
				t.Fatalf("stream %+v seq %d: %+v restarts without a gap", *st, seq, got)
			}
			if got.Kind != Gap || got.Lost != int64(st.Floor-1-seq) {
				t.Fatalf("stream %+v seq %d: got %+v, want a gap losing %d", *st, seq, got, st.Floor-1-seq)
			}
		}
	}
}

// TestEndedStreamsNeverLoop: a client that reconnects to a request stream
// after its end (the TypeScript SDK 1.x does after a JSON-RPC error
// response) first gets what it lacks and then, with the cursor the gap or the
// replay left it at, 204: never the same answer again.
func TestEndedStreamsNeverLoop(t *testing.T) {
	for _, st := range []*StreamView{
		stream(RequestStream, Complete, 1, 6, req("1", 6)),
		stream(RequestStream, Failed, 4, 6, req("1", 5), req("2", 6)),
		stream(RequestStream, Failed, 7, 6, req("1", 5), req("2", 6)),
	} {
		for seq := uint64(0); seq <= st.Head; seq++ {
			c := cursor(seq)
			for step := 0; ; step++ {
				d := DecideResume(ResumeInput{SessionHeader: true, Session: known(), Cursor: c, Stream: st})
				if d.Kind == Ended {
					break
				}
				if step > 2 {
					t.Fatalf("stream %+v from seq %d: no end after %d reconnects (%+v)", *st, seq, step, d)
				}
				switch d.Kind {
				case Replay:
					c.Seq = st.Head // the client read to the end
				case Gap:
					c.Seq = d.From - 1 // the gap's id
					if d.Then == ThenReplay {
						c.Seq = st.Head
					}
				default:
					t.Fatalf("stream %+v seq %d: %+v", *st, seq, d)
				}
			}
		}
	}
}

// The same for a stream of an earlier incarnation: the gap leaves the client
// past the stream's end, so its next reconnect gets Ended.
func TestPastStreamsNeverLoop(t *testing.T) {
	past := &PastView{Reason: ReasonExpired, Stream: stream(RequestStream, Live, 1, 5, req("1", 0), req("2", 3))}
	for seq := uint64(0); seq <= 5; seq++ {
		c := on(cursor(seq), 3, oldEpoch)
		d := DecideResume(ResumeInput{SessionHeader: true, Session: known(), Cursor: c, Past: past})
		if d.Kind != Gap || d.Then != ThenEnd || len(d.LostIDs) == 0 {
			t.Fatalf("seq %d: %+v", seq, d)
		}
		c.Seq = d.From - 1 // the gap event's id
		if d2 := DecideResume(ResumeInput{SessionHeader: true, Session: known(), Cursor: c, Past: past}); d2.Kind != Ended {
			t.Fatalf("seq %d: after the gap got %+v, want Ended", seq, d2)
		}
	}
}
