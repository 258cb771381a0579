// Command mcp-demo-server runs the demo MCP upstream (see package
// internal/demoserver) at /mcp: a non-resumable streamable HTTP server meant
// to sit behind the mcp-resume Caddy module.
package main

import (
	"context"
	"flag"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/internal/demoserver"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:8080", "address to listen on")
	interval := flag.Duration("interval", 500*time.Millisecond, "default pause between progress steps and notifications")
	allowAnyHost := flag.Bool("allow-any-host", false, "disable the SDK's DNS-rebinding check, which rejects non-localhost Host headers on loopback connections")
	flag.Parse()

	logger := slog.New(slog.NewTextHandler(os.Stderr, nil))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	err := demoserver.ListenAndServe(ctx, *addr, demoserver.Options{
		ProgressInterval:           *interval,
		Logger:                     logger,
		DisableLocalhostProtection: *allowAnyHost,
	})
	if err != nil {
		logger.Error("server failed", "err", err)
		os.Exit(1)
	}
	logger.Info("server stopped")
}
