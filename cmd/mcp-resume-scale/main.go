// Command mcp-resume-scale measures how a replica's cost grows with the
// number of replicas on the shared store: one nats-server and N Caddy
// replicas with `store nats`, each a process of its own (built here from
// this module), MCP sessions making short calls (or coming and going)
// against replica A only, CPU time per process read from /proc. Each
// process's idle background (timers, health probes, leases) is measured
// before the load and taken off; what is left is the work the calls made,
// per call, for the serving replica, each idle replica, nats-server and the
// cluster. Results are markdown on stdout, progress on stderr.
//
//	go run ./cmd/mcp-resume-scale > scale.md          # a few minutes
//	go run ./cmd/mcp-resume-scale -quick              # smoke run
package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/internal/mcptest"
	"github.com/mcpresume/caddy-mcp-resume/internal/testnet"
)

type config struct {
	replicas        []int
	sessions, calls int
	churn, rounds   int
	idle, settle    time.Duration
	// idleProfile, if set, is where a CPU profile of replica B (the first
	// idle one) during the short calls is written.
	idleProfile string
	// sweeperIdle starts the idle replicas first, so that one of them
	// holds the sweeper lease (and scans the zone).
	sweeperIdle bool
	// bystanders pads every run with idle Caddy processes on the memory
	// store (not measured) up to the largest replica count: what more
	// processes cost on this machine, apart from more replicas in the zone.
	bystanders bool
}

func main() {
	c := config{}
	reps := flag.String("replicas", "1,2,3", "replica counts to measure")
	flag.IntVar(&c.sessions, "sessions", 16, "concurrent sessions (calls) or workers (churn), all on replica A")
	flag.IntVar(&c.calls, "calls", 3000, "short calls per run")
	flag.IntVar(&c.churn, "churn", 600, "sessions per churn run (initialize, one call, DELETE)")
	flag.IntVar(&c.rounds, "rounds", 2, "measured rounds per figure")
	flag.DurationVar(&c.idle, "idle", 3*time.Second, "how long each process's idle background is measured")
	flag.DurationVar(&c.settle, "settle", time.Second, "how long after a run its work is still counted")
	quick := flag.Bool("quick", false, "smoke run: 1 round, fewer calls")
	flag.BoolVar(&c.sweeperIdle, "sweeper-idle", false, "start the idle replicas first, so one of them is the zone's sweeper (by default replica A, started first, is)")
	flag.BoolVar(&c.bystanders, "bystanders", false, "pad each run with idle Caddy processes on the memory store (not measured) up to the largest replica count, so every run has as many processes")
	flag.StringVar(&c.idleProfile, "idle-cpuprofile", "", "write a CPU profile of replica B (idle) during the short calls to this file")
	flag.Parse()
	for _, f := range strings.Split(*reps, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			fatal(fmt.Errorf("-replicas: %q", f))
		}
		c.replicas = append(c.replicas, n)
	}
	if *quick {
		c.rounds, c.calls, c.churn = 1, 600, 150
	}
	if err := run(c); err != nil {
		fatal(err)
	}
}

func fatal(err error) {
	fmt.Fprintln(os.Stderr, "mcp-resume-scale:", err)
	os.Exit(1)
}

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "%s  "+format+"\n", append([]any{time.Now().Format("15:04:05")}, args...)...)
}

// cluster is one nats-server and N Caddy replicas on it.
type cluster struct {
	nats       *exec.Cmd
	replicas   []*mcptest.Process
	bystanders []*mcptest.Process // idle Caddy processes outside the zone (-bystanders)
	bases      []string
	admins     []string // each replica's admin endpoint
}

// procs are the cluster's processes: replica A, the idle replicas, nats-server.
func (cl *cluster) pids() []int {
	var out []int
	for _, r := range cl.replicas {
		out = append(out, r.Pid())
	}
	return append(out, cl.nats.Process.Pid)
}

func (cl *cluster) stop() {
	for _, r := range append(cl.replicas, cl.bystanders...) {
		if r != nil {
			r.Kill()
		}
	}
	cl.nats.Process.Kill()
	cl.nats.Wait()
}

// bins builds nats-server (go.mod's version) and Caddy with the module.
func bins(dir string) (natsBin, caddyBin string, err error) {
	natsBin = filepath.Join(dir, "nats-server")
	if out, err := exec.Command("go", "build", "-o", natsBin, "github.com/nats-io/nats-server/v2").CombinedOutput(); err != nil {
		return "", "", fmt.Errorf("go build nats-server: %v\n%s", err, out)
	}
	caddyBin, err = mcptest.BuildCaddy(dir, false)
	return natsBin, caddyBin, err
}

func start(dir, natsBin, caddyBin, upstream string, n, bystanders int, sweeperIdle bool) (*cluster, error) {
	port, err := testnet.FreePort()
	if err != nil {
		return nil, err
	}
	sd, err := os.MkdirTemp(dir, "js-")
	if err != nil {
		return nil, err
	}
	cl := &cluster{nats: exec.Command(natsBin, "-a", "127.0.0.1", "-p", strconv.Itoa(port), "-js", "-sd", sd)}
	if err := cl.nats.Start(); err != nil {
		return nil, err
	}
	store := fmt.Sprintf("store nats {\n url nats://127.0.0.1:%d\n}", port)
	cl.replicas, cl.bases, cl.admins = make([]*mcptest.Process, n), make([]string, n), make([]string, n)
	order := make([]int, 0, n) // replica A is index 0
	for i := range n {
		order = append(order, i)
	}
	if sweeperIdle && n > 1 {
		order = append(order[1:], 0)
	}
	for k, i := range order {
		p, base, admin, err := startCaddy(dir, caddyBin, upstream, store)
		if err != nil {
			cl.stop()
			return nil, fmt.Errorf("replica %d: %v", i+1, err)
		}
		cl.replicas[i], cl.bases[i], cl.admins[i] = p, base, admin
		if k == 0 && n > 1 {
			// The first replica's store opens on its first request; its
			// sweep takes the lease half a second later.
			if err := waitReady(cl.bases[i]); err != nil {
				cl.stop()
				return nil, err
			}
			time.Sleep(1500 * time.Millisecond)
		}
	}
	for range bystanders {
		p, _, _, err := startCaddy(dir, caddyBin, upstream, "") // the memory store
		if err != nil {
			cl.stop()
			return nil, fmt.Errorf("bystander: %v", err)
		}
		cl.bystanders = append(cl.bystanders, p)
	}
	// Ready when replica A answers an initialize (its store connected).
	if err := waitReady(cl.bases[0]); err != nil {
		cl.stop()
		return nil, err
	}
	return cl, nil
}

// startCaddy starts a Caddy process proxying to upstream with mcp_resume
// on store (a Caddyfile store block; "" for the memory store).
func startCaddy(dir, caddyBin, upstream, store string) (p *mcptest.Process, base, admin string, err error) {
	var ports [4]int
	for j := range ports {
		if ports[j], err = testnet.CaddyPort(); err != nil {
			return nil, "", "", err
		}
	}
	home, _ := os.MkdirTemp(dir, "caddy-")
	cfg := mcptest.Config{AdminPort: ports[0], HTTPPort: ports[1], HTTPSPort: ports[2], Global: "metrics",
		Sites: []mcptest.Site{{Port: ports[3], Body: "\tbind 127.0.0.1\n" + mcptest.ResumeRoute(upstream, store+"\nmax_sessions 20000")}}}
	if p, err = mcptest.StartProcess(caddyBin, home, cfg); err != nil {
		return nil, "", "", err
	}
	return p, fmt.Sprintf("http://127.0.0.1:%d", ports[3]), fmt.Sprintf("http://127.0.0.1:%d", ports[0]), nil
}

// waitReady waits until the replica at base answers an initialize.
func waitReady(base string) error {
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		c := mcptest.NewClient(base, "2025-06-18", nil)
		if err := c.Initialize(context.Background()); err == nil {
			c.Delete(context.Background())
			return nil
		} else if time.Now().After(deadline) {
			return fmt.Errorf("replica at %s not ready: %v", base, err)
		}
	}
}

// cpuOf is each process's user+system CPU time (10 ms steps).
func cpuOf(pids []int) []time.Duration {
	out := make([]time.Duration, len(pids))
	for i, pid := range pids {
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:])); len(f) > 12 {
			u, _ := strconv.ParseInt(f[11], 10, 64)
			s, _ := strconv.ParseInt(f[12], 10, 64)
			out[i] = time.Duration(u+s) * time.Second / 100
		}
	}
	return out
}

// sample is one run: per process (A, idle replicas, nats-server), its CPU
// per call in µs with its idle rate taken off; and calls/s.
type sample struct {
	perCall []float64
	rate    float64
}

var hc = &http.Client{Transport: &http.Transport{MaxIdleConns: 1024, MaxIdleConnsPerHost: 512, IdleConnTimeout: time.Minute}}

const version = "2025-06-18"

// shortCall makes call number id of a session: each its own id, since the
// same id and body again is a repeated request, answered from the first
// call's retained stream without asking the upstream.
func shortCall(ctx context.Context, c *mcptest.Client, id int) error {
	resp, err := c.Call(ctx, id, "stream", mcptest.StreamArgs{N: 1, Size: 160}, "p")
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	evs, err := mcptest.ReadEvents(resp.Body, 2, 30*time.Second)
	if err == nil && len(evs) != 2 {
		err = fmt.Errorf("got %d events, want a progress notification and the result", len(evs))
	}
	return err
}

// measure runs work (n calls or sessions) and reads every process's CPU
// around it, settle included, idle rates (cores) taken off.
func measure(cl *cluster, c config, idle []float64, n int, work func() error) (sample, error) {
	pids := cl.pids()
	c0, t0 := cpuOf(pids), time.Now()
	if err := work(); err != nil {
		return sample{}, err
	}
	elapsed := time.Since(t0)
	time.Sleep(c.settle)
	c1, span := cpuOf(pids), time.Since(t0)
	s := sample{rate: float64(n) / elapsed.Seconds()}
	for i := range pids {
		used := (c1[i] - c0[i]).Seconds() - idle[i]*span.Seconds()
		s.perCall = append(s.perCall, max(used, 0)*1e6/float64(n))
	}
	return s, nil
}

func calls(ctx context.Context, cl *cluster, c config) func() error {
	return func() error {
		cs := make([]*mcptest.Client, c.sessions)
		if err := mcptest.Parallel(c.sessions, c.sessions, func(i int) error {
			cs[i] = mcptest.NewClient(cl.bases[0], version, hc)
			return cs[i].Initialize(ctx)
		}); err != nil {
			return err
		}
		defer mcptest.Parallel(c.sessions, c.sessions, func(i int) error { return cs[i].Delete(ctx) })
		per := max(c.calls/c.sessions, 1)
		return mcptest.Parallel(c.sessions, c.sessions, func(i int) error {
			for j := range per {
				if err := shortCall(ctx, cs[i], j+1); err != nil {
					return err
				}
			}
			return nil
		})
	}
}

func churn(ctx context.Context, cl *cluster, c config) func() error {
	return func() error {
		per := max(c.churn/c.sessions, 1)
		return mcptest.Parallel(c.sessions, c.sessions, func(i int) error {
			for range per {
				s := mcptest.NewClient(cl.bases[0], version, hc)
				if err := s.Initialize(ctx); err != nil {
					return err
				}
				if err := shortCall(ctx, s, 1); err != nil {
					return err
				}
				if err := s.Delete(ctx); err != nil {
					return err
				}
			}
			return nil
		})
	}
}

type figure struct {
	workload string
	n        int
}

func run(c config) error {
	dir, err := os.MkdirTemp("", "mcp-resume-scale-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	logf("building nats-server and Caddy")
	natsBin, caddyBin, err := bins(dir)
	if err != nil {
		return err
	}
	up := &mcptest.Upstream{Version: version, FlushEach: true}
	ln, err := mcptest.Listen(0)
	if err != nil {
		return err
	}
	go (&http.Server{Handler: up, ReadHeaderTimeout: 10 * time.Second}).Serve(ln)
	upstream := ln.Addr().String()
	results := map[figure][]sample{}
	ctx := context.Background()
	for round := 0; round < c.rounds; round++ {
		order := slices.Clone(c.replicas)
		if round%2 == 1 {
			slices.Reverse(order)
		}
		for _, n := range order {
			pad := 0
			if c.bystanders {
				pad = slices.Max(c.replicas) - n
			}
			cl, err := start(dir, natsBin, caddyBin, upstream, n, pad, c.sweeperIdle)
			if err != nil {
				return err
			}
			// Warm up (connections, JIT of the store's buckets), then the idle rates.
			if err := calls(ctx, cl, config{sessions: c.sessions, calls: 4 * c.sessions})(); err != nil {
				cl.stop()
				return err
			}
			time.Sleep(c.settle)
			pids := cl.pids()
			i0, t0 := cpuOf(pids), time.Now()
			time.Sleep(c.idle)
			i1, span := cpuOf(pids), time.Since(t0)
			idle := make([]float64, len(pids))
			for i := range pids {
				idle[i] = (i1[i] - i0[i]).Seconds() / span.Seconds()
			}
			for _, w := range []struct {
				name string
				n    int
				work func() error
			}{{"short calls", c.calls, calls(ctx, cl, c)}, {"session churn", c.churn, churn(ctx, cl, c)}} {
				work := w.work
				if c.idleProfile != "" && n > 1 && w.name == "short calls" {
					work = profiled(cl.admins[1], c.idleProfile, work)
				}
				s, err := measure(cl, c, idle, w.n, work)
				if err != nil {
					cl.stop()
					return fmt.Errorf("%s, %d replicas: %v", w.name, n, err)
				}
				results[figure{w.name, n}] = append(results[figure{w.name, n}], s)
				logf("%-13s %d replica(s): %6.0f /s; CPU per call, µs: A %.0f, idle replicas %v, nats-server %.0f (idle rates %v cores)",
					w.name, n, s.rate, s.perCall[0], roundAll(s.perCall[1:n]), s.perCall[n], roundAll(idle))
			}
			cl.stop()
		}
	}
	fmt.Print(report(c, results))
	return nil
}

// profiled runs work while replica admin's CPU profile is taken (Caddy's
// /debug/pprof), and writes the profile to file.
func profiled(admin, file string, work func() error) func() error {
	return func() error {
		done := make(chan error, 1)
		go func() {
			resp, err := http.Get(admin + "/debug/pprof/profile?seconds=2")
			if err != nil {
				done <- err
				return
			}
			defer resp.Body.Close()
			b, err := io.ReadAll(resp.Body)
			if err == nil {
				err = os.WriteFile(file, b, 0o644)
			}
			done <- err
		}()
		err := work()
		if perr := <-done; err == nil && perr != nil {
			return fmt.Errorf("idle profile: %v", perr)
		}
		return err
	}
}

func roundAll(xs []float64) []float64 {
	out := make([]float64, len(xs))
	for i, x := range xs {
		out[i] = float64(int(x*100+0.5)) / 100
	}
	return out
}

func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Sorted(slices.Values(xs))
	return (s[(len(s)-1)/2] + s[len(s)/2]) / 2
}

func report(c config, results map[figure][]sample) string {
	var b strings.Builder
	rev, _ := exec.Command("git", "rev-parse", "--short", "HEAD").Output()
	fmt.Fprintf(&b, "## Scale-out: CPU per call by replica count\n\n- `go run ./cmd/mcp-resume-scale %s` at %s\n", strings.Join(os.Args[1:], " "), bytes.TrimSpace(rev))
	fmt.Fprintf(&b, "- One nats-server (`-js`, file storage) and N Caddy replicas with `store nats`, separate processes; %d MCP sessions (or churn workers) against replica A only; a short call is one 160 B progress notification and the result. CPU from /proc per process, during the run and %v after, each process's idle rate (measured %v before) taken off. Medians of %d round(s).\n", c.sessions, c.settle, c.idle, c.rounds)
	sweeper := "replica A, started first, holds the sweeper lease"
	if c.sweeperIdle {
		sweeper = "an idle replica, started first, holds the sweeper lease (the busiest idle replica)"
	}
	fmt.Fprintf(&b, "- The zone's sweeper: %s.\n", sweeper)
	if c.bystanders {
		fmt.Fprintf(&b, "- Every run has %d Caddy processes: the replicas, and idle ones on the memory store (not measured) for the rest.\n", slices.Max(c.replicas))
	}
	b.WriteString("\n")
	b.WriteString("| workload | replicas | calls/s | serving replica, CPU per call | busiest idle replica, per call served by A (of serving) | each other idle replica (of serving) | nats-server, per call | cluster, per call | cluster / cluster at 1 |\n| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n")
	for _, w := range []string{"short calls", "session churn"} {
		var cluster1 float64
		for _, n := range slices.Sorted(slices.Values(c.replicas)) {
			ss := results[figure{w, n}]
			if len(ss) == 0 {
				continue
			}
			pick := func(f func(sample) float64) float64 {
				var v []float64
				for _, s := range ss {
					v = append(v, f(s))
				}
				return median(v)
			}
			serving := pick(func(s sample) float64 { return s.perCall[0] })
			// The busiest idle replica is the sweeper, if one of them
			// sweeps (it watches the zone's records whole); the others'
			// mean is what a replica that only serves costs.
			busiest := pick(func(s sample) float64 {
				if n == 1 {
					return 0
				}
				return slices.Max(s.perCall[1:n])
			})
			others := pick(func(s sample) float64 {
				if n <= 2 {
					return 0
				}
				var sum float64
				for _, x := range s.perCall[1:n] {
					sum += x
				}
				return (sum - slices.Max(s.perCall[1:n])) / float64(n-2)
			})
			natsCPU := pick(func(s sample) float64 { return s.perCall[n] })
			total := pick(func(s sample) float64 {
				var sum float64
				for _, x := range s.perCall {
					sum += x
				}
				return sum
			})
			if n == 1 {
				cluster1 = total
			}
			cell := func(v float64, ok bool) string {
				if !ok {
					return "—"
				}
				return fmt.Sprintf("%.0f µs (%.1f%%)", v, 100*v/serving)
			}
			ratioCell := "—"
			if cluster1 > 0 {
				ratioCell = fmt.Sprintf("%.2fx", total/cluster1)
			}
			fmt.Fprintf(&b, "| %s | %d | %.0f | %.0f µs | %s | %s | %.0f µs | %.0f µs | %s |\n", w, n, pick(func(s sample) float64 { return s.rate }),
				serving, cell(busiest, n > 1), cell(others, n > 2), natsCPU, total, ratioCell)
		}
	}
	b.WriteString("\nTargets (issue 24): an idle replica ≤ 2% of the serving replica's CPU per call; the cluster's CPU per call at 3 replicas ≤ 1.05x that at 1.\n")
	return b.String()
}
