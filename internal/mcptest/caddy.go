package mcptest

import (
	"cmp"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	_ "github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	_ "github.com/caddyserver/caddy/v2/modules/standard"

	_ "github.com/mcpresume/caddy-mcp-resume"
	"github.com/mcpresume/caddy-mcp-resume/buffer"
)

// Config is the Caddyfile of an in-process Caddy: global options that keep
// it to loopback ports chosen by the caller, quiet and quick to reload, and
// one site per port.
type Config struct {
	AdminPort int
	HTTPPort  int    // Caddy's http_port
	HTTPSPort int    // a free port: nothing serves HTTPS, but Caddy must not claim 443
	Global    string // more lines for the global options block, e.g. "metrics"
	LogLevel  string // default ERROR
	Grace     string // grace_period, default 1s: a reload or stop does not wait long for streams
	Sites     []Site
}

// Site is one site of a Config.
type Site struct {
	Port int
	Body string // what goes inside `:PORT { }`
}

// Caddyfile returns the config as a Caddyfile.
func (c Config) Caddyfile() string {
	var b strings.Builder
	fmt.Fprintf(&b, `{
	admin localhost:%d
	http_port %d
	https_port %d
	auto_https off
	persist_config off
	grace_period %s
	skip_install_trust
	log {
		level %s
	}
%s
}
`, c.AdminPort, c.HTTPPort, c.HTTPSPort, cmp.Or(c.Grace, "1s"), cmp.Or(c.LogLevel, "ERROR"), c.Global)
	for _, s := range c.Sites {
		fmt.Fprintf(&b, ":%d {\n%s\n}\n", s.Port, s.Body)
	}
	return b.String()
}

// Load (re)loads cfg into this process's Caddy, as `caddy reload` does, and
// waits until every site listens. Caddy's config is global: one in-process
// Caddy at a time.
func Load(cfg Config) error {
	text := cfg.Caddyfile()
	js, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(text), nil) // warnings: only "input is not formatted"
	if err != nil {
		return fmt.Errorf("adapting Caddyfile: %v\n%s", err, text)
	}
	if err := caddy.Load(js, true); err != nil {
		return fmt.Errorf("loading config: %v", err)
	}
	for _, s := range cfg.Sites {
		if err := waitListening(s.Port, 10*time.Second); err != nil {
			return err
		}
	}
	return nil
}

// Isolate points Caddy's home, config and data directories at a new
// temporary directory, so that nothing reads or writes the user's; cleanup
// removes it. Go's own directories (build and module caches, its env file)
// are pinned first to where they were: they default to places under HOME,
// and a `go build` a test runs (a Caddy binary) would otherwise build
// everything cold into the temporary directory, minutes on 2 cores.
func Isolate() (cleanup func(), err error) {
	if err := pinGoDirs(); err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "mcp-resume-")
	if err != nil {
		return nil, err
	}
	for _, k := range []string{"HOME", "XDG_CONFIG_HOME", "XDG_DATA_HOME"} {
		os.Setenv(k, dir)
	}
	return func() { os.RemoveAll(dir) }, nil
}

// Stop stops this process's Caddy, as a process exit would; Load starts it
// again.
func Stop() error { return caddy.Stop() }

// StoreBlock, if set, is a store subdirective ResumeRoute adds to every
// mcp_resume block: the test suites run once with the default store and
// once with this (see tests/harness.MainBothStores).
var StoreBlock string

// ResumeRoute is a site body as the README's typical use has it: on /mcp*,
// mcp_resume with the given options (the lines of its block, "" for none)
// in front of reverse_proxy to upstream (host:port).
func ResumeRoute(upstream, moduleOptions string) string {
	if StoreBlock != "" {
		moduleOptions = StoreBlock + "\n" + moduleOptions
	}
	if moduleOptions != "" {
		moduleOptions = "{\n" + moduleOptions + "\n}"
	}
	return fmt.Sprintf(`	route /mcp* {
		mcp_resume %s
		reverse_proxy %s
	}`, moduleOptions, upstream)
}

// ProxyRoute is ResumeRoute without mcp_resume: what the benchmark compares
// with.
func ProxyRoute(upstream string) string {
	return fmt.Sprintf(`	route /mcp* {
		reverse_proxy %s
	}`, upstream)
}

func waitListening(port int, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if c, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", port)); err == nil {
			c.Close()
			return nil
		}
		time.Sleep(10 * time.Millisecond)
	}
	return fmt.Errorf("nothing listens on port %d", port)
}

// AdminClient makes every request on a new connection: a reload replaces
// the admin server (and the sites'), and a request (DELETE, POST) on a
// pooled connection the old server is closing would fail with EOF.
var AdminClient = &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}

// Sessions returns what the admin API at admin (http://localhost:PORT)
// shows of every session.
func Sessions(admin string) ([]buffer.SessionInfo, error) {
	var out []buffer.SessionInfo
	status, err := getJSON(admin+"/mcp_resume/sessions", &out)
	if err == nil && status != http.StatusOK {
		err = fmt.Errorf("admin sessions: %d", status)
	}
	return out, err
}

// Session returns what the admin API shows of one session; ok is false if
// the proxy holds no such session.
func Session(admin, id string) (s buffer.SessionInfo, ok bool, err error) {
	status, err := getJSON(admin+"/mcp_resume/sessions/"+url.PathEscape(id), &s)
	return s, status == http.StatusOK, err
}

// Purge purges a session through the admin API and returns the status.
func Purge(admin, id string) (int, error) {
	req, err := http.NewRequest(http.MethodDelete, admin+"/mcp_resume/sessions/"+url.PathEscape(id), nil)
	if err != nil {
		return 0, err
	}
	resp, err := AdminClient.Do(req)
	if err != nil {
		return 0, err
	}
	resp.Body.Close()
	return resp.StatusCode, nil
}

// getJSON decodes a 200 answer into v; a 404 is no error.
func getJSON(url string, v any) (int, error) {
	resp, err := AdminClient.Get(url)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	switch resp.StatusCode {
	case http.StatusOK:
		return resp.StatusCode, json.NewDecoder(resp.Body).Decode(v)
	case http.StatusNotFound:
		return resp.StatusCode, nil
	}
	return resp.StatusCode, fmt.Errorf("GET %s: %s", url, resp.Status)
}

// goDirs are the go command's settings whose defaults lie under HOME.
var goDirs = []string{"GOCACHE", "GOMODCACHE", "GOPATH", "GOENV"}

// pinGoDirs sets each of goDirs in the environment to what the go command
// uses now, so that changing HOME changes none of them. Without a go
// command there is nothing to pin.
func pinGoDirs() error {
	if _, err := exec.LookPath("go"); err != nil {
		return nil
	}
	out, err := exec.Command("go", append([]string{"env"}, goDirs...)...).Output()
	if err != nil {
		return fmt.Errorf("go env: %v", err)
	}
	vals := strings.Split(strings.TrimRight(string(out), "\n"), "\n")
	if len(vals) != len(goDirs) {
		return fmt.Errorf("go env %v: %q", goDirs, out)
	}
	for i, k := range goDirs {
		if vals[i] != "" {
			os.Setenv(k, vals[i])
		}
	}
	return nil
}
