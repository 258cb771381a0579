package main

import (
	"fmt"
	"math"
	"os"
	"runtime"
	"runtime/debug"
	"strings"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/internal/mcptest"
)

type memKey struct {
	sessions int
	setup    string
}

type report struct {
	cfg                         config
	tpOrder                     []tpConfig
	tp                          map[tpConfig]map[string][]tpResult
	latency                     map[string][]latResult
	resume                      map[int][]resumeResult
	memory                      map[memKey]memResult
	elapsed                     time.Duration
	otherCores                  float64 // average cores other processes used meanwhile
	metricsBefore, metricsAfter mcptest.Metrics
}

func newReport(cfg config) *report {
	return &report{
		cfg:     cfg,
		tp:      map[tpConfig]map[string][]tpResult{},
		latency: map[string][]latResult{},
		resume:  map[int][]resumeResult{},
		memory:  map[memKey]memResult{},
	}
}

func (r *report) addThroughput(c tpConfig, setup string, res tpResult) {
	if r.tp[c] == nil {
		r.tp[c] = map[string][]tpResult{}
		r.tpOrder = append(r.tpOrder, c)
	}
	r.tp[c][setup] = append(r.tp[c][setup], res)
}

func medianOf[T any](xs []T, f func(T) float64) float64 {
	v := make([]float64, len(xs))
	for i, x := range xs {
		v[i] = f(x)
	}
	return median(v)
}

// live returns the median live events/s of a setup for one stream of size.
func (r *report) live(setup string, size int) float64 {
	for _, c := range r.tpOrder {
		if c.size == size && c.streams == 1 {
			return medianOf(r.tp[c][setup], tpResult.eventsPerSec)
		}
	}
	return math.NaN()
}

func buildVersions() (caddyVersion, module string) {
	caddyVersion, module = "unknown", "unknown"
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return
	}
	for _, d := range bi.Deps {
		if d.Path == "github.com/caddyserver/caddy/v2" {
			caddyVersion = d.Version
		}
	}
	module = bi.Main.Version
	dirty := false
	for _, s := range bi.Settings {
		switch {
		case s.Key == "vcs.revision" && len(s.Value) >= 12:
			module += " " + s.Value[:12]
		case s.Key == "vcs.modified":
			dirty = s.Value == "true"
		}
	}
	if dirty {
		module += " with uncommitted changes"
	}
	return
}

func machine() string {
	model := "unknown"
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		model = cpuModel(string(b))
	}
	kernel := ""
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		kernel = ", Linux " + strings.TrimSpace(string(b))
	}
	return fmt.Sprintf("%s, %d cores (GOMAXPROCS %d)%s", model, runtime.NumCPU(), runtime.GOMAXPROCS(0), kernel)
}

type table struct{ b strings.Builder }

func (t *table) row(cells ...string) { fmt.Fprintf(&t.b, "| %s |\n", strings.Join(cells, " | ")) }

func evsCell(eps, mbps float64) string {
	if math.IsNaN(eps) {
		return "n/a"
	}
	return fmt.Sprintf("%s ev/s (%s MB/s)", num(eps), num(mbps))
}

func usCell(v float64) string {
	if math.IsNaN(v) {
		return "n/a"
	}
	return num(v) + " µs"
}

func (r *report) markdown() string {
	var out strings.Builder
	caddyV, modV := buildVersions()
	fmt.Fprintf(&out, "## mcp_resume vs plain reverse_proxy\n\n")
	fmt.Fprintf(&out, "- Machine: %s\n", machine())
	fmt.Fprintf(&out, "- Go %s, Caddy %s, module %s\n", runtime.Version(), caddyV, modV)
	fmt.Fprintf(&out, "- One process, loopback only: a minimal MCP upstream (net/http, flushes %s), one Caddy with two sites on it, raw Streamable HTTP clients (protocol %s).\n",
		map[bool]string{true: "after every event", false: "when its buffer fills"}[r.cfg.flushEach], protocolVersion)
	fmt.Fprintf(&out, "- mcp_resume options: `%s`. A stream sustains at most max_stream_bytes per resume_window (3 GiB/s here), so backpressure does not throttle the benchmark", strings.Join(moduleOptions, "; "))
	if r.metricsAfter.Series != nil {
		d := func(k string) float64 { return total(r.metricsAfter, k) - total(r.metricsBefore, k) }
		fmt.Fprintf(&out, ": %.0f backpressure stalls, %.0f events evicted before ack, %.0f events through the logs during the run",
			d("caddy_mcp_resume_backpressure_stalls_total"), d("caddy_mcp_resume_events_evicted_before_ack_total"), d("caddy_mcp_resume_events_enqueued_total"))
	}
	fmt.Fprintf(&out, ".\n- %d round(s) per figure, setups alternating run by run; medians. Sizes are JSON-RPC message bytes (the SSE framing adds 23 B); MB = 10^6 B. Measured part took %s; other processes kept %s cores busy on average meanwhile (noise).\n\n",
		r.cfg.rounds, r.elapsed.Round(time.Second), num(r.otherCores))

	var t table
	t.row("figure", "plain reverse_proxy", "mcp_resume + reverse_proxy", "mcp_resume / plain")
	t.row("---", "---:", "---:", "---:")
	for _, c := range r.tpOrder {
		p, m := r.tp[c]["plain"], r.tp[c]["mcp_resume"]
		pe, me := medianOf(p, tpResult.eventsPerSec), medianOf(m, tpResult.eventsPerSec)
		t.row("throughput, "+c.key(), evsCell(pe, medianOf(p, tpResult.mbPerSec)), evsCell(me, medianOf(m, tpResult.mbPerSec)), ratioStr(ratio(me, pe)))
	}
	for _, c := range r.tpOrder {
		p, m := medianOf(r.tp[c]["plain"], tpResult.cpuPerEvent), medianOf(r.tp[c]["mcp_resume"], tpResult.cpuPerEvent)
		t.row("CPU per event (whole process), "+c.key(), usCell(p), usCell(m), fmt.Sprintf("%s (%+.2f µs)", ratioStr(ratio(m, p)), m-p))
	}
	for _, c := range r.tpOrder {
		p, m := medianOf(r.tp[c]["plain"], tpResult.cswPerEvent), medianOf(r.tp[c]["mcp_resume"], tpResult.cswPerEvent)
		t.row("context switches per event (whole process), "+c.key(), sig3(p), sig3(m), ratioStr(ratio(m, p)))
	}
	if lp, lm := r.latency["plain"], r.latency["mcp_resume"]; len(lp) > 0 && len(lm) > 0 {
		pick := func(f func(latResult) float64) (float64, float64) { return medianOf(lp, f), medianOf(lm, f) }
		p50p, p50m := pick(func(l latResult) float64 { return l.p50 })
		p99p, p99m := pick(func(l latResult) float64 { return l.p99 })
		what := fmt.Sprintf("%s events every %v", sizeName(r.cfg.latencySize), r.cfg.latencyInterval)
		t.row("latency upstream write → client read, p50 ("+what+")", usCell(p50p), usCell(p50m), ratioStr(ratio(p50m, p50p)))
		t.row("latency upstream write → client read, p99", usCell(p99p), usCell(p99m), ratioStr(ratio(p99m, p99p)))
		t.row("added latency p50 / p99 (mcp_resume − plain)", "—", usCell(p50m-p50p)+" / "+usCell(p99m-p99p), "")
	}
	liveM, liveP := r.live("mcp_resume", r.cfg.replaySize), r.live("plain", r.cfg.replaySize)
	for _, n := range r.cfg.replayCounts {
		rs := r.resume[n]
		if len(rs) == 0 {
			continue
		}
		label := fmt.Sprintf("%s × %s events", groupDigits(n), sizeName(r.cfg.replaySize))
		t.row("resume "+label+": first replayed event after", "— (no resume)", dur(time.Duration(medianOf(rs, func(x resumeResult) float64 { return float64(x.ttfb) }))), "")
		eps := medianOf(rs, resumeResult.eventsPerSec)
		t.row("replay throughput, "+label, "—", evsCell(eps, medianOf(rs, resumeResult.mbPerSec)),
			fmt.Sprintf("%s live mcp_resume, %s live plain (1 stream)", ratioStr(ratio(eps, liveM)), ratioStr(ratio(eps, liveP))))
		t.row("tap into the log with no client, "+label, "—", num(medianOf(rs, func(x resumeResult) float64 { return x.filledEPS }))+" ev/s", "")
	}
	for _, n := range r.cfg.sessionCounts {
		p, okP := r.memory[memKey{n, "plain"}]
		m, okM := r.memory[memKey{n, "mcp_resume"}]
		if !okP || !okM {
			continue
		}
		nf := float64(n)
		g := groupDigits(n)
		t.row(fmt.Sprintf("opening sessions (initialize + initialized), %s sessions", g),
			num(p.initRate)+"/s", num(m.initRate)+"/s", ratioStr(ratio(m.initRate, p.initRate)))
		t.row(fmt.Sprintf("heap per idle session, %s sessions", g), bytesStr(float64(p.idle.heap)/nf), bytesStr(float64(m.idle.heap)/nf), ratioStr(ratio(float64(m.idle.heap), float64(p.idle.heap))))
		t.row(fmt.Sprintf("RSS per idle session, %s sessions", g), bytesStr(float64(p.idle.rss)/nf), bytesStr(float64(m.idle.rss)/nf), ratioStr(ratio(float64(m.idle.rss), float64(p.idle.rss))))
		t.row(fmt.Sprintf("mcp_resume's own heap per idle session (mcp_resume − plain), %s sessions", g), "—", bytesStr(float64(m.idle.heap-p.idle.heap)/nf), "")
		if m.retainedPayload > 0 {
			t.row(fmt.Sprintf("heap per retained payload byte, %s sessions × 1 stream of %d × %s", g, r.cfg.retainEvents, sizeName(r.cfg.retainSize)),
				"0 (retains nothing)", fmt.Sprintf("%.2f B (RSS %.2f B)", float64(m.retained.heap)/float64(m.retainedPayload), float64(m.retained.rss)/float64(m.retainedPayload)), "")
			beyond := float64(m.idle.heap+m.retained.heap-m.retainedPayload) - float64(p.idle.heap)
			t.row(fmt.Sprintf("mcp_resume's heap beyond retained payload (%s retained), %s sessions", bytesStr(float64(m.retainedPayload)), g),
				"—", bytesStr(beyond), "")
		}
	}
	out.WriteString(t.b.String())
	out.WriteString("\n")
	out.WriteString(r.targets(liveM))
	return out.String()
}

func groupDigits(n int) string {
	s := fmt.Sprint(n)
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + " " + s[i:]
	}
	return s
}

func metStr(ok bool) string {
	if ok {
		return "**met**"
	}
	return "**not met**"
}

// targets checks the figures against the targets.
func (r *report) targets(liveM float64) string {
	var b strings.Builder
	b.WriteString("### Targets\n\n")
	for _, c := range r.tpOrder {
		if c.size != 1024 {
			continue
		}
		q := ratio(medianOf(r.tp[c]["mcp_resume"], tpResult.eventsPerSec), medianOf(r.tp[c]["plain"], tpResult.eventsPerSec))
		fmt.Fprintf(&b, "- throughput ≥ 0.9x plain at 1 KiB events, %d stream%s: %s → %s\n", c.streams, plural(c.streams), ratioStr(q), metStr(q >= 0.9))
	}
	if lp, lm := r.latency["plain"], r.latency["mcp_resume"]; len(lp) > 0 && len(lm) > 0 {
		added := medianOf(lm, func(l latResult) float64 { return l.p99 }) - medianOf(lp, func(l latResult) float64 { return l.p99 })
		fmt.Fprintf(&b, "- added p99 latency ≤ 200 µs: %s → %s\n", usCell(added), metStr(added <= 200))
	}
	if n := maxInt(r.cfg.sessionCounts); n > 0 {
		p, okP := r.memory[memKey{n, "plain"}]
		m, okM := r.memory[memKey{n, "mcp_resume"}]
		if okP && okM {
			beyond := float64(m.idle.heap+m.retained.heap-m.retainedPayload) - float64(p.idle.heap)
			fmt.Fprintf(&b, "- %s sessions in ≤ 64 MiB beyond retained payload: %s (heap, proxy's own) → %s\n",
				groupDigits(n), bytesStr(beyond), metStr(beyond <= 64<<20))
		}
	}
	if n := maxInt(r.cfg.replayCounts); n > 0 && len(r.resume[n]) > 0 {
		eps := medianOf(r.resume[n], resumeResult.eventsPerSec)
		fmt.Fprintf(&b, "- replay of %s events ≥ live throughput (mcp_resume, 1 stream, %s): %s vs %s ev/s → %s\n",
			groupDigits(n), sizeName(r.cfg.replaySize), num(eps), num(liveM), metStr(!math.IsNaN(liveM) && eps >= liveM))
	}
	return b.String()
}

func maxInt(xs []int) int {
	m := 0
	for _, x := range xs {
		m = max(m, x)
	}
	return m
}
