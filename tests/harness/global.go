package harness

import (
	"fmt"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
)

// LoadWithGlobal (re)loads the config like Load, with extra lines in the
// global options block (e.g. "metrics" to turn on Caddy's own HTTP metrics).
func (c *Caddy) LoadWithGlobal(t testing.TB, global, site string) {
	t.Helper()
	cfg := fmt.Sprintf(`{
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
%s
}
:%d {
%s
}
`, c.AdminPort, c.HTTPPort, FreePort(t), global, c.HTTPPort, site)
	js, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(cfg), nil)
	if err != nil {
		t.Fatalf("adapting Caddyfile: %v\n%s", err, cfg)
	}
	if err := caddy.Load(js, true); err != nil {
		t.Fatalf("loading config: %v", err)
	}
	waitListening(t, c.HTTPPort)
}
