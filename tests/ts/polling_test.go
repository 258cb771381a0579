package ts

import (
	"bufio"
	"context"
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/internal/mcptest"
	"github.com/mcpresume/caddy-mcp-resume/tests/harness"
)

// startPollingServer runs server.mjs (the TypeScript SDK server with an
// event store, retryInterval 300 and a tool that calls closeSSEStream) and
// returns its host:port.
func startPollingServer(t *testing.T) string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, "node", "server.mjs", "0")
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
	line := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if strings.HasPrefix(sc.Text(), "listening ") {
				line <- strings.TrimPrefix(sc.Text(), "listening ")
			}
		}
	}()
	select {
	case port := <-line:
		return "127.0.0.1:" + port
	case <-time.After(30 * time.Second):
		t.Fatalf("server.mjs did not start: %s", stderr.String())
		return ""
	}
}

// The user story, with the official TypeScript SDK on both ends: a
// 2025-11-25 server with a correct event store closes the call's SSE stream
// after the second of six progress notifications (SEP-1699 SSE polling).
// Directly and through mcp_resume alike, the client gets 6/6 and the
// result, after one resume (the proxy follows the upstream itself; the
// client only resumes when its own connection is cut).
func TestFollowsATypeScriptUpstreamThatPolls(t *testing.T) {
	nodeReady(t)
	upstream := startPollingServer(t)
	c := harness.StartCaddy(t, mcptest.ResumeRoute(upstream, ""))
	for _, tc := range []struct {
		name     string
		endpoint string
		cutAfter int
	}{
		{"directly (the control)", "http://" + upstream + "/mcp", 0},
		{"through mcp_resume", c.Base() + "/mcp", 0},
		{"through mcp_resume, client cut before the upstream's close", c.Base() + "/mcp", 1},
		{"through mcp_resume, client cut after the upstream's close", c.Base() + "/mcp", 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before, _ := c.Metrics()
			r := runClient(t, tc.endpoint, "--n=6", "--interval-ms=150", "--close-after=2",
				fmt.Sprintf("--cut-after=%d", tc.cutAfter), "--timeout-ms=20000")
			if r.Error != "" {
				t.Fatalf("call failed: %s (transport errors: %q)", r.Error, r.TransportErrors)
			}
			if r.Result != "counted to 6" {
				t.Fatalf("result %q", r.Result)
			}
			assertOnceInOrder(t, r.Progress, 6)
			gets := 0
			for _, req := range r.Requests {
				if req.Method == "GET" && req.LastEventID != "" {
					gets++
				}
			}
			if gets > 2 {
				t.Fatalf("%d resumes: the client reconnected in a loop (%+v)", gets, r.Requests)
			}
			if strings.HasPrefix(tc.endpoint, c.Base()) {
				after, _ := c.Metrics()
				k := `caddy_mcp_resume_upstream_reconnects_total{outcome="resumed"}`
				if after.Series[k] <= before.Series[k] {
					t.Fatalf("upstream_reconnects_total{resumed} did not move: the proxy did not follow the upstream's close")
				}
			}
		})
	}
}
