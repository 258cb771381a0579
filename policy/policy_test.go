package policy

import (
	"testing"
	"time"
)

func TestDecideAppend(t *testing.T) {
	const stall = 5 * time.Second
	// roomy is a budget with plenty of room everywhere, for one session.
	roomy := Budget{
		StreamBytes: 0, StreamMax: 1000,
		SessionBytes: 0, SessionMax: 2000,
		TotalBytes: 0, TotalMax: 4000,
		Attached: true,
	}
	with := func(f func(*Budget)) Budget {
		b := roomy
		f(&b)
		return b
	}
	tests := []struct {
		name       string
		b          Budget
		size       int64
		stalledFor time.Duration
		want       AppendAction
	}{
		{"append into empty log", roomy, 100, 0, Append},
		{"append exactly filling the stream", with(func(b *Budget) { b.StreamBytes = 900; b.SessionBytes = 900; b.TotalBytes = 900 }), 100, 0, Append},
		{"stream full blocks", with(func(b *Budget) { b.StreamBytes = 950; b.SessionBytes = 950; b.TotalBytes = 950 }), 100, 0, Block},
		{"session full blocks", with(func(b *Budget) { b.SessionBytes = 1950; b.TotalBytes = 1950 }), 100, 0, Block},
		{"total full blocks", with(func(b *Budget) { b.TotalBytes = 3950 }), 100, 0, Block},
		{"still blocked just before the stall timeout", with(func(b *Budget) { b.StreamBytes = 950; b.SessionBytes = 950; b.TotalBytes = 950 }), 100, stall - 1, Block},
		{"stalled at the timeout fails", with(func(b *Budget) { b.StreamBytes = 950; b.SessionBytes = 950; b.TotalBytes = 950 }), 100, stall, FailStalled},
		{"stalled past the timeout fails", with(func(b *Budget) { b.StreamBytes = 950; b.SessionBytes = 950; b.TotalBytes = 950 }), 100, 2 * stall, FailStalled},
		{"room again after a stall appends", roomy, 100, 2 * stall, Append},
		{"too large for the stream bound", roomy, 1001, 0, FailTooLarge},
		{"too large for the session bound", with(func(b *Budget) { b.StreamMax = 5000 }), 2001, 0, FailTooLarge},
		{"too large for the total bound", with(func(b *Budget) { b.StreamMax = 5000; b.SessionMax = 5000 }), 4001, 0, FailTooLarge},
		{"too large even while stalled is too large", roomy, 1001, 2 * stall, FailTooLarge},
		{"exactly the stream bound fits", roomy, 1000, 0, Append},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := DecideAppend(tt.b, tt.size, tt.stalledFor, stall); got != tt.want {
				t.Errorf("DecideAppend(%+v, %d, %v) = %v, want %v", tt.b, tt.size, tt.stalledFor, got, tt.want)
			}
		})
	}
}

// TestDecideAppendReserve: the last 1/ReserveFraction of the total is kept
// for streams a client is reading, so streams whose clients left cannot take
// the room that clients who are there need.
func TestDecideAppendReserve(t *testing.T) {
	const total = 4000 // reserve = 1000, so 3000 for detached streams
	base := Budget{StreamMax: total, SessionMax: total, TotalMax: total}
	tests := []struct {
		name      string
		attached  bool
		totalUsed int64
		size      int64
		want      AppendAction
	}{
		{"detached, outside the reserve", false, 2900, 100, Append},
		{"detached, would take the reserve", false, 2950, 100, Block},
		{"detached, reserve already taken by others", false, 3500, 10, Block},
		{"attached takes the reserve", true, 3500, 100, Append},
		{"attached up to the last byte", true, 3900, 100, Append},
		{"attached, total exhausted", true, 3950, 100, Block},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := base
			b.Attached, b.TotalBytes = tt.attached, tt.totalUsed
			if got := DecideAppend(b, tt.size, 0, time.Second); got != tt.want {
				t.Errorf("DecideAppend(%+v, %d) = %v, want %v", b, tt.size, got, tt.want)
			}
		})
	}
}

// TestReserveProtectsConnectedClients replays the review's scenario: many
// sessions start chatty calls and hang up; they fill what detached streams
// may take, and a connected client's call still finds room.
func TestReserveProtectsConnectedClients(t *testing.T) {
	const total, perSession = 1 << 20, 128 << 10
	var used int64
	for s := 0; s < 8; s++ { // eight hung-up sessions, each wanting its whole bound
		var mine int64
		for DecideAppend(Budget{StreamBytes: mine, StreamMax: perSession, SessionBytes: mine, SessionMax: perSession,
			TotalBytes: used, TotalMax: total}, 1024, 0, time.Minute) == Append {
			mine += 1024
			used += 1024
		}
	}
	if used > total-total/ReserveFraction {
		t.Fatalf("detached streams took %d of %d: into the reserve", used, total)
	}
	for i := int64(0); i < 5; i++ {
		b := Budget{StreamBytes: i * 1024, StreamMax: perSession, SessionBytes: i * 1024, SessionMax: perSession,
			TotalBytes: used + i*1024, TotalMax: total, Attached: true}
		if got := DecideAppend(b, 1024, 0, time.Minute); got != Append {
			t.Fatalf("a connected client's event %d: %v", i+1, got)
		}
	}
}

func TestAdmitSession(t *testing.T) {
	for _, c := range []struct {
		name string
		o    SessionOrigin
		c    SessionCounts
		want bool
	}{
		{"initialize with room", Initialized, SessionCounts{Sessions: 9, MaxSessions: 10}, true},
		{"initialize full", Initialized, SessionCounts{Sessions: 10, MaxSessions: 10}, false},
		{"initialize is not crowded out by adopted sessions", Initialized, SessionCounts{Sessions: 1, Adopted: 2, MaxSessions: 10}, true},
		{"resumed shares max_sessions", Resumed, SessionCounts{Sessions: 10, MaxSessions: 10}, false},
		{"adopted within its quarter", Adopted, SessionCounts{Adopted: 1, MaxSessions: 10}, true},
		{"adopted quarter full", Adopted, SessionCounts{Adopted: 2, MaxSessions: 10}, false},
		{"adopted ignores the others", Adopted, SessionCounts{Sessions: 10, MaxSessions: 10}, true},
		{"tiny max_sessions still allows one adopted", Adopted, SessionCounts{MaxSessions: 1}, true},
		{"no limit", Initialized, SessionCounts{Sessions: 1 << 20}, true},
		{"untapped has its own share", Untapped, SessionCounts{Sessions: 10, Adopted: 2, MaxSessions: 10}, true},
		{"untapped share full", Untapped, SessionCounts{Untapped: 10, MaxSessions: 10}, false},
	} {
		if got := AdmitSession(c.o, c.c); got != c.want {
			t.Errorf("%s: AdmitSession(%v, %+v) = %v, want %v", c.name, c.o, c.c, got, c.want)
		}
	}
	if !AdmitStream(1, 2) || AdmitStream(2, 2) || !AdmitStream(100, 0) {
		t.Error("AdmitStream")
	}
}

func TestEvictable(t *testing.T) {
	now := time.Date(2025, 6, 18, 12, 0, 0, 0, time.UTC)
	const window = time.Minute
	tests := []struct {
		name string
		e    EventView
		want bool
	}{
		{"acked", EventView{Seq: 5, Acked: 5}, true},
		{"acked past it", EventView{Seq: 5, Acked: 9}, true},
		{"acked undelivered", EventView{Seq: 1, Acked: 3}, true},
		{"session deleted, undelivered", EventView{Seq: 5, SessionDeleted: true}, true},
		{"delivered longer ago than the window", EventView{Seq: 5, Acked: 4, DeliveredAt: now.Add(-window - time.Second)}, true},
		{"delivered exactly window ago", EventView{Seq: 5, DeliveredAt: now.Add(-window)}, true},
		{"delivered just inside the window", EventView{Seq: 5, DeliveredAt: now.Add(-window + time.Nanosecond)}, false},
		{"delivered recently", EventView{Seq: 5, DeliveredAt: now.Add(-time.Second)}, false},
		{"undelivered, not acked", EventView{Seq: 5, Acked: 4}, false},
		{"undelivered, never acked", EventView{Seq: 1}, false},
		{"acked, but a reader is about to read it", EventView{Seq: 5, Acked: 9, ReaderNext: 5}, false},
		{"delivered long ago, but a reader is about to read it", EventView{Seq: 5, DeliveredAt: now.Add(-2 * window), ReaderNext: 3}, false},
		{"delivered long ago, the reader is past it", EventView{Seq: 5, DeliveredAt: now.Add(-2 * window), ReaderNext: 6}, true},
		{"session deleted, reader or not", EventView{Seq: 5, SessionDeleted: true, ReaderNext: 1}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Evictable(tt.e, now, window); got != tt.want {
				t.Errorf("Evictable(%+v) = %v, want %v", tt.e, got, tt.want)
			}
		})
	}
	// Undelivered events never go, however much time passes.
	for _, d := range []time.Duration{0, window, 1000 * time.Hour} {
		if Evictable(EventView{Seq: 1}, now.Add(d), window) {
			t.Errorf("undelivered event evictable after %v", d)
		}
	}
}

func TestStringers(t *testing.T) {
	for _, c := range []struct{ got, want string }{
		{Live.String(), "live"}, {Complete.String(), "complete"}, {Failed.String(), "failed"},
		{RequestStream.String(), "request"}, {StandaloneStream.String(), "standalone"},
		{PassThrough.String(), "pass_through"}, {Reject.String(), "rejected"}, {Noop.String(), "noop"},
		{Replay.String(), "replayed"}, {Gap.String(), "gap"}, {Adopt.String(), "adopted"}, {Ended.String(), "ended"},
		{Initialized.String(), "initialized"}, {Resumed.String(), "resumed"}, {Adopted.String(), "adopted"}, {Untapped.String(), "untapped"},
	} {
		if c.got != c.want {
			t.Errorf("got %q, want %q", c.got, c.want)
		}
	}
}

func TestUpstreamRepeat(t *testing.T) {
	for _, tc := range []struct {
		name string
		e    UpstreamEvent
		want bool
	}{
		{"a replay resends an event taken before the reconnect", UpstreamEvent{HasID: true, Resumed: true, TakenEarlier: true, SameContent: true}, true},
		{"a replay's new event", UpstreamEvent{HasID: true, Resumed: true}, false},
		{"a reconnect's new event reusing a taken ID (IDs restart per connection)", UpstreamEvent{HasID: true, Resumed: true, TakenEarlier: true}, false},
		{"an ID repeated within the first response", UpstreamEvent{HasID: true, TakenEarlier: false, SameContent: false}, false},
		{"a fresh GET (no Last-Event-ID) repeating a taken ID and content", UpstreamEvent{HasID: true, TakenEarlier: true, SameContent: true}, false},
		{"no ID", UpstreamEvent{Resumed: true, TakenEarlier: true, SameContent: true}, false},
	} {
		if got := UpstreamRepeat(tc.e); got != tc.want {
			t.Errorf("%s: UpstreamRepeat(%+v) = %v, want %v", tc.name, tc.e, got, tc.want)
		}
	}
}
