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
		Sessions: 1,
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
		{"total full blocks", with(func(b *Budget) { b.TotalBytes = 3950; b.Sessions = 2 }), 100, 0, Block},
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

// TestDecideAppendFairShare: the last 1/ReserveFraction of the total is kept
// for sessions below their fair share (TotalMax/Sessions).
func TestDecideAppendFairShare(t *testing.T) {
	const total = 4000 // reserve = 1000, so non-reserve room = 3000
	base := Budget{StreamMax: total, SessionMax: total, TotalMax: total, Sessions: 2}
	tests := []struct {
		name                    string
		sessionBytes, totalUsed int64
		size                    int64
		want                    AppendAction
	}{
		// Fair share is 2000. A big session at 2900 would go to 3000: above
		// its share, but the total (3000) stays out of the reserve.
		{"above share, outside the reserve", 2900, 2900, 100, Append},
		// Going to 3100 total would dip into the reserve: blocked.
		{"above share, would take the reserve", 3000, 3000, 100, Block},
		{"above share, already at reserve edge", 2950, 3050, 10, Block},
		// A small session (below its share) may use the reserve.
		{"below share takes the reserve", 100, 3500, 100, Append},
		{"below share up to the last byte", 400, 3900, 100, Append},
		{"below share, total exhausted", 400, 3950, 100, Block},
		// Exactly reaching the fair share still counts as within it.
		{"exactly at share may use the reserve", 1900, 3200, 100, Append},
		{"one byte above share may not", 1901, 3200, 100, Block},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := base
			b.SessionBytes, b.StreamBytes, b.TotalBytes = tt.sessionBytes, tt.sessionBytes, tt.totalUsed
			if got := DecideAppend(b, tt.size, 0, time.Second); got != tt.want {
				t.Errorf("DecideAppend(%+v, %d) = %v, want %v", b, tt.size, got, tt.want)
			}
		})
	}
	// Sessions == 0 is treated as one session (the appender itself).
	b := Budget{StreamMax: total, SessionMax: total, TotalMax: total, Sessions: 0, TotalBytes: 3500, SessionBytes: 3500, StreamBytes: 3500}
	if got := DecideAppend(b, 100, 0, time.Second); got != Append {
		t.Errorf("zero sessions: got %v, want Append (the only session is within its share)", got)
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
		{Replay.String(), "replayed"}, {Gap.String(), "gap"}, {Adopt.String(), "adopted"},
	} {
		if c.got != c.want {
			t.Errorf("got %q, want %q", c.got, c.want)
		}
	}
}
