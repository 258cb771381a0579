package main

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
	"time"
)

// ---- statistics ------------------------------------------------------------

// percentile returns the p-th percentile (0..100) of xs by the nearest-rank
// method: the smallest value such that at least p% of the samples are <= it.
// xs need not be sorted and is not modified. NaN for no samples.
func percentile(xs []float64, p float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	if p <= 0 {
		return s[0]
	}
	if p >= 100 {
		return s[len(s)-1]
	}
	rank := int(math.Ceil(p / 100 * float64(len(s))))
	if rank < 1 {
		rank = 1
	}
	return s[rank-1]
}

// median of xs (mean of the two middle values for an even count); NaN for
// no samples. xs is not modified.
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

// ratio is a/b for positive figures: NaN when either is unknown or b is
// not positive (a memory delta within noise can be negative).
func ratio(a, b float64) float64 {
	if math.IsNaN(a) || math.IsNaN(b) || b <= 0 {
		return math.NaN()
	}
	return a / b
}

// ---- formatting --------------------------------------------------------------

// num formats a figure with 3 significant digits and a k/M suffix for large
// values: 1234567 -> "1.23M", 987.6 -> "988", 0.01234 -> "0.0123".
func num(v float64) string {
	switch {
	case math.IsNaN(v):
		return "n/a"
	case math.Abs(v) >= 1e6:
		return sig3(v/1e6) + "M"
	case math.Abs(v) >= 1e4:
		return sig3(v/1e3) + "k"
	}
	return sig3(v)
}

func sig3(v float64) string {
	if v == 0 {
		return "0"
	}
	digits := 3 - int(math.Floor(math.Log10(math.Abs(v)))) - 1
	if digits < 0 {
		digits = 0
	}
	return strconv.FormatFloat(v, 'f', digits, 64)
}

// ratioStr formats a ratio as "0.93x"; "n/a" when unknown.
func ratioStr(v float64) string {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return "n/a"
	}
	return strconv.FormatFloat(v, 'f', 2, 64) + "x"
}

// dur formats a duration in the most readable unit with 3 significant digits.
func dur(d time.Duration) string {
	switch {
	case d < 0:
		return "-" + dur(-d)
	case d < time.Microsecond:
		return fmt.Sprintf("%d ns", d.Nanoseconds())
	case d < time.Millisecond:
		return sig3(float64(d)/1e3) + " µs"
	case d < time.Second:
		return sig3(float64(d)/1e6) + " ms"
	}
	return sig3(d.Seconds()) + " s"
}

// bytesStr formats a byte count in binary units: 1536 -> "1.50 KiB".
func bytesStr(v float64) string {
	if math.IsNaN(v) {
		return "n/a"
	}
	neg := ""
	if v < 0 {
		neg, v = "-", -v
	}
	switch {
	case v >= 1<<30:
		return neg + strconv.FormatFloat(v/(1<<30), 'f', 2, 64) + " GiB"
	case v >= 1<<20:
		return neg + strconv.FormatFloat(v/(1<<20), 'f', 2, 64) + " MiB"
	case v >= 1<<10:
		return neg + strconv.FormatFloat(v/(1<<10), 'f', 2, 64) + " KiB"
	}
	return neg + strconv.FormatFloat(v, 'f', 0, 64) + " B"
}

// ---- event payloads ---------------------------------------------------------

// parseTS extracts the "ts" number from an event's data; false if absent.
func parseTS(data []byte) (int64, bool) {
	i := bytes.Index(data, []byte(`"ts":`))
	if i < 0 {
		return 0, false
	}
	var v int64
	j := i + len(`"ts":`)
	k := j
	for ; k < len(data) && data[k] >= '0' && data[k] <= '9'; k++ {
		v = v*10 + int64(data[k]-'0')
	}
	return v, k > j
}

// statmRSS returns the resident set size from the text of /proc/self/statm.
func statmRSS(statm string, pageSize int) (int64, error) {
	f := strings.Fields(statm)
	if len(f) < 2 {
		return 0, fmt.Errorf("statm: %q", statm)
	}
	pages, err := strconv.ParseInt(f[1], 10, 64)
	if err != nil {
		return 0, err
	}
	return pages * int64(pageSize), nil
}

// cpuModel returns the first "model name" of /proc/cpuinfo's text.
func cpuModel(cpuinfo string) string {
	for _, line := range strings.Split(cpuinfo, "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return "unknown"
}

// procStatCPU returns busy and total jiffies of the "cpu" line of /proc/stat's
// text (busy excludes idle and iowait).
func procStatCPU(stat string) (busy, total int64, err error) {
	for _, line := range strings.Split(stat, "\n") {
		f := strings.Fields(line)
		if len(f) < 5 || f[0] != "cpu" {
			continue
		}
		for i, s := range f[1:] {
			v, err := strconv.ParseInt(s, 10, 64)
			if err != nil {
				return 0, 0, fmt.Errorf("/proc/stat: %q", line)
			}
			if i >= 8 { // guest and guest_nice are already in user and nice
				break
			}
			total += v
			if i != 3 && i != 4 { // idle, iowait
				busy += v
			}
		}
		return busy, total, nil
	}
	return 0, 0, errors.New("/proc/stat: no cpu line")
}
