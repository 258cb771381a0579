// Command mcp-resume-bench measures mcp_resume side by side with the same
// Caddy route without it (plain reverse_proxy), with the JetStream store
// (store nats { embedded }) and with no proxy at all (direct: the clients
// read the upstream, the limit of the machine): streaming throughput, the
// proxy's CPU, allocations and system calls per event, added latency, and
// resume (replay) cost. Memory per session is tests/backpressure's.
//
// It runs as two processes. This one runs Caddy, in-process, with three
// sites on one upstream (reverse_proxy; mcp_resume + reverse_proxy; the
// same on the JetStream store) and measures itself: its CPU time,
// allocations and system calls are the proxy's alone. A child (this binary
// with -load) runs the upstream and the clients (internal/mcptest) and
// measures the runs. Setups alternate run by run; a warm-up round is
// dropped; medians of the rounds are reported as markdown on stdout (the
// results part of BENCHMARKS.md), progress on stderr.
//
//	go run ./cmd/mcp-resume-bench > bench.md                      # several minutes
//	go run ./cmd/mcp-resume-bench -quick                          # smoke run
//	go run ./cmd/mcp-resume-bench -cpuprofile cpu.out -gobench > bench.md
//
// -cpuprofile profiles the proxy's process in an extra, unmeasured pass of
// one setup's workloads (-profile-setup: every throughput configuration,
// the largest replay) and puts its top entries in the report, beside those
// of -base-profile (the same pass on another build) if given; -memprofile
// adds the allocations of that pass (go tool pprof -sample_index=alloc_objects
// -diff_base X.base X).
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"runtime/metrics"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/internal/mcptest"
	"github.com/mcpresume/caddy-mcp-resume/internal/testnet"
)

type config struct {
	rounds                   int
	phases                   map[string]bool
	scale                    float64
	sizes, streams, replay   []int
	callSessions             []int
	cpuprofile, profileSetup string
	memprofile               string
	baseProfile, baseLabel   string
	gobench                  bool
	waitQuiet                time.Duration
	load                     bool
}

func intList(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			v, err := strconv.Atoi(strings.ReplaceAll(f, "_", ""))
			if err != nil || v <= 0 {
				return nil, fmt.Errorf("%q is not a positive integer", f)
			}
			out = append(out, v)
		}
	}
	return out, nil
}

func parseFlags(args []string) (config, error) {
	fs := flag.NewFlagSet("mcp-resume-bench", flag.ContinueOnError)
	c := config{phases: map[string]bool{}}
	quick := fs.Bool("quick", false, "smoke run: 1 round, smaller runs (not for publishing)")
	fs.BoolVar(&c.load, "load", false, "internal: be the load process (upstream and clients)")
	fs.IntVar(&c.rounds, "rounds", 5, "measured rounds per figure, after a warm-up round")
	phases := fs.String("phases", "throughput,latency,resume,calls", "phases to run (calls: short tool calls and session churn)")
	only := fs.String("setups", strings.Join(setups, ","), "setups to measure (a subset of the default)")
	fs.Float64Var(&c.scale, "scale", 1, "multiplier on events per throughput and latency run")
	lists := map[string]*string{
		"sizes":   fs.String("sizes", "100,1024,16384", "event sizes (JSON-RPC message bytes) for throughput"),
		"streams": fs.String("streams", "1,64", "concurrent streams (one session each) for throughput"),
		"replay":  fs.String("replay", "1000,100000", "retained events per resume run"),
		"calls":   fs.String("call-sessions", "1,32", "concurrent sessions making short calls (calls phase)"),
	}
	fs.StringVar(&c.cpuprofile, "cpuprofile", "", "write a CPU profile of the proxy in an extra pass of one setup's workloads")
	fs.StringVar(&c.memprofile, "memprofile", "", "with -cpuprofile, also write the allocations made in that pass (pprof -sample_index=alloc_objects)")
	fs.StringVar(&c.baseProfile, "base-profile", "", "a CPU profile from an earlier build (-cpuprofile there) to show beside this run's")
	fs.StringVar(&c.baseLabel, "base-label", "baseline", "what -base-profile profiled, for the report")
	fs.BoolVar(&c.gobench, "gobench", false, "also run the buffer package's micro-benchmarks (go test -bench) for the report")
	fs.StringVar(&c.profileSetup, "profile-setup", "mcp_resume", "the setup -cpuprofile profiles: plain, mcp_resume or jetstream")
	fs.DurationVar(&c.waitQuiet, "wait-quiet", 0, "first wait up to this long for other processes to use under 0.2 cores")
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	for name, v := range map[string]string{"rounds": "1", "scale": "0.2", "replay": "1000,20000"} {
		if *quick && !set[name] {
			fs.Set(name, v)
		}
	}
	for _, p := range strings.Split(*phases, ",") {
		switch p = strings.TrimSpace(p); p {
		case "throughput", "latency", "resume", "calls":
			c.phases[p] = true
		case "":
		default:
			return c, fmt.Errorf("-phases: unknown phase %q", p)
		}
	}
	setups = slices.DeleteFunc(slices.Clone(allSetups), func(s string) bool { return !slices.Contains(strings.Split(*only, ","), s) })
	dst := map[string]*[]int{"sizes": &c.sizes, "streams": &c.streams, "replay": &c.replay, "calls": &c.callSessions}
	for name, v := range lists {
		var err error
		if *dst[name], err = intList(*v); err != nil || len(*dst[name]) == 0 {
			return c, fmt.Errorf("-%s: %v", name, err)
		}
	}
	if c.rounds < 1 || c.scale <= 0 || c.replay[0] <= 5 {
		return c, fmt.Errorf("-rounds and -scale must be positive, -replay above 5")
	}
	return c, nil
}

// tpConfig is one throughput configuration: about a second's worth of
// events (over all streams) on a quiet 2-core machine.
type tpConfig struct{ size, streams, total int }

func (c tpConfig) key() string {
	return fmt.Sprintf("%s events, %d stream%s", sizeName(c.size), c.streams, map[bool]string{true: "", false: "s"}[c.streams == 1])
}

func (c config) tpConfigs() []tpConfig {
	var out []tpConfig
	for _, n := range c.streams {
		for _, size := range c.sizes {
			total := map[bool]int{true: 600_000, false: 400_000}[size <= 256]
			if size > 4096 {
				total = (768 << 20) / size
			}
			out = append(out, tpConfig{size, n, max(int(float64(total)*c.scale), 64)})
		}
	}
	return out
}

func main() {
	cfg, err := parseFlags(os.Args[1:])
	switch {
	case err == flag.ErrHelp:
		return
	case err == nil && cfg.load:
		err = loadMain()
	case err == nil:
		time.AfterFunc(30*time.Minute, func() { logf("aborted after 30 minutes"); os.Exit(3) })
		err = run(cfg)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "mcp-resume-bench:", err)
		os.Exit(1)
	}
}

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "%s  "+format+"\n", append([]any{time.Now().Format("15:04:05")}, args...)...)
}

// bench is the proxy's process: Caddy, and the load process it drives.
type bench struct {
	cfg      config
	load     *exec.Cmd
	toLoad   io.Writer
	fromLoad *bufio.Scanner
	bases    map[string]string // by setup
	admin    string
	idle     float64 // the proxy's own CPU, in cores, with nothing to do
}

// setups: the clients read the upstream directly, through plain
// reverse_proxy, through mcp_resume with the memory store, and with the
// JetStream store (an embedded single-node server in Caddy's data
// directory, file storage).
var allSetups = []string{"direct", "plain", "mcp_resume", "jetstream"}

var setups = allSetups // those -setups measures

func retaining(s string) bool { return s == "mcp_resume" || s == "jetstream" }

func run(cfg config) error {
	b := &bench{cfg: cfg, load: exec.Command(os.Args[0], "-load")}
	defer func() {
		if b.load.Process != nil {
			b.load.Process.Kill()
		}
	}()
	cleanup, err := mcptest.Isolate()
	if err != nil {
		return err
	}
	defer cleanup()
	if err := b.start(); err != nil {
		return err
	}
	defer mcptest.Stop()
	if cfg.waitQuiet > 0 {
		b.waitQuiet()
	}
	rep := &report{cfg: cfg, tp: map[tpConfig]map[string][]tpRun{}, latency: map[string][]result{}, resume: map[key][]result{},
		calls: map[callConfig]map[string][]callRun{}}
	if cfg.phases["calls"] {
		b.idle = b.idleRate()
	}
	rep.metricsBefore, _ = mcptest.ScrapeMetrics(b.admin + "/metrics")
	busy0, own0, started := b.cpuSample()
	// Every setup, round by round (round 0 warms up), in another order each.
	rounds := func(phase string, f func(s string, measured bool) error) error {
		for round := 0; round <= cfg.rounds && cfg.phases[phase]; round++ {
			for _, s := range rotate(setups, round) {
				if err := f(s, round > 0); err != nil {
					return err
				}
			}
		}
		return nil
	}
	for _, c := range cfg.tpConfigs() {
		rep.tp[c] = map[string][]tpRun{}
		if err := rounds("throughput", func(s string, measured bool) error {
			r, err := b.throughput(s, c)
			if measured {
				rep.tp[c][s] = append(rep.tp[c][s], r)
			}
			logf("throughput %-24s %-10s: %8.0f events/s; proxy %5.2f µs CPU, %5.3f allocs, %5.3f syscalls per event; all %5.2f µs CPU per event",
				c.key(), s, r.eventsPerSec(), r.proxyCPU(), r.allocs(), r.sysPerEv(), r.allCPU())
			return err
		}); err != nil {
			return err
		}
	}
	if err := rounds("latency", func(s string, measured bool) error {
		r, err := b.call(command{Op: "latency", Base: b.bases[s], Size: 1024, Total: max(int(1000*cfg.scale), 200)}, nil)
		if measured {
			rep.latency[s] = append(rep.latency[s], r)
		}
		logf("latency %-10s: p50 %.0f µs, p99 %.0f µs, max %.0f µs", s, r.P50, r.P99, r.Max)
		return err
	}); err != nil {
		return err
	}
	for _, n := range cfg.replay {
		for round := 1; round <= cfg.rounds && cfg.phases["resume"]; round++ {
			for _, s := range rotate(slices.DeleteFunc(slices.Clone(setups), func(s string) bool { return !retaining(s) }), round) {
				r, err := b.call(command{Op: "resume", Base: b.bases[s], Admin: b.admin, Total: n}, nil)
				if err != nil {
					return err
				}
				rep.resume[key{n, s}] = append(rep.resume[key{n, s}], r)
				logf("resume %7d events %-10s: fill %v, first event after %v, replay %.0f events/s", n, s,
					r.Fill.Round(time.Microsecond), r.TTFB.Round(time.Microsecond), replayRate(r))
			}
		}
	}
	for _, c := range cfg.callConfigs() {
		rep.calls[c] = map[string][]callRun{}
		if err := rounds("calls", func(s string, measured bool) error {
			r, err := b.calls(s, c)
			if measured {
				rep.calls[c][s] = append(rep.calls[c][s], r)
			}
			logf("%-24s %-10s: %6.0f /s, p50 %5.0f µs, p99 %6.0f µs; proxy %4.0f µs CPU (%3.0f after the run), %4.0f allocs, %4.1f syscalls each; load %4.0f µs CPU",
				c.key(), s, r.perSec(), r.P50, r.P99, r.proxyCPU(), r.afterCPU(), r.allocs(), r.sysPer(), float64(r.CPU.Nanoseconds())/1e3/float64(r.Events))
			return err
		}); err != nil {
			return err
		}
	}
	busy1, own1, _ := b.cpuSample()
	rep.elapsed = time.Since(started)
	rep.otherCores = max((busy1-busy0-(own1-own0)).Seconds(), 0) / rep.elapsed.Seconds()
	rep.metricsAfter, _ = mcptest.ScrapeMetrics(b.admin + "/metrics")
	if err := b.profile(); err != nil {
		return err
	}
	fmt.Print(rep.markdown())
	return nil
}

func rotate(xs []string, n int) []string {
	n %= len(xs)
	return append(append([]string(nil), xs[n:]...), xs[:n]...)
}

// start starts the load process, which answers with its upstream's
// address, and Caddy in front of that upstream.
func (b *bench) start() (err error) {
	b.load.Stderr = os.Stderr
	if b.toLoad, err = b.load.StdinPipe(); err != nil {
		return err
	}
	r, err := b.load.StdoutPipe()
	if err != nil {
		return err
	}
	if err := b.load.Start(); err != nil {
		return err
	}
	if b.fromLoad = bufio.NewScanner(r); !b.fromLoad.Scan() {
		return fmt.Errorf("the load process did not start: %v", b.fromLoad.Err())
	}
	upstream := b.fromLoad.Text()
	var ports [5]int // admin, mcp_resume, plain, https, jetstream
	for i := range ports {
		if ports[i], err = testnet.CaddyPort(); err != nil {
			return err
		}
	}
	const bind = "\tbind 127.0.0.1\n"
	b.admin = fmt.Sprintf("http://localhost:%d", ports[0])
	b.bases = map[string]string{"direct": "http://" + upstream,
		"mcp_resume": fmt.Sprintf("http://127.0.0.1:%d", ports[1]), "plain": fmt.Sprintf("http://127.0.0.1:%d", ports[2]),
		"jetstream": fmt.Sprintf("http://127.0.0.1:%d", ports[4])}
	opts := func(extra ...string) string {
		return "\t\t\t" + strings.Join(append(extra, moduleOptions...), "\n\t\t\t")
	}
	return mcptest.Load(mcptest.Config{AdminPort: ports[0], HTTPPort: ports[1], HTTPSPort: ports[3], Sites: []mcptest.Site{
		{Port: ports[1], Body: bind + mcptest.ResumeRoute(upstream, opts())},
		{Port: ports[2], Body: bind + mcptest.ProxyRoute(upstream)},
		{Port: ports[4], Body: bind + mcptest.ResumeRoute(upstream, opts(jetstreamOptions...))},
	}})
}

// moduleOptions keep backpressure from throttling the benchmark: a stream
// sustains max_stream_bytes per resume_window (3 GiB/s here); the report
// counts the stalls.
var moduleOptions = []string{"resume_window 1s", "max_stream_bytes 3GiB", "max_session_bytes 3GiB",
	"max_total_bytes 8GiB", "max_event_bytes 32MiB", "max_sessions 20000"}

// jetstreamOptions put the jetstream setup in a zone of its own.
var jetstreamOptions = []string{"zone js", "store nats {\n\t\t\t\tembedded\n\t\t\t}"}

// call runs a command in the load process; onMark takes this process's
// readings at each of its marks.
func (b *bench) call(c command, onMark func()) (result, error) {
	js, _ := json.Marshal(c)
	fmt.Fprintf(b.toLoad, "%s\n", js)
	for b.fromLoad.Scan() {
		var r result
		if err := json.Unmarshal(b.fromLoad.Bytes(), &r); err != nil || !r.Mark {
			if err == nil && r.Err != "" {
				err = fmt.Errorf("%s", r.Err)
			}
			return r, err
		}
		if onMark != nil {
			onMark()
		}
		fmt.Fprintln(b.toLoad, "ok")
	}
	return result{}, fmt.Errorf("the load process ended: %v", b.fromLoad.Err())
}

// usage is this process's user+system CPU time so far.
func usage() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// contextSwitches is this process's context switches so far, every thread's:
// a goroutine handing work to another can cost a thread's sleep and wake-up.
func contextSwitches() int64 {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return ru.Nvcsw + ru.Nivcsw
}

// readMetric reads one of the runtime's uint64 metrics.
func readMetric(name string) uint64 {
	s := []metrics.Sample{{Name: name}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}

// tpRun is one throughput run: the load process's figures, and the CPU time
// and heap allocations of this process (the proxy) meanwhile.
type tpRun struct {
	result
	proxy             time.Duration
	mallocs, syscalls uint64
}

func (r tpRun) eventsPerSec() float64 { return float64(r.Events) / r.Elapsed.Seconds() }
func (r tpRun) mbPerSec() float64     { return float64(r.Payload) / 1e6 / r.Elapsed.Seconds() }
func (r tpRun) proxyCPU() float64     { return float64(r.proxy.Nanoseconds()) / 1e3 / float64(r.Events) }
func (r tpRun) allCPU() float64 {
	return float64((r.proxy + r.CPU).Nanoseconds()) / 1e3 / float64(r.Events)
}
func (r tpRun) allocs() float64   { return float64(r.mallocs) / float64(r.Events) }
func (r tpRun) sysPerEv() float64 { return float64(r.syscalls) / float64(r.Events) }

// syscalls is this process's read and write system calls so far (socket
// reads and writes included).
func syscalls() uint64 {
	b, _ := os.ReadFile("/proc/self/io")
	var n uint64
	for _, l := range strings.Split(string(b), "\n") {
		if k, v, _ := strings.Cut(l, ": "); k == "syscr" || k == "syscw" {
			x, _ := strconv.ParseUint(v, 10, 64)
			n += x
		}
	}
	return n
}

// throughput runs one configuration through one setup. No collection is
// forced between runs: as in a proxy that has been running, memory that
// earlier runs gave back is there to reuse.
func (b *bench) throughput(setup string, c tpConfig) (tpRun, error) {
	var cpu []time.Duration
	var objs, calls []uint64
	res, err := b.call(command{Op: "throughput", Base: b.bases[setup], Size: c.size, Streams: c.streams, Total: c.total}, func() {
		cpu, objs, calls = append(cpu, usage()), append(objs, readMetric("/gc/heap/allocs:objects")), append(calls, syscalls())
	})
	if err != nil {
		return tpRun{}, fmt.Errorf("throughput %s, %s: %v", c.key(), setup, err)
	}
	return tpRun{result: res, proxy: cpu[1] - cpu[0], mallocs: objs[1] - objs[0], syscalls: calls[1] - calls[0]}, nil
}

type key struct {
	n     int // replayed events
	setup string
}

// profile profiles this process (the proxy) in one more pass of the
// profiled setup's throughput and calls configurations and the largest
// replay.
func (b *bench) profile() error {
	if b.cfg.cpuprofile == "" {
		return nil
	}
	f, err := os.Create(b.cfg.cpuprofile)
	if err != nil {
		return err
	}
	defer f.Close()
	logf("profiling the proxy in an extra pass of the %s workloads into %s", b.cfg.profileSetup, b.cfg.cpuprofile)
	if err := pprof.StartCPUProfile(f); err != nil {
		return err
	}
	defer pprof.StopCPUProfile()
	if b.cfg.memprofile != "" {
		// Every allocation sampled, from here on: what the pass allocates
		// is the profile's difference from the base written now.
		runtime.MemProfileRate = 1
		base, err := os.Create(b.cfg.memprofile + ".base")
		if err != nil {
			return err
		}
		pprof.Lookup("allocs").WriteTo(base, 0)
		base.Close()
		defer func() {
			if f, err := os.Create(b.cfg.memprofile); err == nil {
				pprof.Lookup("allocs").WriteTo(f, 0)
				f.Close()
			}
		}()
	}
	for _, c := range b.cfg.tpConfigs() {
		if !b.cfg.phases["throughput"] {
			break
		}
		if _, err := b.throughput(b.cfg.profileSetup, c); err != nil {
			return err
		}
	}
	for _, c := range b.cfg.callConfigs() {
		if !b.cfg.phases["calls"] {
			break
		}
		if _, err := b.calls(b.cfg.profileSetup, c); err != nil {
			return err
		}
	}
	if b.cfg.phases["resume"] && retaining(b.cfg.profileSetup) {
		_, err = b.call(command{Op: "resume", Base: b.bases[b.cfg.profileSetup], Admin: b.admin, Total: b.cfg.replay[len(b.cfg.replay)-1]}, nil)
	}
	return err
}

// cpuSample returns the machine's busy CPU time and the benchmark's own
// (both processes), to tell how much other processes competed with it.
func (b *bench) cpuSample() (busy, own time.Duration, at time.Time) {
	stat, _ := os.ReadFile("/proc/stat")
	return busyCPU(string(stat)), usage() + procCPU(b.load.Process.Pid), time.Now()
}

// waitQuiet waits, up to -wait-quiet, until other processes keep fewer than
// 0.2 cores busy over 3 s.
func (b *bench) waitQuiet() {
	for deadline := time.Now().Add(b.cfg.waitQuiet); ; {
		busy0, own0, t0 := b.cpuSample()
		time.Sleep(3 * time.Second)
		busy1, own1, t1 := b.cpuSample()
		other := (busy1 - busy0 - (own1 - own0)).Seconds() / t1.Sub(t0).Seconds()
		if other < 0.2 || time.Now().After(deadline) {
			logf("other processes use %.2f cores", other)
			return
		}
		logf("waiting for a quieter machine: other processes use %.2f cores", other)
	}
}
