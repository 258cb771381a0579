package main

import (
	"encoding/json"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/internal/mcptest"
)

func TestPercentile(t *testing.T) {
	xs := []float64{15, 20, 35, 40, 50} // the nearest-rank example
	for _, c := range []struct{ p, want float64 }{
		{0, 15}, {5, 15}, {30, 20}, {40, 20}, {50, 35}, {99, 50}, {100, 50},
	} {
		if got := percentile(xs, c.p); got != c.want {
			t.Errorf("percentile(%v) = %v, want %v", c.p, got, c.want)
		}
	}
	if xs[0] != 15 || xs[4] != 50 {
		t.Errorf("input modified: %v", xs)
	}
	hundred := make([]float64, 100)
	for i := range hundred {
		hundred[i] = float64(100 - i) // 100..1, unsorted
	}
	if got := percentile(hundred, 99); got != 99 {
		t.Errorf("p99 of 1..100 = %v, want 99", got)
	}
	if !math.IsNaN(percentile(nil, 50)) {
		t.Error("percentile of nothing should be NaN")
	}
}

func TestMedianAndRatio(t *testing.T) {
	if got := median([]float64{3, 1, 2}); got != 2 {
		t.Errorf("median odd = %v", got)
	}
	if got := median([]float64{4, 1, 3, 2}); got != 2.5 {
		t.Errorf("median even = %v", got)
	}
	if !math.IsNaN(median(nil)) || !math.IsNaN(ratio(1, 0)) || !math.IsNaN(ratio(1, -5)) || !math.IsNaN(ratio(math.NaN(), 1)) {
		t.Error("unknowns should be NaN")
	}
	if got := ratio(9, 10); got != 0.9 {
		t.Errorf("ratio = %v", got)
	}
}

func TestFormatting(t *testing.T) {
	for _, c := range []struct {
		got, want string
	}{
		{num(1234567), "1.23M"}, {num(98765), "98.8k"}, {num(9876), "9876"}, {num(987.6), "988"},
		{num(12.34), "12.3"}, {num(0.01234), "0.0123"}, {num(0), "0"}, {num(math.NaN()), "n/a"},
		{ratioStr(0.934), "0.93x"}, {ratioStr(math.NaN()), "n/a"},
		{dur(250 * time.Nanosecond), "250 ns"}, {dur(1234 * time.Nanosecond), "1.23 µs"},
		{dur(15 * time.Millisecond), "15.0 ms"}, {dur(2500 * time.Millisecond), "2.50 s"},
		{bytesStr(1536), "1.50 KiB"}, {bytesStr(64 << 20), "64.00 MiB"}, {bytesStr(-2048), "-2.00 KiB"}, {bytesStr(12), "12 B"},
		{groupDigits(100000), "100 000"}, {groupDigits(999), "999"},
	} {
		if c.got != c.want {
			t.Errorf("got %q, want %q", c.got, c.want)
		}
	}
}

func TestParseTS(t *testing.T) {
	ts := time.Now().UnixNano()
	for _, c := range []struct {
		ts   int64
		size int
	}{{ts, 1024}, {ts, 100}, {0, 1024}} {
		ev := mcptest.AppendProgress(nil, json.RawMessage(`"b"`), 12345, c.ts, c.size)
		if got, ok := parseTS(ev); ok != (c.ts > 0) || got != c.ts {
			t.Errorf("parseTS = %d, %v; want %d", got, ok, c.ts)
		}
	}
}

func TestDrain(t *testing.T) {
	ev1 := mcptest.AppendProgress(nil, json.RawMessage(`"b"`), 1, 0, 200)
	ev2 := mcptest.AppendProgress(nil, json.RawMessage(`"b"`), 2, 0, 200)
	body := ": mcp-resume\n\nid: x-1-1\n" + string(ev1) + string(ev2) +
		"event: message\ndata: {\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{}}\n\n"
	n, p, err := drain(strings.NewReader(body), nil)
	if err != nil || n != 2 || p != 400 {
		t.Errorf("drain = %d, %d, %v", n, p, err)
	}
	if _, _, err := drain(strings.NewReader(string(ev1)), nil); err == nil {
		t.Error("a stream without its response should be an error")
	}
}

func TestProcHelpers(t *testing.T) {
	if rss, err := statmRSS("12345 678 90 1 0 2 0\n", 4096); err != nil || rss != 678*4096 {
		t.Errorf("statmRSS = %d, %v", rss, err)
	}
	if _, err := statmRSS("", 4096); err == nil {
		t.Error("empty statm should fail")
	}
	if got := cpuModel("processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 7B13\n"); got != "AMD EPYC 7B13" {
		t.Errorf("cpuModel = %q", got)
	}
	busy, total, err := procStatCPU("cpu  100 5 50 1000 20 1 2 3 7 0\ncpu0 1 2 3 4 5 6 7 8\n")
	if err != nil || busy != 100+5+50+1+2+3 || total != busy+1000+20 {
		t.Errorf("procStatCPU = %d, %d, %v", busy, total, err)
	}
}

func TestIntListAndFlags(t *testing.T) {
	if l, err := intList("1_000, 100000,"); err != nil || len(l) != 2 || l[0] != 1000 || l[1] != 100000 {
		t.Errorf("intList = %v, %v", l, err)
	}
	if _, err := intList("1,x"); err == nil {
		t.Error("intList accepted x")
	}
	c, err := parseFlags([]string{"-quick", "-rounds", "3"})
	if err != nil || c.rounds != 3 || c.scale != 0.2 || len(c.sessionCounts) != 1 || !c.phases["memory"] {
		t.Errorf("parseFlags -quick -rounds 3 = %+v, %v", c, err)
	}
	if _, err := parseFlags([]string{"-phases", "throughput,nope"}); err == nil {
		t.Error("unknown phase accepted")
	}
	if _, err := parseFlags([]string{"-replay", "5"}); err == nil {
		t.Error("a replay of 5 events accepted")
	}
}

func TestEventsPerRun(t *testing.T) {
	if eventsPerRun(100, 1) != 300_000 || eventsPerRun(1024, 1) != 200_000 || eventsPerRun(16384, 1) != 24576 {
		t.Error("eventsPerRun defaults changed")
	}
	if eventsPerRun(16384, 0.0001) != 64 {
		t.Error("eventsPerRun should keep at least 64 events (one per stream)")
	}
}
