package main

import (
	"bytes"
	"fmt"
	"math"
	"os"
	"os/exec"
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
	resume                      map[key][]result
	calls                       map[callConfig]map[string][]callRun
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

type table struct{ strings.Builder }

func (t *table) row(cells ...string) { fmt.Fprintf(t, "| %s |\n", strings.Join(cells, " | ")) }

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
	if mod == "?" { // go run stamps no VCS information
		rev, _ := exec.Command("git", "rev-parse", "--short", "HEAD").Output()
		dirty, _ := exec.Command("git", "status", "--porcelain", "--untracked-files=no").Output()
		mod = fmt.Sprintf("? %s%s", bytes.TrimSpace(rev), map[bool]string{true: " (with uncommitted changes)"}[len(dirty) > 0])
	}
	cpuinfo, _ := os.ReadFile("/proc/cpuinfo")
	_, model, _ := strings.Cut(string(cpuinfo), "model name\t: ")
	model, _, _ = strings.Cut(model, "\n")
	kernel, _ := os.ReadFile("/proc/sys/kernel/osrelease")
	fmt.Fprintf(&t, "## direct, plain reverse_proxy, mcp_resume (memory and JetStream stores)\n\n- `%s`\n- %s, %d cores (GOMAXPROCS %d), Linux %s, Go %s, Caddy %s, module %s\n",
		strings.Join(append([]string{"go run ./cmd/mcp-resume-bench"}, os.Args[1:]...), " "), model, runtime.NumCPU(), runtime.GOMAXPROCS(0), bytes.TrimSpace(kernel), runtime.Version(), caddyV, mod[2:])
	fmt.Fprintf(&t, "- Two processes on loopback: the proxy's (one Caddy, three sites on the upstream: `reverse_proxy`; `mcp_resume` + `reverse_proxy`; the same with `zone js` and `store nats { embedded }`, a single-node JetStream in the process, file storage) and the load process (a minimal MCP upstream on net/http that flushes every event, raw Streamable HTTP clients, protocol %s). Direct: the clients read the upstream, no proxy. Proxy CPU and allocations are the proxy process's own.\n", protocolVersion)
	fmt.Fprintf(&t, "- mcp_resume options (both stores): `%s`", strings.Join(moduleOptions, "; "))
	if r.metricsAfter.Series != nil {
		d := func(k string) float64 { a, _ := r.metricsAfter.Sum(k); b, _ := r.metricsBefore.Sum(k); return a - b }
		fmt.Fprintf(&t, ": %.0f backpressure stalls, %.0f events evicted before ack, %.0f events through the logs",
			d("caddy_mcp_resume_backpressure_stalls_total"), d("caddy_mcp_resume_events_evicted_before_ack_total"), d("caddy_mcp_resume_events_enqueued_total"))
	}
	fmt.Fprintf(&t, ".\n- A warm-up round, then %d round(s) per figure, setups alternating run by run; medians. Sizes are JSON-RPC message bytes (SSE framing adds 23 B); MB = 10^6 B. Measured part took %s; other processes kept %s cores busy on average meanwhile (noise).\n\n",
		r.cfg.rounds, r.elapsed.Round(time.Second), num(r.otherCores))
	t.row("figure", "direct (no proxy)", "plain reverse_proxy", "mcp_resume (memory store)", "mcp_resume (JetStream store)", "mcp_resume / plain", "plain, mcp_resume, JetStream / direct")
	t.row("---", "---:", "---:", "---:", "---:", "---:", "---:")
	// line is one row: a figure per setup ("—" where it has none), then
	// mcp_resume/plain (with the difference if diff is set), then each/direct.
	line := func(label string, v map[string]float64, format func(float64) string, diff string) {
		cells := []string{label}
		for _, s := range allSetups {
			cells = append(cells, map[bool]string{true: format(v[s]), false: "—"}[v[s] > 0.001])
		}
		mp := ratioStr(ratio(v["mcp_resume"], v["plain"]))
		if !(v["plain"] > 0.001) {
			mp = "—"
		} else if diff != "" {
			mp += fmt.Sprintf(" (%+.2f"+diff+")", v["mcp_resume"]-v["plain"])
		}
		var vd []string
		for _, s := range []string{"plain", "mcp_resume", "jetstream"} {
			vd = append(vd, strings.NewReplacer("x", "", "n/a", "—").Replace(ratioStr(ratio(v[s], v["direct"]))))
		}
		t.row(append(cells, mp, map[bool]string{true: strings.Join(vd, ", "), false: "—"}[v["direct"] > 0.001])...)
	}
	per := func(f func(x result) float64, rs map[string][]result) map[string]float64 {
		v := map[string]float64{}
		for s, xs := range rs {
			v[s] = medianOf(xs, f)
		}
		return v
	}
	cfgs := r.cfg.tpConfigs()
	tps := func(c tpConfig, f func(tpRun) float64) map[string]float64 {
		v := map[string]float64{}
		for _, s := range allSetups {
			v[s] = r.tp1(c, s, f)
		}
		return v
	}
	for _, c := range cfgs {
		if len(r.tp[c]) > 0 {
			line("throughput, "+c.key()+", ev/s", tps(c, tpRun.eventsPerSec), num, "")
		}
	}
	for _, f := range []struct {
		label  string
		f      func(tpRun) float64
		format func(float64) string
		diff   string
	}{{"MB/s", tpRun.mbPerSec, num, ""}, {"proxy CPU per event, µs", tpRun.proxyCPU, sig3, " µs"},
		{"CPU per event, all processes, µs", tpRun.allCPU, sig3, " µs"}, {"proxy heap allocations per event", tpRun.allocs, sig3, ""},
		{"proxy read+write system calls per event", tpRun.sysPerEv, sig3, ""}} {
		for _, c := range cfgs {
			if v := tps(c, f.f); len(r.tp[c]) > 0 {
				if strings.HasPrefix(f.label, "proxy") {
					delete(v, "direct") // no proxy: the figure is idle noise
				}
				line(f.label+", "+c.key(), v, f.format, f.diff)
			}
		}
	}
	for _, p := range []string{"p50", "p99"} {
		if len(r.latency["mcp_resume"]) > 0 {
			line(fmt.Sprintf("latency upstream write → client read, %s, µs (1 KiB events every %v)", p, latencyEvery),
				per(func(x result) float64 { return map[string]float64{"p50": x.P50, "p99": x.P99}[p] }, r.latency), sig3, " µs")
		}
	}
	for _, n := range r.cfg.replay {
		rs := map[string][]result{"mcp_resume": r.resume[key{n, "mcp_resume"}], "jetstream": r.resume[key{n, "jetstream"}]}
		if len(rs["mcp_resume"]) > 0 {
			label := groupDigits(n) + " × 1 KiB events"
			line("resume "+label+": first replayed event after, µs", per(func(x result) float64 { return float64(x.TTFB) / 1e3 }, rs), sig3, "")
			line("replay throughput, "+label+", ev/s", per(replayRate, rs), num, "")
			line("tap into the log with no client, "+label+", ev/s", per(func(x result) float64 { return float64(n-5) / x.Fill.Seconds() }, rs), num, "")
		}
	}
	t.WriteString(r.callsMarkdown())
	t.WriteString("\n### Targets (as computed by this run)\n\n")
	met := map[bool]string{true: "**met**", false: "**not met**"}
	for _, c := range cfgs {
		if q := r.tpRatio(c); !math.IsNaN(q) && (c.streams > 1 || c.size > 4096) {
			fmt.Fprintf(&t, "- issue 14: throughput ≥ 1.0x plain, %s: %s → %s\n", c.key(), ratioStr(q), met[q >= 1])
		} else if !math.IsNaN(q) {
			fmt.Fprintf(&t, "- issue 14: keep the 1-stream advantage, %s: %s → %s\n", c.key(), ratioStr(q), met[q >= 1])
		}
	}
	if len(r.latency["mcp_resume"]) > 0 {
		p50, p99 := per(func(x result) float64 { return x.P50 }, r.latency), per(func(x result) float64 { return x.P99 }, r.latency)
		added := p99["mcp_resume"] - p99["plain"]
		fmt.Fprintf(&t, "- issue 14: added p99 latency < 50 µs (1 KiB every %v): %s (p50: %s) → %s\n", latencyEvery, usStr(added), usStr(p50["mcp_resume"]-p50["plain"]), met[added < 50])
	}
	for _, c := range cfgs {
		if eps := r.tp1(c, "jetstream", tpRun.eventsPerSec); c.size == 1024 && eps > 0 {
			fmt.Fprintf(&t, "- issue 11: JetStream store above 50k events/s of 1 KiB, %s: %s → %s\n", c.key(), num(eps), met[eps > 50e3])
		}
	}
	if n := r.cfg.replay[len(r.cfg.replay)-1]; len(r.resume[key{n, "mcp_resume"}]) > 0 {
		eps := medianOf(r.resume[key{n, "mcp_resume"}], replayRate)
		fmt.Fprintf(&t, "- issue 7: replay of %s events ≥ live throughput (1 stream, 1 KiB): %s vs %s ev/s → %s\n", groupDigits(n), num(eps), num(r.live()), met[eps >= r.live()])
	}
	t.WriteString(r.callTargets())
	return t.String() + r.appendix()
}

// env0 is the environment before mcptest.Isolate moved HOME: go keeps its
// module and build caches under it.
var env0 = os.Environ()

// appendix shows the top entries of the proxy's CPU profile (this run's and
// a baseline's, if given) and the buffer package's micro-benchmarks.
func (r *report) appendix() string {
	var t strings.Builder
	for _, p := range [][2]string{{"before: " + r.cfg.baseLabel, r.cfg.baseProfile}, {"after: this run", r.cfg.cpuprofile}} {
		for _, args := range [][]string{{"-top", "-nodecount=20"}, {"-top", "-cum", "-show=mcpresume/caddy-mcp-resume", "-nodecount=16"}} {
			if p[1] == "" {
				continue
			}
			cmd := exec.Command("go", append(append([]string{"tool", "pprof"}, args...), p[1])...)
			cmd.Env = env0
			out, err := cmd.CombinedOutput()
			if err != nil {
				out = []byte(err.Error() + "\n")
			}
			_, out, _ = bytes.Cut(out, []byte("Duration:")) // no file, build id, time
			fmt.Fprintf(&t, "\n#### CPU profile of the proxy, %s (`go tool pprof %s`)\n\n```\nDuration:%s```\n", p[0], strings.Join(args, " "), out)
		}
	}
	if r.cfg.gobench {
		cmd := exec.Command("go", "test", "-run", "^$", "-bench", ".", "-benchmem", "./buffer", "./resume")
		cmd.Env = env0
		out, err := cmd.CombinedOutput()
		if err != nil {
			out = append(out, err.Error()...)
		}
		fmt.Fprintf(&t, "\n#### Micro-benchmarks of the memory store and the tap (`go test -run '^$' -bench . -benchmem ./buffer ./resume`)\n\n```\n%s```\n", out)
	}
	return t.String()
}
