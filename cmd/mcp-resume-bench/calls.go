package main

import (
	"fmt"
	"math"
	"strings"
	"time"
)

// The calls phase: the shape of real MCP traffic, many short tools/call
// requests each answered by a small SSE stream (one progress notification
// and the result), from 1 and 32 sessions at once, and whole sessions
// coming and going (churn: initialize, initialized, one call, DELETE).

// callConfig is one calls-phase run: sessions making calls, or (churn)
// workers running whole sessions.
type callConfig struct {
	churn    bool
	sessions int
	total    int // calls, or sessions (churn)
}

func (c callConfig) key() string {
	if c.churn {
		return fmt.Sprintf("session churn, %d at once", c.sessions)
	}
	return fmt.Sprintf("calls, %d session%s", c.sessions, map[bool]string{true: "", false: "s"}[c.sessions == 1])
}

func (c config) callConfigs() []callConfig {
	var out []callConfig
	for _, n := range c.callSessions {
		total := map[bool]int{true: 2000, false: 6000}[n == 1]
		out = append(out, callConfig{sessions: n, total: max(int(float64(total)*c.scale), 4*n)})
	}
	return append(out, callConfig{churn: true, sessions: 32, total: max(int(1000*c.scale), 64)})
}

// settle is how long after a run the proxy's CPU is still counted for it:
// work a call leaves behind (acks, tidying, ended streams' records).
const settle = 500 * time.Millisecond

// callRun is one calls-phase run: the load process's figures, and the
// proxy's CPU time (during the run, and in the settle time after it, its
// idle rate taken off), allocations and system calls.
type callRun struct {
	result
	proxy, after      time.Duration
	mallocs, syscalls uint64
	switches          int64 // the proxy's context switches (voluntary and not)
}

func (r callRun) perSec() float64 { return float64(r.Events) / r.Elapsed.Seconds() }

// proxyCPU is µs per call (or session) of the proxy, the settle time included.
func (r callRun) proxyCPU() float64 {
	return float64((r.proxy + r.after).Nanoseconds()) / 1e3 / float64(r.Events)
}
func (r callRun) afterCPU() float64 { return float64(r.after.Nanoseconds()) / 1e3 / float64(r.Events) }
func (r callRun) allocs() float64   { return float64(r.mallocs) / float64(r.Events) }
func (r callRun) sysPer() float64   { return float64(r.syscalls) / float64(r.Events) }
func (r callRun) csPer() float64    { return float64(r.switches) / float64(r.Events) }
func (r callRun) p50() float64      { return r.P50 }
func (r callRun) p99() float64      { return r.P99 }

// calls runs one calls-phase configuration through one setup.
func (b *bench) calls(setup string, c callConfig) (callRun, error) {
	var cpu []time.Duration
	var objs, calls []uint64
	var cs []int64
	op := map[bool]string{true: "churn", false: "calls"}[c.churn]
	res, err := b.call(command{Op: op, Base: b.bases[setup], Streams: c.sessions, Total: c.total}, func() {
		cpu, objs, calls = append(cpu, usage()), append(objs, readMetric("/gc/heap/allocs:objects")), append(calls, syscalls())
		cs = append(cs, contextSwitches())
	})
	if err != nil {
		return callRun{}, fmt.Errorf("%s, %s: %v", c.key(), setup, err)
	}
	time.Sleep(settle)
	after := usage() - cpu[1] - time.Duration(b.idle*float64(settle))
	return callRun{result: res, proxy: cpu[1] - cpu[0], after: max(after, 0), mallocs: objs[1] - objs[0], syscalls: calls[1] - calls[0],
		switches: cs[1] - cs[0]}, nil
}

// idleRate is the proxy's CPU, in cores, over 2 s with no load: timers,
// the stores' background work.
func (b *bench) idleRate() float64 {
	t0, c0 := time.Now(), usage()
	time.Sleep(2 * time.Second)
	return (usage() - c0).Seconds() / time.Since(t0).Seconds()
}

// call1 is a calls-phase figure's median over the rounds of one setup.
func (r *report) call1(c callConfig, setup string, f func(callRun) float64) float64 {
	return medianOf(r.calls[c][setup], f)
}

// callsMarkdown is the calls phase's table: a figure per setup, then
// each store's ratio to plain reverse_proxy.
func (r *report) callsMarkdown() string {
	var t table
	cfgs := r.cfg.callConfigs()
	if len(cfgs) == 0 || len(r.calls[cfgs[0]]) == 0 {
		return ""
	}
	fmt.Fprintf(&t, "\n### Short calls and session churn\n\nEach call: a `tools/call` answered by one %d B `notifications/progress` and the result (~300 B of SSE). Churn: initialize, notifications/initialized, one call, DELETE. Latency: request sent to result read. Proxy CPU includes the %v after each run (work a call leaves behind), the proxy's idle rate taken off.\n\n", callSize, settle)
	t.row("figure", "direct (no proxy)", "plain reverse_proxy", "mcp_resume (memory store)", "mcp_resume (JetStream store)", "memory / plain", "JetStream / plain")
	t.row("---", "---:", "---:", "---:", "---:", "---:", "---:")
	for _, c := range cfgs {
		unit := map[bool]string{true: "session", false: "call"}[c.churn]
		for _, f := range []struct {
			label  string
			f      func(callRun) float64
			format func(float64) string
			proxy  bool
		}{{unit + "s/s", callRun.perSec, num, false}, {"p50 latency, µs", callRun.p50, sig3, false}, {"p99 latency, µs", callRun.p99, sig3, false},
			{"proxy CPU per " + unit + ", µs", callRun.proxyCPU, sig3, true}, {"of which after the run, µs", callRun.afterCPU, sig3, true},
			{"proxy heap allocations per " + unit, callRun.allocs, sig3, true}, {"proxy read+write system calls per " + unit, callRun.sysPer, sig3, true},
			{"proxy context switches per " + unit, callRun.csPer, sig3, true}} {
			cells := []string{c.key() + ": " + f.label}
			v := map[string]float64{}
			for _, s := range allSetups {
				if v[s] = r.call1(c, s, f.f); f.proxy && s == "direct" {
					v[s] = -1 // no proxy
				}
				cells = append(cells, map[bool]string{true: f.format(v[s]), false: "—"}[v[s] > 0.001 || v[s] == 0 && len(r.calls[c][s]) > 0])
			}
			for _, s := range []string{"mcp_resume", "jetstream"} {
				q := ratio(v[s], v["plain"])
				cells = append(cells, map[bool]string{true: ratioStr(q), false: "—"}[v["plain"] > 0.001 && f.label != "of which after the run, µs"])
			}
			t.row(cells...)
		}
	}
	return t.String()
}

// callTargets checks issue 23's targets against this run.
func (r *report) callTargets() string {
	var t strings.Builder
	met := map[bool]string{true: "**met**", false: "**not met**"}
	for _, c := range r.cfg.callConfigs() {
		if len(r.calls[c]["plain"]) == 0 {
			continue
		}
		rate := func(s string) float64 {
			return ratio(r.call1(c, s, callRun.perSec), r.call1(c, "plain", callRun.perSec))
		}
		cpu := func(s string) float64 {
			return ratio(r.call1(c, s, callRun.proxyCPU), r.call1(c, "plain", callRun.proxyCPU))
		}
		if c.churn {
			if q := rate("jetstream"); !math.IsNaN(q) {
				fmt.Fprintf(&t, "- issue 23: JetStream store, %s ≥ 0.5x plain sessions/s: %s → %s\n", c.key(), ratioStr(q), met[q >= 0.5])
			}
			continue
		}
		if q, p := rate("mcp_resume"), cpu("mcp_resume"); !math.IsNaN(q) {
			fmt.Fprintf(&t, "- issue 23: memory store, %s: ≥ 0.95x plain calls/s: %s → %s; ≤ 1.1x proxy CPU per call: %s → %s\n", c.key(), ratioStr(q), met[q >= 0.95], ratioStr(p), met[p <= 1.1])
		}
		if q, p := rate("jetstream"), cpu("jetstream"); !math.IsNaN(q) {
			fmt.Fprintf(&t, "- issue 23: JetStream store, %s: ≥ 0.5x plain calls/s: %s → %s; ≤ 3x proxy CPU per call: %s → %s\n", c.key(), ratioStr(q), met[q >= 0.5], ratioStr(p), met[p <= 3])
		}
	}
	return t.String()
}
