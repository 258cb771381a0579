// Command mcp-resume-bench measures mcp_resume side by side with a plain
// reverse_proxy: streaming throughput, added latency, resume (replay) cost,
// memory per session and per retained byte, and CPU per event.
//
// Everything runs in this one process, on loopback: a minimal MCP upstream
// (plain net/http), one in-process Caddy with two sites on that upstream
// (`mcp_resume` + `reverse_proxy`, and `reverse_proxy` alone), and raw
// Streamable HTTP clients. Runs alternate between the two setups round by
// round and the median of the rounds is reported as a markdown table.
//
// Usage:
//
//	go run ./cmd/mcp-resume-bench                 # full run, a few minutes on 2 cores
//	go run ./cmd/mcp-resume-bench -quick          # smoke run, well under a minute
//	go run ./cmd/mcp-resume-bench -cpuprofile cpu.out -o report.md
//	go tool pprof -top cpu.out
//
// -cpuprofile profiles an extra, unmeasured pass of the mcp_resume workloads
// (every throughput configuration and the largest replay) after the measured
// rounds, so profiling overhead never skews the table.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"runtime/pprof"
	"strconv"
	"strings"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/internal/mcptest"
)

type config struct {
	rounds          int
	phases          map[string]bool
	scale           float64
	sizes           []int
	concurrency     []int
	latencyEvents   int
	latencySize     int
	latencyInterval time.Duration
	replayCounts    []int
	replaySize      int
	sessionCounts   []int
	retainEvents    int
	retainSize      int
	flushEach       bool
	cpuprofile      string
	out             string
	waitQuiet       time.Duration
	timeout         time.Duration
}

func intList(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		v, err := strconv.Atoi(strings.ReplaceAll(f, "_", ""))
		if err != nil || v <= 0 {
			return nil, fmt.Errorf("%q is not a positive integer", f)
		}
		out = append(out, v)
	}
	return out, nil
}

func parseFlags(args []string) (config, error) {
	fs := flag.NewFlagSet("mcp-resume-bench", flag.ContinueOnError)
	quick := fs.Bool("quick", false, "short run: 1 round, smaller runs, fewer sessions (a smoke test, not for publishing)")
	rounds := fs.Int("rounds", 5, "rounds per measurement (setups alternate; the median is reported)")
	phases := fs.String("phases", "throughput,latency,resume,memory", "phases to run")
	scale := fs.Float64("scale", 1, "multiplier on events per throughput run")
	sizes := fs.String("sizes", "100,1024,16384", "event sizes (JSON-RPC message bytes) for throughput")
	conc := fs.String("streams", "1,64", "concurrent streams (one session each) for throughput")
	latN := fs.Int("latency-events", 1000, "paced events per latency run")
	latSize := fs.Int("latency-size", 1024, "event size for latency runs")
	latInt := fs.Duration("latency-interval", 2*time.Millisecond, "pacing of latency events")
	replay := fs.String("replay", "1000,100000", "retained events per resume run")
	replaySize := fs.Int("replay-size", 1024, "event size for resume runs")
	sessions := fs.String("sessions", "1000,10000", "concurrent idle sessions for the memory phase")
	retainN := fs.Int("retain-events", 4, "progress events each session retains in the memory phase")
	retainSize := fs.Int("retain-size", 1024, "their size")
	flushEach := fs.Bool("flush-each", true, "upstream flushes after every event (as MCP SDKs do); false: only when its buffer fills")
	cpuprofile := fs.String("cpuprofile", "", "write a CPU profile of an extra pass of the mcp_resume workloads to this file")
	out := fs.String("o", "", "also write the markdown report to this file")
	timeout := fs.Duration("timeout", 20*time.Minute, "abort the whole benchmark after this long")
	waitQuiet := fs.Duration("wait-quiet", 0, "before measuring, wait up to this long for other processes to use under 0.2 cores")
	if err := fs.Parse(args); err != nil {
		return config{}, err
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if *quick { // smaller defaults, where the command line leaves them
		for name, v := range map[string]string{"rounds": "1", "scale": "0.2", "latency-events": "250", "replay": "1000,20000", "sessions": "1000"} {
			if !set[name] {
				fs.Set(name, v)
			}
		}
	}
	c := config{
		rounds: *rounds, scale: *scale, latencyEvents: *latN, latencySize: *latSize, latencyInterval: *latInt,
		replaySize: *replaySize, retainEvents: *retainN, retainSize: *retainSize, flushEach: *flushEach,
		cpuprofile: *cpuprofile, out: *out, timeout: *timeout, waitQuiet: *waitQuiet, phases: map[string]bool{},
	}
	for _, p := range strings.Split(*phases, ",") {
		switch p = strings.TrimSpace(p); p {
		case "throughput", "latency", "resume", "memory":
			c.phases[p] = true
		case "":
		default:
			return c, fmt.Errorf("-phases: unknown phase %q", p)
		}
	}
	var err error
	for _, l := range []struct {
		name, v string
		dst     *[]int
	}{{"sizes", *sizes, &c.sizes}, {"streams", *conc, &c.concurrency}, {"replay", *replay, &c.replayCounts}, {"sessions", *sessions, &c.sessionCounts}} {
		if *l.dst, err = intList(l.v); err != nil {
			return c, fmt.Errorf("-%s: %v", l.name, err)
		}
	}
	if c.rounds < 1 || c.scale <= 0 || c.latencyEvents < 1 || c.replaySize < 1 || c.retainEvents < 1 {
		return c, fmt.Errorf("-rounds, -scale, -latency-events, -replay-size and -retain-events must be positive")
	}
	for _, n := range c.replayCounts {
		if n <= 5 {
			return c, fmt.Errorf("-replay: %d: a resume run needs more than 5 events", n)
		}
	}
	return c, nil
}

// eventsPerRun is the number of progress events per throughput run (over all
// streams), sized so one run takes about a second on a quiet 2-core machine.
func eventsPerRun(size int, scale float64) int {
	var n int
	switch {
	case size <= 256:
		n = 300_000
	case size <= 4096:
		n = 200_000
	default:
		n = (384 << 20) / size // 384 MiB of payload
	}
	return max(int(float64(n)*scale), 64)
}

// tpConfigs are the throughput runs, in the report's order; none without
// the throughput phase.
func (c config) tpConfigs() []tpConfig {
	var out []tpConfig
	for _, conc := range c.concurrency {
		for _, size := range c.sizes {
			if c.phases["throughput"] {
				out = append(out, tpConfig{size: size, streams: conc, total: eventsPerRun(size, c.scale)})
			}
		}
	}
	return out
}

func main() {
	cfg, err := parseFlags(os.Args[1:])
	if err == flag.ErrHelp {
		return
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "mcp-resume-bench:", err)
		os.Exit(2)
	}
	// Bounded: whatever happens, the benchmark ends.
	watchdog := time.AfterFunc(cfg.timeout, func() {
		fmt.Fprintf(os.Stderr, "mcp-resume-bench: aborted after %v (-timeout)\n", cfg.timeout)
		os.Exit(3)
	})
	defer watchdog.Stop()
	if err := run(cfg, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "mcp-resume-bench:", err)
		os.Exit(1)
	}
}

func run(cfg config, stdout io.Writer) error {
	ctx, cancel := context.WithTimeout(context.Background(), cfg.timeout)
	defer cancel()
	logf := func(format string, args ...any) {
		fmt.Fprintf(os.Stderr, "%s  "+format+"\n", append([]any{time.Now().Format("15:04:05")}, args...)...)
	}
	// The upstream: as cheap as can be, so that the proxy's cost dominates
	// what changes between the two setups.
	up := &mcptest.Upstream{Version: protocolVersion, FlushEach: cfg.flushEach}
	ln, err := mcptest.Listen(0)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: up, ReadHeaderTimeout: 10 * time.Second}
	go srv.Serve(ln)
	defer srv.Close()
	px, err := startProxy(ln.Addr().String())
	if err != nil {
		return err
	}
	defer px.stop()
	b := &bench{
		cfg: cfg, up: up, px: px, hc: newHTTPClient(), logf: logf,
		plain:  setup{name: "plain", base: px.plainBase},
		resume: setup{name: "mcp_resume", base: px.resumeBase, resume: true},
	}
	if cfg.waitQuiet > 0 {
		waitQuiet(cfg.waitQuiet, logf)
	}
	started := time.Now()
	load0 := sampleLoad()
	rep := newReport(cfg)
	if m, err := px.metrics(); err == nil {
		rep.metricsBefore = m
	}
	for _, c := range cfg.tpConfigs() {
		for round := 0; round < cfg.rounds; round++ {
			for _, s := range b.order(round) {
				r, err := b.throughput(ctx, s, c)
				if err != nil {
					return fmt.Errorf("throughput %s, %s: %v", c.key(), s.name, err)
				}
				rep.addThroughput(c, s.name, r)
				logf("throughput %-24s %-10s round %d: %9.0f events/s %7.1f MB/s %6.2f µs CPU/event, %.2f context switches/event, %.0f stalls",
					c.key(), s.name, round+1, r.eventsPerSec(), r.mbPerSec(), r.cpuPerEvent(), r.cswPerEvent(), r.stalls)
			}
		}
	}
	if cfg.phases["latency"] {
		for round := 0; round < cfg.rounds; round++ {
			for _, s := range b.order(round) {
				r, err := b.latency(ctx, s)
				if err != nil {
					return fmt.Errorf("latency, %s: %v", s.name, err)
				}
				rep.latency[s.name] = append(rep.latency[s.name], r)
				logf("latency %-10s round %d: p50 %.0f µs, p99 %.0f µs, max %.0f µs", s.name, round+1, r.p50, r.p99, r.max)
			}
		}
	}
	if cfg.phases["resume"] {
		for _, n := range cfg.replayCounts {
			for round := 0; round < cfg.rounds; round++ {
				r, err := b.resumeRun(ctx, n)
				if err != nil {
					return fmt.Errorf("resume %d events: %v", n, err)
				}
				rep.resume[n] = append(rep.resume[n], r)
				logf("resume %7d events round %d: fill %v (%.0f events/s), first event after %v, replay %.0f events/s %.1f MB/s",
					n, round+1, r.fill.Round(time.Microsecond), r.filledEPS, r.ttfb.Round(time.Microsecond), r.eventsPerSec(), r.mbPerSec())
			}
		}
	}
	if cfg.phases["memory"] {
		for _, n := range cfg.sessionCounts {
			for _, s := range []setup{b.plain, b.resume} {
				r, err := b.memory(ctx, s, n)
				if err != nil {
					return fmt.Errorf("memory %d sessions, %s: %v", n, s.name, err)
				}
				rep.memory[memKey{n, s.name}] = r
				logf("memory %6d sessions %-10s: %.0f sessions/s; idle heap %s, RSS %s; retained heap %s for %s payload",
					n, s.name, r.initRate, bytesStr(float64(r.idle.heap)), bytesStr(float64(r.idle.rss)),
					bytesStr(float64(r.retained.heap)), bytesStr(float64(r.retainedPayload)))
			}
		}
	}
	if m, err := px.metrics(); err == nil {
		rep.metricsAfter = m
	}
	rep.otherCores = sampleLoad().otherCores(load0)
	rep.elapsed = time.Since(started)
	if cfg.cpuprofile != "" {
		if err := b.profile(ctx, cfg.cpuprofile); err != nil {
			return err
		}
	}
	md := rep.markdown()
	fmt.Fprint(stdout, md)
	if cfg.out != "" {
		if err := os.WriteFile(cfg.out, []byte(md), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// profile runs every mcp_resume throughput configuration once and the
// largest replay once under the CPU profiler.
func (b *bench) profile(ctx context.Context, path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	b.logf("profiling an extra pass of the mcp_resume workloads into %s", path)
	if err := pprof.StartCPUProfile(f); err != nil {
		return err
	}
	defer pprof.StopCPUProfile()
	for _, c := range b.cfg.tpConfigs() {
		if _, err := b.throughput(ctx, b.resume, c); err != nil {
			return fmt.Errorf("profile pass: %v", err)
		}
	}
	if b.cfg.phases["resume"] && len(b.cfg.replayCounts) > 0 {
		if _, err := b.resumeRun(ctx, b.cfg.replayCounts[len(b.cfg.replayCounts)-1]); err != nil {
			return fmt.Errorf("profile pass: %v", err)
		}
	}
	return nil
}

// waitQuiet waits, up to limit, until other processes keep fewer than 0.2
// cores busy over a 3 s sample.
func waitQuiet(limit time.Duration, logf func(string, ...any)) {
	deadline := time.Now().Add(limit)
	for {
		s0 := sampleLoad()
		time.Sleep(3 * time.Second)
		other := sampleLoad().otherCores(s0)
		if math.IsNaN(other) || other < 0.2 {
			return
		}
		if time.Now().After(deadline) {
			logf("machine still busy (other processes use %.2f cores); measuring anyway", other)
			return
		}
		logf("waiting for a quieter machine: other processes use %.2f cores", other)
	}
}
