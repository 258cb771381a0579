package main

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/internal/mcptest"
	"github.com/mcpresume/caddy-mcp-resume/internal/testnet"
)

// protocolVersion is what the clients ask for: resumable, no priming.
const protocolVersion = "2025-06-18"

// moduleOptions configure mcp_resume so that backpressure never throttles the
// benchmark. A stream sustains at most max_stream_bytes per resume_window,
// and in practice per resume_window plus the store's 500 ms sweep interval
// (delivered events leave at the first sweep after the window): with 256 MiB
// per 1s window a single 16 KiB-event stream stalled at ~180 MB/s on
// loopback, so the bounds are raised to sustain ~2 GB/s per stream. The
// benchmark counts stalls per run and reports them.
var moduleOptions = []string{
	"resume_window 1s",
	"max_stream_bytes 3GiB",
	"max_session_bytes 3GiB",
	"max_total_bytes 8GiB",
	"max_event_bytes 32MiB",
	"max_sessions 20000",
}

// proxy is one in-process Caddy with two sites on the same upstream.
type proxy struct {
	resumeBase string // mcp_resume + reverse_proxy
	plainBase  string // reverse_proxy only
	admin      string
	cleanup    func()
}

func startProxy(upstream string) (*proxy, error) {
	cleanup, err := mcptest.Isolate()
	if err != nil {
		return nil, err
	}
	var ports [4]int // admin, mcp_resume, plain, https
	for i := range ports {
		if ports[i], err = testnet.FreePort(); err != nil {
			return nil, err
		}
	}
	const bind = "\tbind 127.0.0.1\n"
	err = mcptest.Load(mcptest.Config{AdminPort: ports[0], HTTPPort: ports[1], HTTPSPort: ports[3], Sites: []mcptest.Site{
		{Port: ports[1], Body: bind + mcptest.ResumeRoute(upstream, "\t\t\t"+strings.Join(moduleOptions, "\n\t\t\t"))},
		{Port: ports[2], Body: bind + mcptest.ProxyRoute(upstream)},
	}})
	p := &proxy{
		resumeBase: fmt.Sprintf("http://127.0.0.1:%d", ports[1]),
		plainBase:  fmt.Sprintf("http://127.0.0.1:%d", ports[2]),
		admin:      fmt.Sprintf("http://localhost:%d", ports[0]),
		cleanup:    cleanup,
	}
	if err != nil {
		p.stop()
		return nil, err
	}
	return p, nil
}

func (p *proxy) stop() {
	mcptest.Stop()
	p.cleanup()
}

// metrics scrapes the admin endpoint's metrics.
func (p *proxy) metrics() (mcptest.Metrics, error) {
	return mcptest.ScrapeMetrics(p.admin + "/metrics")
}

// total is a metric summed over its labels, 0 if not exposed.
func total(m mcptest.Metrics, name string) float64 {
	v, _ := m.Sum(name)
	return v
}

// newHTTPClient has a connection pool large enough for every concurrent
// stream.
func newHTTPClient() *http.Client {
	return &http.Client{Transport: &http.Transport{
		MaxIdleConns:        1024,
		MaxIdleConnsPerHost: 512,
		IdleConnTimeout:     time.Minute,
		DisableCompression:  true,
	}}
}

// openSessions opens n sessions on base, workers at a time.
func (b *bench) openSessions(ctx context.Context, base string, n, workers int) ([]*mcptest.Client, error) {
	cs := make([]*mcptest.Client, n)
	err := mcptest.Parallel(n, workers, func(i int) error {
		cs[i] = mcptest.NewClient(base, protocolVersion, b.hc)
		return cs[i].Initialize(ctx)
	})
	return cs, err
}

// closeSessions deletes the sessions that were opened.
func closeSessions(ctx context.Context, cs []*mcptest.Client, workers int) error {
	return mcptest.Parallel(len(cs), workers, func(i int) error {
		if cs[i] == nil || cs[i].SessionID == "" {
			return nil
		}
		return cs[i].Delete(ctx)
	})
}
