package policy

import (
	"net/http"
	"testing"
)

const epoch = "k3j7x2qa"

func known() SessionView { return SessionView{Known: true, Epoch: epoch, CredentialOK: true} }

func cursor(seq uint64) Cursor { return Cursor{Valid: true, Epoch: epoch, Stream: 3, Seq: seq} }

func stream(kind StreamKind, state StreamState, floor, head, resp uint64) *StreamView {
	return &StreamView{Kind: kind, State: state, Floor: floor, Head: head, ResponseSeq: resp}
}

// TestDecideResume has one or more rows per branch of DecideResume, in the
// order of design.md §5.
func TestDecideResume(t *testing.T) {
	live := stream(RequestStream, Live, 5, 10, 0) // retained 5..10
	tests := []struct {
		name string
		in   ResumeInput
		want Resume // Detail is not compared
	}{
		// no Mcp-Session-Id: pass through, whatever else is there
		{"no session header", ResumeInput{Cursor: cursor(7), Session: known(), Stream: live}, Resume{Kind: PassThrough}},
		{"no session header, garbage id", ResumeInput{}, Resume{Kind: PassThrough}},

		// unknown session
		{"unknown session, foreign id", ResumeInput{SessionHeader: true, Cursor: Cursor{Valid: false}},
			Resume{Kind: PassThrough}},
		{"unknown session, foreign id, tombstoned", ResumeInput{SessionHeader: true, Cursor: Cursor{Valid: false},
			Session: SessionView{Tombstoned: true, TombReason: ReasonExpired, CredentialOK: true}},
			Resume{Kind: PassThrough}},
		{"unknown session, our id: proxy restarted", ResumeInput{SessionHeader: true, Cursor: cursor(7)},
			Resume{Kind: Adopt, Reason: ReasonProxyRestarted}},
		{"unknown session, our id, credential flag irrelevant without tombstone", ResumeInput{SessionHeader: true, Cursor: cursor(7),
			Session: SessionView{CredentialOK: true}},
			Resume{Kind: Adopt, Reason: ReasonProxyRestarted}},
		{"tombstoned expired", ResumeInput{SessionHeader: true, Cursor: cursor(7),
			Session: SessionView{Tombstoned: true, TombReason: ReasonExpired, CredentialOK: true}},
			Resume{Kind: Adopt, Reason: ReasonExpired}},
		{"tombstoned deleted", ResumeInput{SessionHeader: true, Cursor: cursor(7),
			Session: SessionView{Tombstoned: true, TombReason: ReasonDeleted, CredentialOK: true}},
			Resume{Kind: Adopt, Reason: ReasonDeleted}},
		{"tombstoned, credentials differ", ResumeInput{SessionHeader: true, Cursor: cursor(7),
			Session: SessionView{Tombstoned: true, TombReason: ReasonExpired, CredentialOK: false}},
			Resume{Kind: Reject, Status: http.StatusForbidden}},

		// known session
		{"credentials differ", ResumeInput{SessionHeader: true, Cursor: cursor(7),
			Session: SessionView{Known: true, Epoch: epoch, CredentialOK: false}, Stream: live},
			Resume{Kind: Reject, Status: http.StatusForbidden}},
		{"credentials differ, malformed id: 403 first", ResumeInput{SessionHeader: true, Cursor: Cursor{},
			Session: SessionView{Known: true, Epoch: epoch, CredentialOK: false}},
			Resume{Kind: Reject, Status: http.StatusForbidden}},
		{"malformed id", ResumeInput{SessionHeader: true, Cursor: Cursor{}, Session: known(), Stream: live},
			Resume{Kind: Reject, Status: http.StatusBadRequest}},
		{"foreign epoch", ResumeInput{SessionHeader: true, Cursor: Cursor{Valid: true, Epoch: "aaaaaaaa", Stream: 3, Seq: 7},
			Session: known(), Stream: live},
			Resume{Kind: Reject, Status: http.StatusBadRequest}},
		{"no such stream", ResumeInput{SessionHeader: true, Cursor: cursor(7), Session: known(), Stream: nil},
			Resume{Kind: Reject, Status: http.StatusBadRequest}},
		{"ahead of head", ResumeInput{SessionHeader: true, Cursor: cursor(11), Session: known(), Stream: live},
			Resume{Kind: Reject, Status: http.StatusBadRequest}},
		{"far ahead of head", ResumeInput{SessionHeader: true, Cursor: cursor(1 << 63), Session: known(), Stream: live},
			Resume{Kind: Reject, Status: http.StatusBadRequest}},

		// at head: replay nothing
		{"at head", ResumeInput{SessionHeader: true, Cursor: cursor(10), Session: known(), Stream: live},
			Resume{Kind: Noop, From: 11}},
		{"fresh stream, priming id 0 at head 0", ResumeInput{SessionHeader: true, Cursor: cursor(0), Session: known(),
			Stream: stream(RequestStream, Live, 1, 0, 0)},
			Resume{Kind: Noop, From: 1}},
		{"at head, everything evicted", ResumeInput{SessionHeader: true, Cursor: cursor(10), Session: known(),
			Stream: stream(RequestStream, Live, 11, 10, 0)},
			Resume{Kind: Noop, From: 11}},

		// inside the window: replay seq+1..head
		{"replay from floor-1", ResumeInput{SessionHeader: true, Cursor: cursor(4), Session: known(), Stream: live},
			Resume{Kind: Replay, From: 5}},
		{"replay from floor", ResumeInput{SessionHeader: true, Cursor: cursor(5), Session: known(), Stream: live},
			Resume{Kind: Replay, From: 6}},
		{"replay one before head", ResumeInput{SessionHeader: true, Cursor: cursor(9), Session: known(), Stream: live},
			Resume{Kind: Replay, From: 10}},
		{"replay from priming id", ResumeInput{SessionHeader: true, Cursor: cursor(0), Session: known(),
			Stream: stream(RequestStream, Live, 1, 3, 0)},
			Resume{Kind: Replay, From: 1}},
		{"replay a complete stream", ResumeInput{SessionHeader: true, Cursor: cursor(6), Session: known(),
			Stream: stream(RequestStream, Complete, 5, 10, 10)},
			Resume{Kind: Replay, From: 7}},

		// below the floor: a gap, and what follows it
		{"gap, standalone: then live", ResumeInput{SessionHeader: true, Cursor: cursor(2), Session: known(),
			Stream: stream(StandaloneStream, Live, 5, 10, 0)},
			Resume{Kind: Gap, From: 5, Reason: ReasonEvicted, Lost: 2, Then: ThenLive}},
		{"gap, standalone failed: still then live", ResumeInput{SessionHeader: true, Cursor: cursor(0), Session: known(),
			Stream: stream(StandaloneStream, Failed, 5, 10, 0)},
			Resume{Kind: Gap, From: 5, Reason: ReasonEvicted, Lost: 4, Then: ThenLive}},
		{"gap, response retained", ResumeInput{SessionHeader: true, Cursor: cursor(3), Session: known(),
			Stream: stream(RequestStream, Complete, 5, 10, 10)},
			Resume{Kind: Gap, From: 5, Reason: ReasonEvicted, Lost: 1, Then: ThenReplay}},
		{"gap, response is the floor", ResumeInput{SessionHeader: true, Cursor: cursor(1), Session: known(),
			Stream: stream(RequestStream, Complete, 5, 5, 5)},
			Resume{Kind: Gap, From: 5, Reason: ReasonEvicted, Lost: 3, Then: ThenReplay}},
		{"gap, response still to come on a live stream", ResumeInput{SessionHeader: true, Cursor: cursor(1), Session: known(),
			Stream: stream(RequestStream, Live, 5, 10, 0)},
			Resume{Kind: Gap, From: 5, Reason: ReasonEvicted, Lost: 3, Then: ThenReplay}},
		{"gap, response evicted", ResumeInput{SessionHeader: true, Cursor: cursor(1), Session: known(),
			Stream: stream(RequestStream, Complete, 5, 10, 4)},
			Resume{Kind: Gap, From: 5, Reason: ReasonEvicted, Lost: 3, Then: ThenError}},
		{"gap, response evicted, stream still live", ResumeInput{SessionHeader: true, Cursor: cursor(1), Session: known(),
			Stream: stream(RequestStream, Live, 5, 10, 4)},
			Resume{Kind: Gap, From: 5, Reason: ReasonEvicted, Lost: 3, Then: ThenError}},
		{"gap, complete without response", ResumeInput{SessionHeader: true, Cursor: cursor(1), Session: known(),
			Stream: stream(RequestStream, Complete, 5, 10, 0)},
			Resume{Kind: Gap, From: 5, Reason: ReasonEvicted, Lost: 3, Then: ThenError}},
		{"gap, failed without response", ResumeInput{SessionHeader: true, Cursor: cursor(0), Session: known(),
			Stream: stream(RequestStream, Failed, 5, 10, 0)},
			Resume{Kind: Gap, From: 5, Reason: ReasonEvicted, Lost: 4, Then: ThenError}},
		{"gap, everything evicted from a complete stream", ResumeInput{SessionHeader: true, Cursor: cursor(3), Session: known(),
			Stream: stream(RequestStream, Complete, 11, 10, 10)},
			Resume{Kind: Gap, From: 11, Reason: ReasonEvicted, Lost: 7, Then: ThenError}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := DecideResume(tt.in)
			if got.Kind == Reject && got.Detail == "" {
				t.Errorf("reject without detail: %+v", got)
			}
			got.Detail = ""
			if got != tt.want {
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
					in := ResumeInput{SessionHeader: true, Session: known(), Cursor: cursor(seq),
						Stream: stream(kind, Live, floor, head, 0)}
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
						if got.From != floor || got.Lost != floor-1-seq || got.Lost == 0 || got.Reason != ReasonEvicted {
							t.Errorf("floor=%d head=%d seq=%d: got %+v", floor, head, seq, got)
						}
					}
					// Whatever happens, nothing the client lacks is skipped
					// without a gap: From is never above seq+1 unless Lost says so.
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
		stream(RequestStream, Live, 50, 100, 0),
		stream(RequestStream, Complete, 50, 100, 100),
		stream(RequestStream, Failed, 101, 100, 0),
		stream(StandaloneStream, Live, 101, 100, 0),
	} {
		for _, seq := range []uint64{0, 1, 48} {
			got := DecideResume(ResumeInput{SessionHeader: true, Session: known(), Cursor: cursor(seq), Stream: st})
			if got.Kind == Noop || got.Kind == Replay {
				t.Fatalf("stream %+v seq %d: %+v restarts without a gap", *st, seq, got)
			}
			if got.Kind != Gap || got.Lost != st.Floor-1-seq {
				t.Fatalf("stream %+v seq %d: got %+v, want a gap losing %d", *st, seq, got, st.Floor-1-seq)
			}
		}
	}
}
