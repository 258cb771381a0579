package main

import (
	"fmt"
	"math"
	"runtime"
	"runtime/debug"
	"strings"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/internal/mcptest"
)

type report struct {
	cfg                         config
	tp                          map[tpConfig]map[string][]tpRun
	latency                     map[string][]result
	resume                      map[int][]result
	memory                      map[memKey]memRun
	elapsed                     time.Duration
	otherCores                  float64
	metricsBefore, metricsAfter mcptest.Metrics
}

// tp1 is a throughput figure's median over the rounds of one setup.
func (r *report) tp1(c tpConfig, setup string, f func(tpRun) float64) float64 {
	return medianOf(r.tp[c][setup], f)
}

func (r *report) tpRatio(c tpConfig) float64 {
	return ratio(r.tp1(c, "mcp_resume", tpRun.eventsPerSec), r.tp1(c, "plain", tpRun.eventsPerSec))
}

// live is mcp_resume's live events/s on one stream of 1 KiB events.
func (r *report) live() float64 {
	for _, c := range r.cfg.tpConfigs() {
		if c.size == 1024 && c.streams == 1 {
			return r.tp1(c, "mcp_resume", tpRun.eventsPerSec)
		}
	}
	return math.NaN()
}

func replayRate(x result) float64 { return float64(x.Events) / x.Elapsed.Seconds() }

// beyond is the heap mcp_resume's proxy holds for n sessions retaining a
// stream each, beyond the retained payload and what plain's holds.
func (r *report) beyond(n int) float64 {
	p, m := r.memory[memKey{n, "plain"}], r.memory[memKey{n, "mcp_resume"}]
	return float64(m.idle+m.retained-m.RetainedPayload) - float64(p.idle)
}

type table struct{ strings.Builder }

func (t *table) row(cells ...string) { fmt.Fprintf(t, "| %s |\n", strings.Join(cells, " | ")) }

func evs(eps, mbps float64) string { return fmt.Sprintf("%s ev/s (%s MB/s)", num(eps), num(mbps)) }

func (r *report) markdown() string {
	var t table
	caddyV, mod := "?", "?"
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, d := range bi.Deps {
			if d.Path == "github.com/caddyserver/caddy/v2" {
				caddyV = d.Version
			}
		}
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" || s.Key == "vcs.modified" {
				mod += " " + s.Key[4:] + "=" + s.Value
			}
		}
	}
	fmt.Fprintf(&t, "## direct, plain reverse_proxy, mcp_resume\n\n- %d cores (GOMAXPROCS %d), Go %s, Caddy %s, module%s\n",
		runtime.NumCPU(), runtime.GOMAXPROCS(0), runtime.Version(), caddyV, mod[1:])
	fmt.Fprintf(&t, "- Two processes on loopback: the proxy's (one Caddy, two sites on the upstream: `reverse_proxy`, and `mcp_resume` + `reverse_proxy`) and the load process (a minimal MCP upstream on net/http that flushes every event, raw Streamable HTTP clients, protocol %s). Direct: the clients read the upstream, no proxy. Proxy CPU and allocations are the proxy process's own.\n", protocolVersion)
	fmt.Fprintf(&t, "- mcp_resume options: `%s`", strings.Join(moduleOptions, "; "))
	if r.metricsAfter.Series != nil {
		d := func(k string) float64 { a, _ := r.metricsAfter.Sum(k); b, _ := r.metricsBefore.Sum(k); return a - b }
		fmt.Fprintf(&t, ": %.0f backpressure stalls, %.0f events evicted before ack, %.0f events through the logs",
			d("caddy_mcp_resume_backpressure_stalls_total"), d("caddy_mcp_resume_events_evicted_before_ack_total"), d("caddy_mcp_resume_events_enqueued_total"))
	}
	fmt.Fprintf(&t, ".\n- A warm-up round, then %d round(s) per figure, setups alternating run by run; medians. Sizes are JSON-RPC message bytes (SSE framing adds 23 B); MB = 10^6 B. Measured part took %s; other processes kept %s cores busy on average meanwhile (noise).\n\n",
		r.cfg.rounds, r.elapsed.Round(time.Second), num(r.otherCores))
	t.row("figure", "direct (no proxy)", "plain reverse_proxy", "mcp_resume + reverse_proxy", "mcp_resume / plain")
	t.row("---", "---:", "---:", "---:", "---:")
	cfgs := r.cfg.tpConfigs()
	for _, c := range cfgs {
		if len(r.tp[c]) > 0 {
			cell := func(s string) string { return evs(r.tp1(c, s, tpRun.eventsPerSec), r.tp1(c, s, tpRun.mbPerSec)) }
			t.row("throughput, "+c.key(), cell("direct"), cell("plain"), cell("mcp_resume"), ratioStr(r.tpRatio(c)))
		}
	}
	for _, f := range []struct {
		label  string
		f      func(tpRun) float64
		format func(float64) string
	}{{"proxy CPU per event", tpRun.proxyCPU, usStr}, {"CPU per event, all processes", tpRun.allCPU, usStr},
		{"proxy heap allocations per event", tpRun.allocs, sig3}} {
		for _, c := range cfgs {
			if len(r.tp[c]) > 0 {
				p, m, d := r.tp1(c, "plain", f.f), r.tp1(c, "mcp_resume", f.f), r.tp1(c, "direct", f.f)
				t.row(f.label+", "+c.key(), map[bool]string{true: f.format(d), false: "—"}[d > 0.01], f.format(p), f.format(m),
					fmt.Sprintf("%s (%+.2f)", ratioStr(ratio(m, p)), m-p))
			}
		}
	}
	lat := func(s string, p99 bool) float64 {
		return medianOf(r.latency[s], func(x result) float64 { return map[bool]float64{false: x.P50, true: x.P99}[p99] })
	}
	for _, p99 := range []bool{false, true} {
		if len(r.latency["mcp_resume"]) > 0 {
			t.row(fmt.Sprintf("latency upstream write → client read, %s (1 KiB events every %v)", map[bool]string{false: "p50", true: "p99"}[p99], latencyEvery),
				usStr(lat("direct", p99)), usStr(lat("plain", p99)), usStr(lat("mcp_resume", p99)),
				fmt.Sprintf("%s (%+.1f µs)", ratioStr(ratio(lat("mcp_resume", p99), lat("plain", p99))), lat("mcp_resume", p99)-lat("plain", p99)))
		}
	}
	for _, n := range r.cfg.replay {
		if rs := r.resume[n]; len(rs) > 0 {
			label := groupDigits(n) + " × 1 KiB events"
			t.row("resume "+label+": first replayed event after", "—", "—", time.Duration(medianOf(rs, func(x result) float64 { return float64(x.TTFB) })).Round(time.Microsecond).String(), "")
			t.row("replay throughput, "+label, "—", "—", evs(medianOf(rs, replayRate), medianOf(rs, func(x result) float64 { return float64(x.Payload) / 1e6 / x.Elapsed.Seconds() })),
				ratioStr(ratio(medianOf(rs, replayRate), r.live()))+" live (1 stream)")
			t.row("tap into the log with no client, "+label, "—", "—", num(medianOf(rs, func(x result) float64 { return float64(n-5) / x.Fill.Seconds() }))+" ev/s", "")
		}
	}
	for _, n := range r.cfg.sessions {
		p, okP := r.memory[memKey{n, "plain"}]
		m, okM := r.memory[memKey{n, "mcp_resume"}]
		if g := groupDigits(n); okP && okM {
			t.row("proxy heap per idle session, "+g+" sessions", "—", bytesStr(float64(p.idle)/float64(n)), bytesStr(float64(m.idle)/float64(n)), "")
			t.row(fmt.Sprintf("heap per retained payload byte, %s sessions × %d × 1 KiB", g, retainEvents), "—", "—",
				fmt.Sprintf("%.2f B (retained_bytes %.2f B)", float64(m.retained)/float64(m.RetainedPayload), float64(m.Retained)/float64(m.RetainedPayload)), "")
			t.row("mcp_resume's heap beyond retained payload ("+bytesStr(float64(m.RetainedPayload))+"), "+g+" sessions", "—", "—", bytesStr(r.beyond(n)), "")
		}
	}
	t.WriteString("\n### Targets (as computed by this run)\n\n")
	met := map[bool]string{true: "**met**", false: "**not met**"}
	for _, c := range cfgs {
		if q := r.tpRatio(c); len(r.tp[c]) > 0 && (c.streams > 1 || c.size > 4096) {
			fmt.Fprintf(&t, "- issue 14: throughput ≥ 1.0x plain, %s: %s → %s\n", c.key(), ratioStr(q), met[q >= 1])
		} else if len(r.tp[c]) > 0 {
			fmt.Fprintf(&t, "- issue 14: keep the 1-stream advantage, %s: %s → %s\n", c.key(), ratioStr(q), met[q >= 1])
		}
	}
	if len(r.latency["mcp_resume"]) > 0 {
		added := lat("mcp_resume", true) - lat("plain", true)
		fmt.Fprintf(&t, "- issue 14: added p99 latency < 50 µs (1 KiB every %v): %s → %s\n", latencyEvery, usStr(added), met[added < 50])
	}
	if n := r.cfg.sessions[len(r.cfg.sessions)-1]; r.memory[memKey{n, "mcp_resume"}].RetainedPayload > 0 {
		fmt.Fprintf(&t, "- issue 7: %s sessions in ≤ 64 MiB beyond retained payload: %s → %s\n", groupDigits(n), bytesStr(r.beyond(n)), met[r.beyond(n) <= 64<<20])
	}
	if n := r.cfg.replay[len(r.cfg.replay)-1]; len(r.resume[n]) > 0 {
		eps := medianOf(r.resume[n], replayRate)
		fmt.Fprintf(&t, "- issue 7: replay of %s events ≥ live throughput (1 stream, 1 KiB): %s vs %s ev/s → %s\n", groupDigits(n), num(eps), num(r.live()), met[eps >= r.live()])
	}
	return t.String()
}
