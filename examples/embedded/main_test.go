package main

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/mcpresume/caddy-mcp-resume/internal/mcptest"
)

// The example's promise: an official Go SDK client calls a tool of an SDK
// server behind the engine, its connection is cut mid-call, and it still
// gets every progress notification once, in order, and the result, with
// the SDK server in-process and with it behind an httputil.ReverseProxy.
func TestEmbeddedCallSurvivesACut(t *testing.T) {
	upstream := httptest.NewServer(sdkServer())
	t.Cleanup(upstream.Close)
	target, _ := url.Parse(upstream.URL + "/mcp")
	for _, tc := range []struct {
		name string
		next http.Handler
	}{{"in-process", sdkServer()}, {"reverse proxy", reverseProxy(target)}} {
		for _, version := range []string{"2025-11-25", "2025-06-18"} {
			for _, reset := range []bool{false, true} {
				t.Run(fmt.Sprintf("%s/%s/reset=%v", tc.name, version, reset), func(t *testing.T) {
					h, closeEngine, err := newHandler(tc.next, zap.NewNop())
					if err != nil {
						t.Fatal(err)
					}
					srv := httptest.NewServer(h)
					t.Cleanup(func() { srv.Close(); closeEngine() })
					ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
					defer cancel()
					client, err := mcptest.ConnectSDK(ctx, srv.URL+"/mcp", version, 0)
					if err != nil {
						t.Fatalf("connect: %v", err)
					}
					defer client.Session.Close()
					const n = 10
					cut := client.CutAfter(3, reset)
					res, err := client.Session.CallTool(ctx, mcptest.CountParams(n, 100))
					if err != nil {
						t.Fatalf("call failed behind the engine: %v", err)
					}
					if cuts := <-cut; cuts == 0 {
						t.Fatal("no connection was cut")
					}
					if got := mcptest.ResultText(res); got != fmt.Sprintf("counted to %d", n) {
						t.Fatalf("result %q", got)
					}
					if err := mcptest.OnceInOrder(client.ProgressAfterCall(n), n); err != nil {
						t.Fatal(err)
					}
				})
			}
		}
	}
}
