package harness

import (
	"bytes"
	"cmp"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/mcpresume/caddy-mcp-resume/internal/mcptest"
)

// Main is the TestMain of every package that starts Caddy: it runs the
// tests with Caddy's home, config and data directories in a temporary
// directory (so no test reads or writes the user's), removes that, and exits
// with the tests' code.
func Main(m *testing.M) {
	cleanup, err := mcptest.Isolate()
	if err != nil {
		panic(err)
	}
	code := m.Run()
	cleanup()
	os.Exit(code)
}

const (
	// storeEnv selects the store the suite runs against: "" (memory) or
	// "nats".
	storeEnv = "MCPR_TEST_STORE"
	// childEnv marks a process MainBothStores started: it runs the tests
	// its flags name, and starts no other.
	childEnv = "MCPR_TEST_CHILD"
)

// Shards says how MainBothStores (or MainSharded) splits a suite: into N
// processes per store, the tests dealt out by how long they take. Seconds
// holds a rough figure for a suite's long tests (the rest count 2 s each):
// each goes, longest first, to the shard with least so far. A figure that
// is off makes the shards uneven, nothing worse.
type Shards struct {
	N       int
	Seconds map[string]float64
}

// MainBothStores is Main for suites whose guarantees both stores must keep:
// it runs the tests with the memory store and, at the same time in child
// processes (same flags), with every mcp_resume block given the JetStream
// store, embedded, in a directory of its own per Caddy started.
//
// Caddy runs in-process, one per process, so tests overlap only as
// processes: each store's leg is split into s.N processes, all running at
// once, each with its own ports (see CaddyPort) and directories. These
// suites mostly wait (resume windows, stall and idle timeouts, reconnect
// backoffs), so the shards wait side by side; what a test measures of the
// process (heap, CPU) is its own process's. With -run, -skip or -list the
// legs are not split. The children's output follows the parent's, leg by
// leg, shard by shard.
func MainBothStores(m *testing.M, s Shards) { mainLegs(m, []string{"", "nats"}, s) }

// MainSharded is Main split into s.N processes side by side, for a suite
// that runs with the memory store only.
func MainSharded(m *testing.M, s Shards) { mainLegs(m, []string{""}, s) }

func mainLegs(m *testing.M, legs []string, s Shards) {
	if os.Getenv(storeEnv) == "nats" {
		mcptest.StoreBlock = "store nats {\n embedded {env." + storeDirEnv + "}\n}"
	}
	if os.Getenv(childEnv) != "" {
		Main(m)
	}
	flag.Parse()
	groups := []string{""} // "": every test (or what -run selects)
	if s.N > 1 && !flagSet("test.run") && !flagSet("test.list") && !flagSet("test.skip") {
		names, err := listTests()
		if err != nil {
			fmt.Fprintln(os.Stderr, "listing the tests to shard them:", err)
			os.Exit(1)
		}
		groups = s.split(names)
	}
	cleanup, err := mcptest.Isolate()
	if err != nil {
		panic(err)
	}
	type child struct {
		what string
		cmd  *exec.Cmd
		out  bytes.Buffer
		err  error
	}
	var children []*child
	for _, leg := range legs {
		for i, run := range groups {
			if leg == "" && i == 0 {
				continue // this process's own
			}
			c := &child{what: legName(leg, len(legs), i, len(groups))}
			c.cmd = exec.Command(os.Args[0], runArgs(run)...)
			c.cmd.Env = append(os.Environ(), childEnv+"=1", storeEnv+"="+leg)
			c.cmd.Stdout, c.cmd.Stderr = &c.out, &c.out
			c.err = c.cmd.Start()
			children = append(children, c)
		}
	}
	if groups[0] != "" {
		flag.Set("test.run", groups[0])
	}
	code := m.Run()
	cleanup()
	for _, c := range children {
		if c.err == nil {
			c.err = c.cmd.Wait()
		}
		fmt.Fprintf(os.Stderr, "--- %s\n", c.what)
		os.Stdout.Write(c.out.Bytes())
		if c.err != nil {
			fmt.Fprintf(os.Stderr, "%s failed: %v\n", c.what, c.err)
			code = 1
		}
	}
	os.Exit(code)
}

// legName says which tests a child runs, in the line before its output.
func legName(leg string, legs, i, n int) string {
	s := "the same tests with the JetStream store (store nats { embedded })"
	switch {
	case leg == "" && legs > 1:
		s = "the memory store's leg"
	case leg == "":
		s = "the suite"
	}
	if n > 1 {
		s += fmt.Sprintf(", shard %d of %d", i+1, n)
	}
	return s
}

// runArgs is this process's arguments for a child that runs the tests run
// matches ("": those this process's flags select).
// A child never gets -test.testlogfile: go test keys its cache of the
// result on what the parent's log records this process read, and a child
// writing the same log would replace it.
func runArgs(run string) []string {
	var args []string
	for _, a := range os.Args[1:] {
		if !strings.HasPrefix(a, "-test.testlogfile") {
			args = append(args, a)
		}
	}
	if run != "" {
		args = append(args, "-test.run="+run)
	}
	return args
}

func flagSet(name string) bool {
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

// listTests returns the package's top-level tests (and fuzz targets and
// examples, which -test.run also matches), in source order, as -test.list
// prints them.
func listTests() ([]string, error) {
	cmd := exec.Command(os.Args[0], "-test.list=.")
	cmd.Env = append(os.Environ(), childEnv+"=1")
	out, err := cmd.Output()
	if err != nil {
		return nil, err
	}
	var names []string
	for _, l := range strings.Split(string(out), "\n") {
		if l = strings.TrimSpace(l); l != "" && !strings.ContainsAny(l, " \t") {
			names = append(names, l)
		}
	}
	if len(names) == 0 {
		return nil, fmt.Errorf("no tests listed: %q", out)
	}
	return names, nil
}

// split deals names out to s.N shards, longest first, each to the shard
// with the fewest seconds so far, and returns each shard's -test.run
// pattern (its tests in source order); fewer than s.N when there are fewer
// tests.
func (s Shards) split(names []string) []string {
	n := min(s.N, len(names))
	secs := func(name string) float64 {
		if d, ok := s.Seconds[name]; ok {
			return d
		}
		return 2
	}
	order := slices.Clone(names)
	slices.SortStableFunc(order, func(a, b string) int { return cmp.Compare(secs(b), secs(a)) })
	load := make([]float64, n)
	of := make(map[string]int, len(names))
	for _, name := range order {
		i := slices.Index(load, slices.Min(load))
		of[name] = i
		load[i] += secs(name)
	}
	groups := make([][]string, n)
	for _, name := range names {
		groups[of[name]] = append(groups[of[name]], regexp.QuoteMeta(name))
	}
	runs := make([]string, n)
	for i, g := range groups {
		runs[i] = "^(" + strings.Join(g, "|") + ")$"
	}
	return runs
}
