// Command mcp-resume-demo runs the whole demo in one process: the bundled
// demo MCP server (official Go SDK, no event store, so not resumable by
// itself) on 127.0.0.1:8080, and Caddy with mcp_resume in front of it on
// :8081, configured by the embedded Caddyfile (or -config).
//
//	go run ./cmd/mcp-resume-demo
//
// Then point an MCP client at http://localhost:8081/mcp.
package main

import (
	"context"
	_ "embed"
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	_ "github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	_ "github.com/caddyserver/caddy/v2/modules/standard"

	_ "github.com/mcpresume/caddy-mcp-resume"
	"github.com/mcpresume/caddy-mcp-resume/internal/demoserver"
)

//go:embed Caddyfile
var defaultCaddyfile []byte

func main() {
	upstream := flag.String("upstream", "127.0.0.1:8080", "address of the demo MCP server (the embedded Caddyfile proxies to 127.0.0.1:8080)")
	config := flag.String("config", "", "Caddyfile to load instead of the embedded one")
	interval := flag.Duration("interval", 500*time.Millisecond, "pause between progress notifications of the demo tools")
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	errc := make(chan error, 1)
	go func() {
		errc <- demoserver.ListenAndServe(ctx, *upstream, demoserver.Options{ProgressInterval: *interval})
	}()

	cfg := defaultCaddyfile
	if *config != "" {
		b, err := os.ReadFile(*config)
		if err != nil {
			log.Fatal(err)
		}
		cfg = b
	}
	js, _, err := caddyconfig.GetAdapter("caddyfile").Adapt(cfg, map[string]any{"filename": "Caddyfile"})
	if err != nil {
		log.Fatalf("Caddyfile: %v", err)
	}
	if err := caddy.Load(js, true); err != nil {
		log.Fatalf("starting Caddy: %v", err)
	}
	fmt.Fprintf(os.Stderr, "\nmcp-resume demo: MCP endpoint http://localhost:8081/mcp (demo server on %s, admin API http://localhost:2019/mcp_resume/sessions)\n\n", *upstream)

	select {
	case <-ctx.Done():
	case err := <-errc:
		if err != nil {
			log.Printf("demo server: %v", err)
		}
	}
	if err := caddy.Stop(); err != nil {
		log.Printf("stopping Caddy: %v", err)
	}
}
