package main

import (
	"encoding/json"
	"math"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/internal/mcptest"
)

func TestStatistics(t *testing.T) {
	xs := []float64{15, 20, 35, 40, 50} // the nearest-rank example
	for p, want := range map[float64]float64{0: 15, 5: 15, 30: 20, 40: 20, 50: 35, 99: 50, 100: 50} {
		if got := percentile(xs, p); got != want {
			t.Errorf("percentile(%v) = %v, want %v", p, got, want)
		}
	}
	id := func(x float64) float64 { return x }
	if medianOf([]float64{3, 1, 2}, id) != 2 || medianOf([]float64{4, 1, 3, 2}, id) != 2.5 || ratio(9, 10) != 0.9 {
		t.Error("median or ratio")
	}
	if !math.IsNaN(percentile(nil, 50)) || !math.IsNaN(medianOf(nil, id)) || !math.IsNaN(ratio(1, 0)) || !math.IsNaN(ratio(math.NaN(), 1)) {
		t.Error("unknowns should be NaN")
	}
	for _, c := range [][2]string{
		{num(1234567), "1.23M"}, {num(98765), "98.8k"}, {num(9876), "9876"}, {num(987.6), "988"}, {num(0.01234), "0.0123"},
		{num(0), "0"}, {num(math.NaN()), "n/a"}, {ratioStr(0.934), "0.93x"}, {ratioStr(math.NaN()), "n/a"},
		{groupDigits(100000), "100 000"}, {sizeName(16384), "16 KiB"}, {sizeName(100), "100 B"},
		{strings.Join(rotate([]string{"a", "b", "c"}, 4), ""), "bca"},
	} {
		if c[0] != c[1] {
			t.Errorf("got %q, want %q", c[0], c[1])
		}
	}
}

func TestParsing(t *testing.T) {
	ts := time.Now().UnixNano()
	for _, c := range []struct{ ts, size int64 }{{ts, 1024}, {ts, 100}, {0, 1024}} {
		ev := mcptest.AppendProgress(nil, json.RawMessage(`"b"`), 12345, c.ts, int(c.size))
		if got, ok := parseTS(ev); ok != (c.ts > 0) || got != c.ts {
			t.Errorf("parseTS = %d, %v; want %d", got, ok, c.ts)
		}
	}
	if busy := busyCPU("cpu  100 5 50 1000 20 1 2 3 7 0\ncpu0 1 2 3 4 5 6 7 8\n"); busy != 161*10*time.Millisecond {
		t.Errorf("busyCPU = %v", busy)
	}
	if procCPU(os.Getpid()) < 0 || procCPU(-1) != 0 {
		t.Error("procCPU")
	}
	ev := mcptest.AppendProgress(nil, json.RawMessage(`"b"`), 1, 0, 200)
	body := ": mcp-resume\n\nid: x-1-1\n" + string(ev) + string(ev) + "event: message\ndata: {\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{}}\n\n"
	if n, p, err := drain(strings.NewReader(body), nil); err != nil || n != 2 || p != 400 {
		t.Errorf("drain = %d, %d, %v", n, p, err)
	}
	if _, _, err := drain(strings.NewReader(string(ev)), nil); err == nil {
		t.Error("a stream without its response should be an error")
	}
}

func TestFlags(t *testing.T) {
	if l, err := intList("1_000, 100000,"); err != nil || len(l) != 2 || l[0] != 1000 {
		t.Errorf("intList = %v, %v", l, err)
	}
	c, err := parseFlags([]string{"-quick", "-rounds", "3"})
	if err != nil || c.rounds != 3 || c.scale != 0.2 || len(c.replay) != 2 || !c.phases["resume"] || c.load {
		t.Errorf("parseFlags -quick -rounds 3 = %+v, %v", c, err)
	}
	for _, args := range [][]string{{"-phases", "throughput,nope"}, {"-replay", "5"}, {"-sizes", "1,x"}} {
		if _, err := parseFlags(args); err == nil {
			t.Errorf("%q accepted", args)
		}
	}
}
