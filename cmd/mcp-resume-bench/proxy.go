package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	_ "github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	_ "github.com/caddyserver/caddy/v2/modules/standard"

	_ "github.com/mcpresume/caddy-mcp-resume"
)

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
	home       string
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// caddyfile returns the benchmark's Caddyfile.
func caddyfile(adminPort, resumePort, plainPort, httpsPort int, upstream string) string {
	opts := "\t\t\t" + strings.Join(moduleOptions, "\n\t\t\t")
	return fmt.Sprintf(`{
	admin localhost:%d
	http_port %d
	https_port %d
	auto_https off
	persist_config off
	grace_period 1s
	skip_install_trust
	log {
		level ERROR
	}
}
:%d {
	bind 127.0.0.1
	route /mcp* {
		mcp_resume {
%s
		}
		reverse_proxy %s
	}
}
:%d {
	bind 127.0.0.1
	route /mcp* {
		reverse_proxy %s
	}
}
`, adminPort, resumePort, httpsPort, resumePort, opts, upstream, plainPort, upstream)
}

func startProxy(upstream string) (*proxy, error) {
	home, err := os.MkdirTemp("", "mcp-resume-bench-")
	if err != nil {
		return nil, err
	}
	for _, k := range []string{"HOME", "XDG_CONFIG_HOME", "XDG_DATA_HOME"} {
		os.Setenv(k, home)
	}
	var ports [4]int
	for i := range ports {
		if ports[i], err = freePort(); err != nil {
			return nil, err
		}
	}
	cfg := caddyfile(ports[0], ports[1], ports[2], ports[3], upstream)
	js, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(cfg), nil)
	if err != nil {
		return nil, fmt.Errorf("adapting Caddyfile: %v\n%s", err, cfg)
	}
	if err := caddy.Load(js, true); err != nil {
		return nil, fmt.Errorf("loading config: %v", err)
	}
	p := &proxy{
		resumeBase: fmt.Sprintf("http://127.0.0.1:%d", ports[1]),
		plainBase:  fmt.Sprintf("http://127.0.0.1:%d", ports[2]),
		admin:      fmt.Sprintf("http://localhost:%d", ports[0]),
		home:       home,
	}
	for _, port := range ports[1:3] {
		if err := waitListening(port); err != nil {
			p.stop()
			return nil, err
		}
	}
	return p, nil
}

func (p *proxy) stop() {
	caddy.Stop()
	os.RemoveAll(p.home)
}

func waitListening(port int) error {
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if c, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", port)); err == nil {
			c.Close()
			return nil
		}
		time.Sleep(10 * time.Millisecond)
	}
	return fmt.Errorf("nothing listens on port %d", port)
}

// metrics scrapes mcp_resume's metrics from Caddy's admin endpoint.
func (p *proxy) metrics(ctx context.Context) (map[string]float64, error) {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, p.admin+"/metrics", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	return parseMetrics(string(b)), nil
}

// streamState returns the state of stream num of a session from the admin
// API, and whether a client connection is reading it.
func (p *proxy) streamState(ctx context.Context, sid string, num uint32) (state string, connected bool, err error) {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, p.admin+"/mcp_resume/sessions/"+sid, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", false, err
	}
	defer resp.Body.Close()
	var info struct {
		Streams []struct {
			Num       uint32 `json:"stream"`
			State     string `json:"state"`
			Connected bool   `json:"connected"`
		} `json:"streams"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&info); err != nil {
		return "", false, err
	}
	for _, s := range info.Streams {
		if s.Num == num {
			return s.State, s.Connected, nil
		}
	}
	return "", false, fmt.Errorf("session %s has no stream %d", sid, num)
}
