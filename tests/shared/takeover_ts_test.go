package shared

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/internal/mcptest"
	"github.com/mcpresume/caddy-mcp-resume/internal/testnet"
	"github.com/mcpresume/caddy-mcp-resume/tests/harness"
)

// The official TypeScript SDK on both ends, from tests/ts: server.mjs
// (StreamableHTTPServerTransport with its InMemoryEventStore) and
// client.mjs (which resumes by itself, and reports what it got).
var tsDir = filepath.Join("..", "ts")

var (
	tsOnce sync.Once
	tsSkip string
	tsErr  error
)

// tsReady installs the pinned TypeScript SDK (npm ci, from tests/ts's
// package-lock.json) if tests/ts has no node_modules yet.
func tsReady(t *testing.T) {
	t.Helper()
	tsOnce.Do(func() { tsSkip, tsErr = harness.TypeScriptSDK(tsDir) })
	if tsSkip != "" {
		t.Skipf("requires Node.js and npm (%s)", tsSkip)
	}
	if tsErr != nil {
		t.Fatal(tsErr)
	}
}

// startTSServer runs server.mjs and returns its host:port.
func startTSServer(t *testing.T) string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, "node", "server.mjs", "0")
	cmd.Dir = tsDir
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cancel()
		cmd.Wait()
		if s := strings.TrimSpace(stderr.String()); s != "" {
			t.Logf("server.mjs stderr: %s", s)
		}
	})
	port := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if p, ok := strings.CutPrefix(sc.Text(), "listening "); ok {
				port <- p
			}
		}
	}()
	select {
	case p := <-port:
		return "127.0.0.1:" + p
	case <-time.After(30 * time.Second):
		t.Fatalf("server.mjs did not start: %s", stderr.String())
		return ""
	}
}

// tsReport is what client.mjs prints (the fields this test reads).
type tsReport struct {
	NegotiatedVersion string    `json:"negotiatedVersion"`
	Progress          []float64 `json:"progress"`
	Result            string    `json:"result"`
	Error             string    `json:"error"`
	Requests          []struct {
		Method      string `json:"method"`
		LastEventID string `json:"lastEventId"`
		Status      int    `json:"status"`
	} `json:"requests"`
	TransportErrors []string `json:"transportErrors"`
	line            string   // the line it printed
}

// The TypeScript SDK client calls the TypeScript SDK server's count tool
// through replica A; A is SIGKILLed mid call, with the client connected to
// it, or after the load balancer cut the client's connections and it
// resumed (GET with Last-Event-ID) on B while A still read the call.
// Either way B takes the upstream read over: every progress notification
// once, and the result.
func TestTakeoverWithTheTypeScriptSDK(t *testing.T) {
	t.Parallel()
	tsReady(t)
	for _, tc := range []struct {
		name string
		// kill moves the load balancer to B and kills A, at a moment of the call.
		kill func(t *testing.T, lb *mcptest.Relay, a, b *replica)
	}{
		{"connected to the killed replica", func(t *testing.T, lb *mcptest.Relay, a, b *replica) {
			waitProduced(t, a, 6)  // priming and five progress notifications
			lb.SetTarget(b.addr()) // the client's reconnect goes to B
			a.Kill()
		}},
		{"cut before the kill", func(t *testing.T, lb *mcptest.Relay, a, b *replica) {
			waitProduced(t, a, 6)
			lb.SetTarget(b.addr())
			if lb.Cut(false) == 0 { // every connection of the client: it resumes on B
				t.Error("the load balancer cut no connection")
			}
			harness.WaitFor(t, 20*time.Second, "the client to read the call on B", func() bool {
				ss, err := mcptest.Sessions(b.admin())
				if err != nil {
					return false
				}
				for _, st := range requestStreams(ss) {
					if st.Connected {
						return true
					}
				}
				return false
			})
			a.Kill()
		}},
	} {
		t.Run(tc.name, func(t *testing.T) { testTakeoverWithTheTypeScriptSDK(t, tc.kill) })
	}
}

func testTakeoverWithTheTypeScriptSDK(t *testing.T, kill func(t *testing.T, lb *mcptest.Relay, a, b *replica)) {
	ns := testnet.NATS(t)
	d := &deployment{t: t, upstream: startTSServer(t)}
	store := storeNATS(natsURLs(ns), "")
	a, b := d.start("r1", store, true), d.start("r2", store, true)
	lb, err := mcptest.NewRelay(a.addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lb.Close() })

	const n = 20
	done := make(chan tsReport, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
		defer cancel()
		cmd := exec.CommandContext(ctx, "node", "client.mjs", "http://"+lb.Addr()+"/mcp",
			fmt.Sprintf("--n=%d", n), "--interval-ms=200", "--cut-after=0", "--timeout-ms=60000")
		cmd.Dir = tsDir
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		var r tsReport
		line := strings.TrimSpace(stdout.String())
		if i := strings.LastIndexByte(line, '\n'); i >= 0 {
			line = line[i+1:]
		}
		if jerr := json.Unmarshal([]byte(line), &r); err != nil || jerr != nil {
			r.Error = fmt.Sprintf("client.mjs: %v %v\nstdout: %s\nstderr: %s", err, jerr, stdout.String(), stderr.String())
		}
		r.line = line
		done <- r
	}()
	kill(t, lb, a, b)
	r := <-done
	t.Logf("client.mjs: %s", r.line)
	if r.Error != "" {
		t.Fatalf("the call failed: %s (transport errors %q)", r.Error, r.TransportErrors)
	}
	if r.Result != fmt.Sprintf("counted to %d", n) {
		t.Fatalf("result %q", r.Result)
	}
	if err := mcptest.OnceInOrder(r.Progress, n); err != nil {
		t.Fatal(err)
	}
	resumed := false
	for _, q := range r.Requests {
		resumed = resumed || q.Method == "GET" && q.LastEventID != "" && !strings.HasSuffix(q.LastEventID, "-0-0")
	}
	if !resumed {
		t.Errorf("the client never resumed its call: %+v", r.Requests)
	}
	takenOver(t, b, false)
	noEarlyEviction(t, b)
}
