package mcptest

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
)

// Metrics is one scrape of a Prometheus text-format endpoint.
type Metrics struct {
	// Series maps every sample's series, "name" or `name{label="value",...}`
	// exactly as exposed, to its value.
	Series map[string]float64
	// Types maps a metric family's name to its # TYPE (counter, gauge, ...).
	Types map[string]string
}

// Sum adds up the samples of one metric over all its label values; ok is
// false if the metric is not exposed at all.
func (m Metrics) Sum(name string) (sum float64, ok bool) {
	for k, v := range m.Series {
		if k == name || strings.HasPrefix(k, name+"{") {
			sum += v
			ok = true
		}
	}
	return sum, ok
}

// ParseMetrics reads the Prometheus text format. A line it cannot read is
// an error: what Caddy exposes must be well-formed.
func ParseMetrics(r io.Reader) (Metrics, error) {
	m := Metrics{Series: map[string]float64{}, Types: map[string]string{}}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if f := strings.Fields(line); len(f) == 4 && f[0] == "#" && f[1] == "TYPE" {
			m.Types[f[2]] = f[3]
		}
		if line == "" || line[0] == '#' {
			continue
		}
		series, v, err := parseSample(line)
		if err != nil {
			return m, err
		}
		m.Series[series] = v
	}
	return m, sc.Err()
}

// parseSample splits a sample line into its series and value (an optional
// timestamp after the value is ignored). Label values are quoted and may
// hold spaces, braces and escaped quotes.
func parseSample(line string) (string, float64, error) {
	end := strings.IndexAny(line, "{ ")
	if end > 0 && line[end] == '{' {
		quoted := false
		for end++; end < len(line) && (quoted || line[end] != '}'); end++ {
			switch {
			case line[end] == '\\' && quoted:
				end++
			case line[end] == '"':
				quoted = !quoted
			}
		}
		end++
	}
	if end <= 0 || end > len(line) {
		return "", 0, fmt.Errorf("malformed sample %q", line)
	}
	f := strings.Fields(line[end:])
	if len(f) == 0 || len(f) > 2 {
		return "", 0, fmt.Errorf("malformed sample %q", line)
	}
	v, err := strconv.ParseFloat(f[0], 64)
	if err != nil {
		return "", 0, fmt.Errorf("malformed value in %q", line)
	}
	return line[:end], v, nil
}

// ScrapeMetrics reads a Prometheus text-format endpoint, e.g. Caddy's admin
// /metrics.
func ScrapeMetrics(url string) (Metrics, error) {
	resp, err := AdminClient.Get(url)
	if err != nil {
		return Metrics{}, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		return Metrics{}, fmt.Errorf("scraping %s: %s %s", url, resp.Status, b)
	}
	m, err := ParseMetrics(resp.Body)
	if err != nil {
		return m, fmt.Errorf("scraping %s: %v", url, err)
	}
	return m, nil
}
