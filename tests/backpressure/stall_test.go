package backpressure

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcpresume/caddy-mcp-resume/internal/demoserver"
	"github.com/mcpresume/caddy-mcp-resume/internal/mcptest"
	"github.com/mcpresume/caddy-mcp-resume/tests/harness"
)

// stall_timeout end to end with the official Go SDK client: the client's
// network goes away right after the first progress notification of a tool
// call whose upstream (the official-SDK demo server, count n=2000 with no
// pause) produces far more than max_stream_bytes. The log fills, the
// upstream is held back, and after stall_timeout the stream fails with
// reason "stalled". When the network comes back, the SDK client resumes and
// its CallTool returns a loud JSON-RPC error naming the stall, promptly,
// instead of hanging; the progress it did see is contiguous.
//
// resume_window is 30s so that the events written to the client before the
// cut stay retained: the resume replays them, and the only loss is the
// stall's, not the window's.
func TestStallTimeoutFailsCallLoudly(t *testing.T) {
	upstream := harness.StartDemo(t, demoserver.Options{})
	c := harness.StartCaddy(t, mcptest.ResumeRoute(upstream, `
			max_stream_bytes 64KiB
			max_session_bytes 64KiB
			max_total_bytes 8MiB
			resume_window 30s
			stall_timeout 1s`))

	gate := &mcptest.GatedTransport{Next: mcptest.NewCuttableTransport(0)}
	cut := gate.Next.(*mcptest.CuttableTransport)
	var (
		mu       sync.Mutex
		progress []float64
		first    = make(chan struct{})
		once     sync.Once
	)
	client := mcp.NewClient(&mcp.Implementation{Name: "backpressure", Version: "1"}, &mcp.ClientOptions{
		ProgressNotificationHandler: func(_ context.Context, req *mcp.ProgressNotificationClientRequest) {
			mu.Lock()
			progress = append(progress, req.Params.Progress)
			mu.Unlock()
			once.Do(func() { close(first) })
		},
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	session, err := client.Connect(ctx, &mcp.StreamableClientTransport{
		Endpoint:   c.Base() + "/mcp",
		HTTPClient: &http.Client{Transport: gate},
	}, &mcp.ClientSessionOptions{ProtocolVersion: "2025-11-25"})
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	defer session.Close()

	// The network goes away after the first progress notification: held
	// requests wait, open connections are cut.
	start := time.Now()
	cutDone := make(chan int, 1)
	go func() {
		select {
		case <-first:
			gate.Hold()
			cutDone <- cut.Cut(true)
		case <-time.After(20 * time.Second):
			cutDone <- -1
		}
	}()
	type result struct {
		res *mcp.CallToolResult
		err error
		at  time.Time
	}
	callDone := make(chan result, 1)
	callCtx, callCancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer callCancel()
	go func() {
		params := &mcp.CallToolParams{Name: "count", Arguments: map[string]any{"n": 2000, "interval_ms": 0}}
		params.SetProgressToken("p")
		res, err := session.CallTool(callCtx, params)
		callDone <- result{res, err, time.Now()}
	}()
	if n := <-cutDone; n <= 0 {
		t.Fatalf("no progress notification or no connection to cut (%d)", n)
	}

	// While the client is away the stream fails: stalled.
	var failedAt time.Duration
	if !mcptest.Eventually(15*time.Second, 50*time.Millisecond, func() bool {
		ss, err := c.Sessions()
		if err != nil {
			return false
		}
		for _, se := range ss {
			for _, st := range se.Streams {
				if st.Kind == "request" && st.State == "failed" {
					if st.FailReason != "stalled" {
						t.Fatalf("stream failed with reason %q, want stalled", st.FailReason)
					}
					if st.Connected {
						t.Errorf("a client was connected to the stream when it failed: the stall did not happen while the client was away")
					}
					// The failure's signals (a gap and the call's error) go in
					// beyond the bound: clients must learn of the failure.
					if st.Bytes > 64<<10+1<<10 {
						t.Errorf("failed stream retains %d B > max_stream_bytes and its signals", st.Bytes)
					}
					failedAt = time.Since(start)
					return true
				}
			}
		}
		return false
	}) {
		ss, _ := c.Sessions()
		t.Fatalf("the stream did not fail as stalled: %+v", ss)
	}
	select {
	case r := <-callDone:
		t.Fatalf("CallTool returned while the network was down: %v, %v", r.res, r.err)
	default:
	}

	// The network comes back once the SDK is trying to resume (a request
	// waits at the gate): the resume goes through and the call fails, loudly.
	harness.WaitFor(t, 10*time.Second, "the client's reconnect to wait at the gate", func() bool { return gate.Held() > 0 })
	released := time.Now()
	gate.Release()
	var r result
	select {
	case r = <-callDone:
	case <-time.After(35 * time.Second):
		t.Fatal("CallTool hangs")
	}
	t.Logf("stream failed %v after the call started; CallTool returned %v after the network came back (%d requests had waited at the gate): %v",
		failedAt.Round(time.Millisecond), r.at.Sub(released).Round(time.Millisecond), gate.Held(), r.err)
	if r.err == nil {
		t.Fatalf("CallTool succeeded (%v) although the stream stalled", resultText(r.res))
	}
	if errors.Is(r.err, context.DeadlineExceeded) || callCtx.Err() != nil {
		t.Fatalf("CallTool only returned at its deadline: %v", r.err)
	}
	if !strings.Contains(r.err.Error(), "stalled") {
		t.Fatalf("CallTool error does not say the stream stalled: %v", r.err)
	}
	if d := r.at.Sub(released); d > 15*time.Second {
		t.Errorf("CallTool took %v after the network came back", d)
	}
	// What the client did see arrived once, in order. The SDK hands
	// notifications to their handler on its own goroutines: a late one (or
	// a duplicate) would land within this pause, whose end has no event.
	time.Sleep(100 * time.Millisecond)
	mu.Lock()
	got := append([]float64(nil), progress...)
	mu.Unlock()
	for i, p := range got {
		if p != float64(i+1) {
			t.Fatalf("progress[%d] = %v, want %d: %v", i, p, i+1, got[:min(len(got), 50)])
		}
	}
	if len(got) == 0 || len(got) >= 2000 {
		t.Fatalf("%d progress notifications", len(got))
	}
	t.Logf("progress seen: 1..%d of 2000, each once", len(got))

	m, err := c.Metrics()
	if err != nil {
		t.Fatal(err)
	}
	if v, _ := m.Sum(`caddy_mcp_resume_streams_failed_total{reason="stalled"}`); v < 1 {
		t.Errorf(`streams_failed_total{reason="stalled"} = %v, want >= 1`, v)
	}
	if v, _ := m.Sum(`caddy_mcp_resume_gaps_total{reason="stalled"}`); v < 1 {
		t.Errorf(`gaps_total{reason="stalled"} = %v, want >= 1`, v)
	}
	harness.AssertNoEarlyEviction(t, c)
}

func resultText(r *mcp.CallToolResult) string {
	if r == nil {
		return "<nil>"
	}
	var b strings.Builder
	for _, c := range r.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			b.WriteString(tc.Text)
		}
	}
	return b.String()
}

// A client reading at full speed is never failed (review item 2), even when
// stall_timeout equals resume_window, as the defaults have it (here scaled
// to 2s): its stream is slowed to max_stream_bytes per resume_window while
// the window holds the room, but it is never stalled.
func TestAFastReaderIsNeverFailed(t *testing.T) {
	_, c := harness.FloodProxy(t, 0, `
			resume_window 2s
			stall_timeout 2s
			max_stream_bytes 64KiB
			max_session_bytes 64KiB`)
	cl := harness.StreamSession(t, c)
	const n = 1000
	s, err := cl.CallStream(1, "flood", harness.FloodArgs(n, 200), 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var tr harness.Tracker
	if _, err := harness.Drain(cl, s, &tr, 1, n+10, 0); err != nil {
		t.Fatal(err)
	}
	if tr.Progress != n || tr.ErrorMsg != "" || len(tr.Gaps) != 0 {
		t.Fatalf("got %d of %d events, error %q, gaps %+v", tr.Progress, n, tr.ErrorMsg, tr.Gaps)
	}
	m, _ := c.Metrics()
	if v := m.Series[`caddy_mcp_resume_streams_failed_total{reason="stalled"}`]; v != 0 {
		t.Fatalf("streams_failed_total{stalled} = %v", v)
	}
	if v := m.Series["caddy_mcp_resume_backpressure_stalls_total"]; v == 0 {
		t.Fatal("the bound was never reached: the test shows nothing")
	}
	harness.AssertNoEarlyEviction(t, c)
}

// Raising stall_timeout on reload does not make stalled appends spin
// (review item 15.5): 100 stalled streams, stall_timeout 5s -> 60s, and the
// process stays nearly idle (the old timer re-armed every millisecond and
// burned ~1.9 cores until the new timeout).
func TestRaisingStallTimeoutDoesNotSpin(t *testing.T) {
	f := harness.NewFlood()
	up := harness.StartHandler(t, f)
	opts := func(stall string) string {
		return fmt.Sprintf(`
			max_stream_bytes 16KiB
			max_session_bytes 16KiB
			max_total_bytes 64MiB
			stall_timeout %s`, stall)
	}
	c := harness.StartCaddy(t, mcptest.ResumeRoute(up, opts("5s")))
	// The floods wait until every session is open, so all 100 stall at
	// about the same time, well within the 5s (however loaded the machine).
	f.Hold("flood")
	err := mcptest.Parallel(100, 8, func(i int) error {
		cl := harness.NewStreamClient(c.Base(), "2025-06-18")
		if err := cl.Init(); err != nil {
			return err
		}
		args := harness.FloodArgs(1000, 200) // 200 KB: over the bound, little in socket buffers
		args.Pre, args.Hold = 1, "flood"
		s, err := cl.CallStream(1, "flood", args, 10*time.Second)
		if err != nil {
			return err
		}
		s.Next()
		s.Close()
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	f.Release("flood")
	harness.WaitFor(t, 5*time.Second, "100 stalled streams", func() bool {
		m, _ := c.Metrics()
		return m.Series["caddy_mcp_resume_stalled_streams"] == 100
	})
	c.Load(t, mcptest.ResumeRoute(up, opts("60s")))
	time.Sleep(6 * time.Second) // past the old timeout
	cpu := func() time.Duration {
		var ru syscall.Rusage
		syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
		return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	before := cpu()
	time.Sleep(2 * time.Second) // the interval the CPU is measured over
	used := cpu() - before
	t.Logf("CPU over 2s with 100 stalled streams after the reload: %v", used)
	if used > time.Second {
		t.Fatalf("%v of CPU in 2s: stalled appends spin", used)
	}
	m, _ := c.Metrics()
	if v := m.Series[`caddy_mcp_resume_streams_failed_total{reason="stalled"}`]; v != 0 {
		t.Fatalf("%v streams failed under the raised timeout", v)
	}
}
