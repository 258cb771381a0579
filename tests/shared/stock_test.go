package shared

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/internal/demoserver"
	"github.com/mcpresume/caddy-mcp-resume/internal/mcptest"
	"github.com/mcpresume/caddy-mcp-resume/tests/harness"
)

var (
	natsBinOnce sync.Once
	natsBin     string
	natsBinErr  error
)

// natsServerBin builds nats-server (the version go.mod names, from the
// module cache) once per run.
func natsServerBin(t *testing.T) string {
	t.Helper()
	natsBinOnce.Do(func() {
		natsBin = filepath.Join(binDir, "nats-server")
		cmd := exec.Command("go", "build", "-o", natsBin, "github.com/nats-io/nats-server/v2")
		if out, err := cmd.CombinedOutput(); err != nil {
			natsBinErr = fmt.Errorf("go build nats-server: %v\n%s", err, out)
		}
	})
	if natsBinErr != nil {
		t.Fatal(natsBinErr)
	}
	return natsBin
}

// natsProcess is nats-server running as a child process, as an operator
// runs it: no options but its port, JetStream and its store directory.
type natsProcess struct {
	t    *testing.T
	port int
	dir  string
	conf string // a configuration file, if the server runs with one
	cmd  *exec.Cmd
	done chan struct{}
	logs strings.Builder
	mu   sync.Mutex
}

func (n *natsProcess) url() string { return fmt.Sprintf("nats://127.0.0.1:%d", n.port) }

// startNATSProcess starts nats-server -p <free port> -js -sd <dir>.
func startNATSProcess(t *testing.T) *natsProcess {
	t.Helper()
	return runNATSProcess(t, &natsProcess{t: t, port: harness.FreePort(t), dir: t.TempDir()})
}

// runNATSProcess starts n until t ends, and logs its output if t failed.
func runNATSProcess(t *testing.T, n *natsProcess) *natsProcess {
	t.Helper()
	n.start()
	t.Cleanup(func() {
		n.stop()
		if t.Failed() {
			n.mu.Lock()
			t.Logf("nats-server logs:\n%s", n.logs.String())
			n.mu.Unlock()
		}
	})
	return n
}

func (n *natsProcess) Write(b []byte) (int, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.logs.Write(b)
}

func (n *natsProcess) start() {
	t := n.t
	t.Helper()
	args := []string{"-p", fmt.Sprint(n.port), "-js", "-sd", n.dir}
	if n.conf != "" {
		args = append(args, "-c", n.conf)
	}
	n.cmd = exec.Command(natsServerBin(t), args...)
	n.cmd.Stdout, n.cmd.Stderr = n, n
	if err := n.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	n.done = make(chan struct{})
	go func(cmd *exec.Cmd, done chan struct{}) { cmd.Wait(); close(done) }(n.cmd, n.done)
	harness.WaitFor(t, 20*time.Second, "nats-server listening", func() bool {
		c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", n.port), 200*time.Millisecond)
		if err == nil {
			c.Close()
		}
		return err == nil
	})
}

// startNATSProcessWith starts nats-server with the configuration conf
// (port, JetStream and store directory come from the command line).
func startNATSProcessWith(t *testing.T, conf string) *natsProcess {
	t.Helper()
	n := &natsProcess{t: t, port: harness.FreePort(t), dir: t.TempDir(), conf: filepath.Join(t.TempDir(), "nats.conf")}
	if err := os.WriteFile(n.conf, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	return runNATSProcess(t, n)
}

// reload rewrites the server's configuration and has it reload (SIGHUP),
// waiting until it says it did.
func (n *natsProcess) reload(conf string) {
	t := n.t
	t.Helper()
	if err := os.WriteFile(n.conf, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	n.mu.Lock()
	before := strings.Count(n.logs.String(), "Reloaded server configuration")
	n.mu.Unlock()
	if err := n.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	harness.WaitFor(t, 10*time.Second, "nats-server reloaded", func() bool {
		n.mu.Lock()
		defer n.mu.Unlock()
		return strings.Count(n.logs.String(), "Reloaded server configuration") > before
	})
}

// stop kills the server (if it runs) and waits for it to exit.
func (n *natsProcess) stop() {
	select {
	case <-n.done:
		return
	default:
	}
	n.cmd.Process.Kill()
	<-n.done
}

// readmeStoreBlock is the README's store block for one NATS server
// (section "A shared store"), verbatim but for the port.
func readmeStoreBlock(port int) string {
	return fmt.Sprintf("store nats {\n\turl nats://127.0.0.1:%d\n}", port)
}

// The README's store block against nats-server with its default options
// (max_payload 1 MiB) works with the default max_event_bytes (8 MiB): two
// replicas connect, and a tool result of 4 MiB, one event four times a NATS
// message, is stored by one replica and resumed, whole, on the other.
func TestStockNATSServerAndLargeEvent(t *testing.T) {
	t.Parallel()
	ns := startNATSProcess(t)
	d := deploy(t, 2, readmeStoreBlock(ns.port), demoserver.Options{})
	a, b := d.replicas[0], d.replicas[1]
	const size = 4 << 20
	want := demoserver.BigText(size)

	// The call on A; the client reads only the priming event, then goes.
	ca := harness.NewSession(t, "http://"+a.addr(), "2025-11-25")
	resp := ca.Call(2, "big", map[string]any{"bytes": size})
	if resp.StatusCode != 200 || mcptest.MediaType(resp.Header) != "text/event-stream" {
		t.Fatalf("call on A: %d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	prime := harness.ReadEvents(t, resp, 1)
	resp.Body.Close()
	if prime[0].ID == "" {
		t.Fatalf("no priming event ID: %+v", prime[0])
	}
	// The result is stored (on A's stream) before B is asked.
	harness.WaitFor(t, 20*time.Second, "the result stored", func() bool {
		ss, err := mcptest.Sessions(a.admin())
		if err != nil || len(ss) != 1 {
			return false
		}
		return ss[0].Bytes > size
	})

	// B resumes it: the same session, Last-Event-ID the priming event.
	cb := harness.NewRawClient(t, "http://"+b.addr(), "2025-11-25")
	cb.SessionID = ca.SessionID
	began := time.Now()
	resp = cb.Resume(prime[0].ID)
	if resp.StatusCode != 200 {
		t.Fatalf("resume on B: %d", resp.StatusCode)
	}
	evs := harness.ReadEvents(t, resp, 0)
	took := time.Since(began)
	resp.Body.Close()
	result := resultOf(t, evs, "2")
	if result != want {
		t.Fatalf("result resumed on B: %d bytes, want %d (the same)", len(result), len(want))
	}
	t.Logf("a %d-byte event resumed on the other replica in %s", size, took)
	// And a call on B passes a large result straight through the store.
	evs = cb.CallToEnd(3, "big", map[string]any{"bytes": size + 1})
	if got := resultOf(t, evs, "3"); got != demoserver.BigText(size+1) {
		t.Fatalf("call on B: a result of %d bytes, want %d", len(got), size+1)
	}
	for _, r := range d.replicas {
		if v := metric(t, r, "caddy_mcp_resume_events_evicted_before_ack_total"); v != 0 {
			t.Fatalf("replica %s: events_evicted_before_ack_total %v", r.name, v)
		}
	}
}

// resultOf is the text of the result for request id among evs ("" if
// none); a JSON-RPC error fails the test.
func resultOf(t *testing.T, evs []mcptest.Event, id string) string {
	t.Helper()
	for _, ev := range evs {
		if ev.Data == "" {
			continue
		}
		m, err := mcptest.DecodeMessage(ev.Data)
		if err != nil {
			t.Fatalf("event %s: %v", ev.ID, err)
		}
		if m.Error != nil {
			t.Fatalf("event %s: error %+v", ev.ID, m.Error)
		}
		if string(m.ID) == id && len(m.Result) > 0 {
			var r struct {
				Content []struct{ Text string } `json:"content"`
			}
			if err := json.Unmarshal(m.Result, &r); err != nil || len(r.Content) != 1 {
				t.Fatalf("result: %v", err)
			}
			return r.Content[0].Text
		}
	}
	return ""
}

// restartEmpty kills the server and starts it again on the same port with
// an empty store directory: a container without a persistent volume.
func (n *natsProcess) restartEmpty() {
	n.stop()
	if err := os.RemoveAll(n.dir); err != nil {
		n.t.Fatal(err)
	}
	if err := os.MkdirAll(n.dir, 0o700); err != nil {
		n.t.Fatal(err)
	}
	n.start()
}

// NATS restarted with an empty store directory while a call runs: both
// replicas notice, recreate the zone's stream, buckets and secret, say so
// (an ERROR line, store_data_lost_total), and serve again (store_up 1,
// initialize and calls work); the running call's response ends, and its
// resume, on the other replica, gets the gap and a JSON-RPC error for the
// call: never a 400 or a response held in silence.
func TestNATSBackWithoutItsData(t *testing.T) {
	t.Parallel()
	ns := startNATSProcess(t)
	d := deploy(t, 2, storeNATS([]string{ns.url()}, ""), demoserver.Options{})
	a, b := d.replicas[0], d.replicas[1]

	ca := harness.NewSession(t, "http://"+a.addr(), "2025-11-25")
	resp := ca.Call(2, "count", map[string]any{"n": 100, "interval_ms": 100})
	if resp.StatusCode != 200 {
		t.Fatalf("call: %d", resp.StatusCode)
	}
	evs := harness.ReadEvents(t, resp, 3) // the priming event and two notifications
	lastID := evs[len(evs)-1].ID

	ns.restartEmpty()
	for _, r := range d.replicas {
		harness.WaitFor(t, 30*time.Second, "replica "+r.name+" to count the lost data", func() bool {
			m, err := mcptest.ScrapeMetrics(r.admin() + "/metrics")
			if err != nil {
				return false
			}
			v, _ := m.Sum("caddy_mcp_resume_store_data_lost_total")
			return v >= 1
		})
		r.waitStoreUp(t, 1)
		if !strings.Contains(r.Logs(), "shared store lost its data") {
			t.Fatalf("replica %s logged no loss", r.name)
		}
	}
	// The running call's response ends (its session ended with the data).
	rest, err := mcptest.ReadEvents(resp.Body, 0, 20*time.Second)
	resp.Body.Close()
	if err != nil {
		t.Fatalf("the running call's response did not end: %v (%d events)", err, len(rest))
	}
	for _, ev := range rest {
		if ev.ID != "" {
			lastID = ev.ID
		}
	}

	// Its resume on B: the gap, and an error for the call.
	cb := harness.NewRawClient(t, "http://"+b.addr(), "2025-11-25")
	cb.SessionID = ca.SessionID
	resp = cb.Resume(lastID)
	if resp.StatusCode != 200 {
		t.Fatalf("resume of the lost stream: %d, want 200 with the gap", resp.StatusCode)
	}
	evs, err = mcptest.ReadEvents(resp.Body, 0, 20*time.Second)
	resp.Body.Close()
	if err != nil {
		t.Fatalf("the resume did not end: %v (%d events)", err, len(evs))
	}
	failed := false
	for _, ev := range evs {
		if m, err := mcptest.DecodeMessage(ev.Data); err == nil && string(m.ID) == "2" && m.Error != nil {
			failed = true
		}
	}
	if !failed {
		t.Fatalf("the resume got no JSON-RPC error for the call: %+v", evs)
	}

	// New sessions and calls work on both replicas.
	for _, r := range d.replicas {
		c := harness.NewSession(t, "http://"+r.addr(), "2025-11-25")
		evs := c.CallToEnd(1, "count", map[string]any{"n": 3, "interval_ms": 10})
		if len(evs) == 0 || !strings.Contains(evs[len(evs)-1].Data, "counted to 3") {
			t.Fatalf("replica %s: a call after the loss: %+v", r.name, evs)
		}
	}
}
