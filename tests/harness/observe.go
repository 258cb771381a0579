package harness

// Helpers for tests that watch resources: the admin API and metrics of the
// in-process Caddy, kernel socket queues, the Go heap, upstreams with small
// socket buffers, and transports a test can hold (a network that is down).

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"runtime"
	"runtime/metrics"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/buffer"
)

// Sessions returns what the admin API (GET /mcp_resume/sessions) shows.
func (c *Caddy) Sessions() ([]buffer.SessionInfo, error) {
	resp, err := http.Get(c.Admin() + "/mcp_resume/sessions")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("admin sessions: %s", resp.Status)
	}
	var out []buffer.SessionInfo
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		return nil, err
	}
	return out, nil
}

// Metrics scrapes the admin endpoint's /metrics (Prometheus text format) and
// returns every sample by its series name, e.g.
// `caddy_mcp_resume_streams_failed_total{reason="stalled"}`.
func (c *Caddy) Metrics() (map[string]float64, error) {
	resp, err := http.Get(c.Admin() + "/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("admin metrics: %s", resp.Status)
	}
	out := make(map[string]float64)
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			continue
		}
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			continue
		}
		out[line[:i]] = v
	}
	return out, sc.Err()
}

// MetricSum adds up the samples of one metric over all label values; ok is
// false if the metric is not exposed at all.
func MetricSum(m map[string]float64, name string) (sum float64, ok bool) {
	for k, v := range m {
		if k == name || strings.HasPrefix(k, name+"{") {
			sum += v
			ok = true
		}
	}
	return sum, ok
}

// TCPSocket is one IPv4/IPv6 TCP socket of this network namespace as
// /proc/net/tcp{,6} shows it.
type TCPSocket struct {
	LocalPort, RemotePort int
	State                 int   // 1 = ESTABLISHED
	TxQueue               int64 // bytes written by the application, not yet acknowledged by the peer
	RxQueue               int64 // bytes received, not yet read by the application
}

// TCPSockets lists the TCP sockets of the network namespace.
func TCPSockets() ([]TCPSocket, error) {
	var out []TCPSocket
	for _, f := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		b, err := os.ReadFile(f)
		if err != nil {
			if os.IsNotExist(err) {
				continue
			}
			return nil, err
		}
		for _, line := range strings.Split(string(b), "\n")[1:] {
			fs := strings.Fields(line)
			if len(fs) < 5 {
				continue
			}
			lp, err1 := hexPort(fs[1])
			rp, err2 := hexPort(fs[2])
			st, err3 := strconv.ParseInt(fs[3], 16, 32)
			q := strings.SplitN(fs[4], ":", 2)
			if err1 != nil || err2 != nil || err3 != nil || len(q) != 2 {
				continue
			}
			tx, err4 := strconv.ParseInt(q[0], 16, 64)
			rx, err5 := strconv.ParseInt(q[1], 16, 64)
			if err4 != nil || err5 != nil {
				continue
			}
			out = append(out, TCPSocket{LocalPort: lp, RemotePort: rp, State: int(st), TxQueue: tx, RxQueue: rx})
		}
	}
	return out, nil
}

func hexPort(addr string) (int, error) {
	i := strings.LastIndexByte(addr, ':')
	if i < 0 {
		return 0, fmt.Errorf("no port in %q", addr)
	}
	p, err := strconv.ParseInt(addr[i+1:], 16, 32)
	return int(p), err
}

// QueuedBytes sums the send and receive queues of every established socket
// on either end of a connection to or from port: the bytes the kernel holds
// in flight on those connections.
func QueuedBytes(port int) (tx, rx int64, err error) {
	socks, err := TCPSockets()
	if err != nil {
		return 0, 0, err
	}
	for _, s := range socks {
		if s.State == 1 && (s.LocalPort == port || s.RemotePort == port) {
			tx += s.TxQueue
			rx += s.RxQueue
		}
	}
	return tx, rx, nil
}

// LiveHeap returns the bytes of live heap objects after a full GC: what the
// process really holds, without garbage not yet collected.
func LiveHeap() uint64 {
	runtime.GC()
	s := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	metrics.Read(s)
	if s[0].Value.Kind() != metrics.KindUint64 {
		return 0
	}
	return s[0].Value.Uint64()
}

// SettledHeap returns LiveHeap once it has settled (two readings 200ms apart
// within 256 KiB of each other, or after 5s): what earlier tests left behind
// (goroutines and connections winding down) is gone by then, so it makes a
// baseline for growth.
func SettledHeap() uint64 {
	prev := LiveHeap()
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		time.Sleep(200 * time.Millisecond)
		cur := LiveHeap()
		if cur <= prev+256<<10 && prev <= cur+256<<10 {
			return cur
		}
		prev = cur
	}
	return prev
}

// StartUpstreamSmallBuffers serves h on a loopback socket whose accepted
// connections get the given send buffer (SO_SNDBUF; the kernel doubles it and
// turns off its autotuning), so the bytes an upstream can park in its own
// kernel buffer while nobody reads are small and known. Returns host:port.
func StartUpstreamSmallBuffers(t testing.TB, h http.Handler, sndbuf int) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(h)
	srv.Listener.Close()
	srv.Listener = &bufferListener{Listener: l, sndbuf: sndbuf}
	srv.Start()
	t.Cleanup(srv.Close)
	return l.Addr().String()
}

type bufferListener struct {
	net.Listener
	sndbuf int
}

func (l *bufferListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	if tc, ok := c.(*net.TCPConn); ok && l.sndbuf > 0 {
		tc.SetWriteBuffer(l.sndbuf)
	}
	return c, nil
}

// GatedTransport passes requests to Next unless it is held: then new
// requests wait (as behind a network that is down) until Release or their
// context ends.
type GatedTransport struct {
	Next http.RoundTripper

	mu   sync.Mutex
	gate chan struct{} // nil: open
	held int
}

// Hold makes new requests wait.
func (g *GatedTransport) Hold() {
	g.mu.Lock()
	if g.gate == nil {
		g.gate = make(chan struct{})
	}
	g.mu.Unlock()
}

// Release lets waiting and new requests through.
func (g *GatedTransport) Release() {
	g.mu.Lock()
	if g.gate != nil {
		close(g.gate)
		g.gate = nil
	}
	g.mu.Unlock()
}

// Held returns the number of requests that waited at the gate so far.
func (g *GatedTransport) Held() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.held
}

// RoundTrip implements http.RoundTripper.
func (g *GatedTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	g.mu.Lock()
	gate := g.gate
	if gate != nil {
		g.held++
	}
	g.mu.Unlock()
	if gate != nil {
		select {
		case <-gate:
		case <-r.Context().Done():
			return nil, r.Context().Err()
		}
	}
	return g.Next.RoundTrip(r)
}

// Eventually polls cond every interval until it holds or timeout passes.
func Eventually(timeout, interval time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	for {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(interval)
	}
}

// WaitFor polls cond every 20ms until it holds, and fails the test (saying
// what it waited for) if it does not within timeout.
func WaitFor(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	if !Eventually(timeout, 20*time.Millisecond, cond) {
		t.Fatalf("timed out waiting for %s", what)
	}
}
