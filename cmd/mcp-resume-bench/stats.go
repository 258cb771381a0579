package main

import (
	"bytes"
	"fmt"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"
)

// percentile is the p-th percentile (0..100) of xs by nearest rank: the
// smallest value at least p% of the samples are at or below. NaN for none.
func percentile(xs []float64, p float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	s := slices.Sorted(slices.Values(xs))
	return s[min(max(int(math.Ceil(p/100*float64(len(s)))), 1), len(s))-1]
}

// medianOf is the median of f over xs (the mean of the middle two for an
// even count); NaN for none.
func medianOf[T any](xs []T, f func(T) float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	v := make([]float64, len(xs))
	for i, x := range xs {
		v[i] = f(x)
	}
	slices.Sort(v)
	return (v[(len(v)-1)/2] + v[len(v)/2]) / 2
}

// ratio is a/b, NaN when either is unknown or b is not positive.
func ratio(a, b float64) float64 {
	if math.IsNaN(a) || math.IsNaN(b) || b <= 0 {
		return math.NaN()
	}
	return a / b
}

// num formats a figure to 3 significant digits, with k or M when large:
// 1234567 -> "1.23M", 987.6 -> "988", 0.01234 -> "0.0123".
func num(v float64) string {
	if a := math.Abs(v); a >= 1e6 {
		return sig3(v/1e6) + "M"
	} else if a >= 1e4 {
		return sig3(v/1e3) + "k"
	}
	return sig3(v)
}

func sig3(v float64) string {
	if v == 0 || math.IsNaN(v) {
		return map[bool]string{true: "0", false: "n/a"}[v == 0]
	}
	return strconv.FormatFloat(v, 'f', max(2-int(math.Floor(math.Log10(math.Abs(v)))), 0), 64)
}

func ratioStr(v float64) string {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return "n/a"
	}
	return strconv.FormatFloat(v, 'f', 2, 64) + "x"
}

func usStr(v float64) string { return num(v) + " µs" }

func sizeName(size int) string {
	if size%1024 == 0 {
		return fmt.Sprintf("%d KiB", size/1024)
	}
	return fmt.Sprintf("%d B", size)
}

func groupDigits(n int) string {
	s := fmt.Sprint(n)
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + " " + s[i:]
	}
	return s
}

// parseTS extracts the "ts" number from an event's data; false if absent.
func parseTS(data []byte) (int64, bool) {
	_, rest, ok := bytes.Cut(data, []byte(`"ts":`))
	end := 0
	for end < len(rest) && rest[end] >= '0' && rest[end] <= '9' {
		end++
	}
	v, err := strconv.ParseInt(string(rest[:end]), 10, 64)
	return v, ok && err == nil
}

// busyCPU is the time all CPUs spent busy so far: the "cpu" line of
// /proc/stat without idle and iowait (guest time is in user already).
func busyCPU(stat string) time.Duration {
	f := strings.Fields(strings.SplitN(stat, "\n", 2)[0])
	var busy int64
	for i := 1; i < len(f) && i <= 8; i++ {
		if v, err := strconv.ParseInt(f[i], 10, 64); err == nil && i != 4 && i != 5 {
			busy += v
		}
	}
	return time.Duration(busy) * time.Second / 100 // USER_HZ
}

// procCPU is a process's user+system CPU time from /proc (10 ms steps).
func procCPU(pid int) time.Duration {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:])); len(f) > 12 {
		u, _ := strconv.ParseInt(f[11], 10, 64)
		s, _ := strconv.ParseInt(f[12], 10, 64)
		return time.Duration(u+s) * time.Second / 100
	}
	return 0
}
