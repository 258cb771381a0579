// Package ts proves the mission with the official TypeScript SDK client
// (@modelcontextprotocol/sdk, pinned in package.json): a tool call streaming
// progress through mcp_resume has its connection cut mid-stream, and the
// client still gets every progress notification exactly once, in order, and
// the result, with nothing but the SDK's own reconnection logic.
//
// client.mjs drives the SDK; these tests start the demo server and Caddy,
// run the script with node and check what it reports. The script and the
// SDK's node_modules live next to this file; if node_modules is missing the
// tests run `npm ci` first, so `go test ./...` works on a fresh checkout.
//
// What SDK 1.32.2 does (dist/esm/client/streamableHttp.js):
//   - Every request goes through the transport's `fetch` option (POSTs
//     through fetchWithinOrigin(fetch), GETs directly), with the signal of
//     the transport's own AbortController.
//   - _handleSseStream(body, opts, isReconnectable) reads an SSE body. The
//     standalone GET stream is reconnectable; a POST response stream is only
//     if it saw an event with an ID ("priming", though any ID counts) and has
//     not yet seen the response. When the body ends or its reader throws (a
//     cut), such a stream is resumed by _scheduleReconnection: after
//     initialReconnectionDelay (or the server's `retry:`), a GET with
//     Last-Event-ID set to the last ID seen; failures retry with backoff up to
//     maxRetries. The resumed GET is read the same way.
//   - Against an upstream without an event store (no IDs on the POST stream)
//     a cut POST stream is not resumed: the call hangs until its timeout.
//     Through mcp_resume every event has an ID, so it is resumed on every
//     protocol version, with or without a priming event.
//   - The SDK always offers LATEST_PROTOCOL_VERSION (2025-11-25) in
//     initialize, with no option to offer another; client.mjs
//     --offer-version rewrites the offer, as an older SDK would send it.
package ts

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/internal/demoserver"
	"github.com/mcpresume/caddy-mcp-resume/internal/mcptest"
	"github.com/mcpresume/caddy-mcp-resume/tests/harness"
)

// The suite waits on Node processes and token lifetimes: it runs in two
// processes side by side, TestOAuthRotation (six rotations of 7 s) in one.
func TestMain(m *testing.M) {
	// Installed here, before the shards start: two at once would each run
	// npm ci into the same node_modules.
	setupOnce.Do(setupNode)
	harness.MainSharded(m, harness.Shards{N: 2, Seconds: map[string]float64{
		"TestOAuthRotation":                          44,
		"TestFollowsATypeScriptUpstreamThatPolls":    11,
		"TestToolCallSurvivesConnectionCut":          9,
		"TestToolCallWithoutProxyIsLost":             5,
		"TestOAuthSDKResumeAfter401DropsLastEventID": 4,
	}})
}

const (
	n        = 12
	interval = 150 // ms
	cutAfter = 4
)

// report is what client.mjs prints.
type report struct {
	SDKVersion        string    `json:"sdkVersion"`
	OfferedVersion    string    `json:"offeredVersion"`
	NegotiatedVersion string    `json:"negotiatedVersion"`
	Progress          []float64 `json:"progress"`
	Result            string    `json:"result"`
	Error             string    `json:"error"`
	Cut               struct {
		Done          bool `json:"done"`
		AfterProgress int  `json:"afterProgress"`
		Aborted       int  `json:"aborted"`
		SocketsClosed int  `json:"socketsClosed"`
	} `json:"cut"`
	Requests []struct {
		Method      string `json:"method"`
		RPC         string `json:"rpc"`
		LastEventID string `json:"lastEventId"`
		Status      int    `json:"status"`
		ContentType string `json:"contentType"`
		Error       string `json:"error"`
	} `json:"requests"`
	TransportErrors []string `json:"transportErrors"`
}

var (
	setupOnce sync.Once
	setupErr  error
	setupSkip string
)

// nodeReady skips the test without node or npm and installs the pinned SDK
// (npm ci, from package-lock.json) if node_modules is missing.
func nodeReady(t *testing.T) {
	t.Helper()
	setupOnce.Do(setupNode)
	if setupSkip != "" {
		t.Skipf("requires Node.js and npm (%s)", setupSkip)
	}
	if setupErr != nil {
		t.Fatal(setupErr)
	}
}

// setupNode installs the SDK into node_modules unless it is there.
func setupNode() {
	setupSkip, setupErr = harness.TypeScriptSDK(".")
}

// runClient runs client.mjs against endpoint and returns its report.
func runClient(t *testing.T, endpoint string, args ...string) report {
	t.Helper()
	var r report
	runScript(t, 60*time.Second, &r, append([]string{"client.mjs", endpoint,
		fmt.Sprintf("--n=%d", n), fmt.Sprintf("--interval-ms=%d", interval), fmt.Sprintf("--cut-after=%d", cutAfter)}, args...)...)
	return r
}

// runScript runs node with argv (a script of this directory and its
// arguments) within timeout and decodes the last line it prints into
// report.
func runScript(t *testing.T, timeout time.Duration, report any, argv ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "node", argv...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("node %s: %v\nstdout: %s\nstderr: %s", strings.Join(argv, " "), err, stdout.String(), stderr.String())
	}
	line := strings.TrimSpace(stdout.String())
	if i := strings.LastIndexByte(line, '\n'); i >= 0 {
		line = line[i+1:]
	}
	if err := json.Unmarshal([]byte(line), report); err != nil {
		t.Fatalf("parsing %s output: %v\nstdout: %s\nstderr: %s", argv[0], err, stdout.String(), stderr.String())
	}
	t.Logf("%s: %s", argv[0], line)
	if s := strings.TrimSpace(stderr.String()); s != "" {
		t.Logf("%s stderr: %s", argv[0], s)
	}
}

// resumesFromLog returns the proxy's resumes_total for the outcomes
// "replayed" and "noop": resumes answered from its own log. The counters are
// process-wide, so tests compare values before and after.
func resumesFromLog(t *testing.T, c *harness.Caddy) [2]float64 {
	t.Helper()
	m, err := c.Metrics()
	if err != nil {
		t.Fatal(err)
	}
	return [2]float64{
		m.Series[`caddy_mcp_resume_resumes_total{outcome="replayed"}`],
		m.Series[`caddy_mcp_resume_resumes_total{outcome="noop"}`],
	}
}

// proxyID matches the proxy's event IDs, <epoch>-<stream>-<seq> (stream 0
// is the standalone stream); m[1] is seq.
var proxyID = regexp.MustCompile(`^[a-z2-7]{8}-(?:0|[1-9][0-9]*)-(0|[1-9][0-9]*)$`)

// The mission, with the TypeScript SDK client: the call's connection is cut
// after 4 of 12 progress notifications; the SDK resumes with Last-Event-ID
// and gets the rest, each once, and the result.
func TestToolCallSurvivesConnectionCut(t *testing.T) {
	nodeReady(t)
	for _, tc := range []struct {
		name, offer, want string
	}{
		{"default", "", "2025-11-25"}, // what SDK 1.32.2 offers and the demo server accepts
		{"2025-06-18", "2025-06-18", "2025-06-18"},
		{"2025-03-26", "2025-03-26", "2025-03-26"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			upstream := harness.StartDemo(t, demoserver.Options{})
			c := harness.StartCaddy(t, mcptest.ResumeRoute(upstream, ""))
			before := resumesFromLog(t, c)

			var args []string
			if tc.offer != "" {
				args = append(args, "--offer-version="+tc.offer)
			}
			r := runClient(t, c.Base()+"/mcp", args...)

			if r.NegotiatedVersion != tc.want {
				t.Errorf("negotiated %q, want %q", r.NegotiatedVersion, tc.want)
			}
			if r.Error != "" {
				t.Errorf("call failed through the proxy: %s (transport errors: %q)", r.Error, r.TransportErrors)
			}
			if want := fmt.Sprintf("counted to %d", n); r.Result != want {
				t.Errorf("result %q, want %q", r.Result, want)
			}
			assertOnceInOrder(t, r.Progress, n)

			// The cut happened, for real, mid-call.
			if !r.Cut.Done || r.Cut.AfterProgress != cutAfter {
				t.Errorf("cut %+v, want one after %d progress notifications", r.Cut, cutAfter)
			}
			if r.Cut.Aborted == 0 || r.Cut.SocketsClosed == 0 {
				t.Errorf("cut %+v: no open response was aborted or no socket closed", r.Cut)
			}
			// The SDK resumed the call's stream by itself: a GET with
			// Last-Event-ID <epoch>-<stream>-<seq> of the last progress event
			// it saw (seq 4, unless the 5th was already parsed when the cut
			// landed), answered 200 text/event-stream. On 2025-11-25 it also
			// resumes the standalone GET stream from its priming event (seq 0).
			resumedCall, resumes := false, 0
			for _, req := range r.Requests {
				m := proxyID.FindStringSubmatch(req.LastEventID)
				if req.Method != "GET" || m == nil {
					continue
				}
				if req.Status != 200 || !strings.HasPrefix(req.ContentType, "text/event-stream") {
					t.Errorf("resume from %s answered %d %q", req.LastEventID, req.Status, req.ContentType)
					continue
				}
				resumes++
				if seq, _ := strconv.Atoi(m[1]); seq >= cutAfter && seq < n {
					resumedCall = true
				}
			}
			if !resumedCall {
				t.Errorf("the call's stream was not resumed from its last event; requests: %+v", r.Requests)
			}
			// Every resume was answered from the proxy's log, not passed to
			// the upstream: "replayed" (the call's stream; event 5 is due
			// 150ms after the cut and the SDK comes back after 200ms) or
			// "noop" (nothing missed yet: the standalone stream, or a slow
			// upstream).
			after := resumesFromLog(t, c)
			if got := after[0] + after[1] - before[0] - before[1]; got != float64(resumes) {
				t.Errorf("resumes_total{outcome=replayed|noop} moved by %v (%v -> %v), want %d", got, before, after, resumes)
			}
			t.Logf("resumes replayed, noop: %v -> %v", before, after)
		})
	}
}

// Why the module exists: the same client and cut straight against the demo
// server (no event store, so no event IDs) loses the call. The SDK does not
// resume a POST stream that carried no event ID, so the call just hangs
// until its timeout (5s here instead of 30s to keep the test quick; the tool
// itself is done after 1.8s).
func TestToolCallWithoutProxyIsLost(t *testing.T) {
	nodeReady(t)
	upstream := harness.StartDemo(t, demoserver.Options{})
	r := runClient(t, "http://"+upstream+"/mcp", "--timeout-ms=5000")
	if !r.Cut.Done {
		t.Fatalf("the cut did not happen: %+v", r.Cut)
	}
	complete := r.Error == "" && r.Result == fmt.Sprintf("counted to %d", n) && len(r.Progress) == n
	if complete {
		t.Fatalf("the call survived a cut without the proxy; the server must have become resumable: %+v", r)
	}
	// The reason: the upstream's events carry no ID, so the SDK had no
	// Last-Event-ID to resume the call's stream with, and did not try.
	for _, req := range r.Requests {
		if req.LastEventID != "" {
			t.Errorf("a request carried Last-Event-ID %q, but the upstream sends no event IDs", req.LastEventID)
		}
	}
	t.Logf("without the proxy: error %q, result %q, progress %v", r.Error, r.Result, r.Progress)
}

func assertOnceInOrder(t *testing.T, got []float64, n int) {
	t.Helper()
	if len(got) != n {
		t.Errorf("got %d progress notifications, want %d: %v", len(got), n, got)
		return
	}
	for i, p := range got {
		if p != float64(i+1) {
			t.Errorf("progress[%d] = %v, want %d (all: %v)", i, p, i+1, got)
			return
		}
	}
}
