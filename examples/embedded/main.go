// Command embedded serves an MCP server built with the official Go SDK
// behind mcp-resume's engine, in one process and without Caddy: the
// engine (package resume) is a net/http middleware in front of the SDK's
// StreamableHTTPHandler, with the in-memory store. A client whose
// connection drops mid-call resumes with Last-Event-ID and gets every
// progress notification once and the result, although the SDK server
// keeps no events itself.
//
//	go run ./examples/embedded -addr 127.0.0.1:8080
//	go run ./examples/embedded -addr 127.0.0.1:8080 -upstream http://127.0.0.1:9000/mcp
//
// With -upstream the engine fronts an httputil.ReverseProxy to that MCP
// server instead.
package main

import (
	"context"
	"crypto/rand"
	"flag"
	"fmt"
	"log"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"os/signal"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"go.uber.org/zap"

	"github.com/mcpresume/caddy-mcp-resume/buffer"
	"github.com/mcpresume/caddy-mcp-resume/resume"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:8080", "address to listen on")
	upstream := flag.String("upstream", "", "URL of an MCP server to proxy to (default: serve the SDK server in-process)")
	flag.Parse()
	logger, _ := zap.NewProduction()
	next := sdkServer()
	if *upstream != "" {
		u, err := url.Parse(*upstream)
		if err != nil {
			log.Fatal(err)
		}
		next = reverseProxy(u)
	}
	h, closeEngine, err := newHandler(next, logger)
	if err != nil {
		log.Fatal(err)
	}
	defer closeEngine()
	// ConnContext lets the engine see each request's connection, so that a
	// call's short answer is written without a goroutine of its own.
	srv := &http.Server{Addr: *addr, Handler: h, ConnContext: resume.ConnContext}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	go func() {
		<-ctx.Done()
		shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		srv.Shutdown(shutdown)
	}()
	logger.Info("serving MCP at /mcp behind the resume engine", zap.String("addr", *addr))
	if err := srv.ListenAndServe(); err != http.ErrServerClosed {
		log.Fatal(err)
	}
}

// newHandler puts the engine, on a memory store of its own, in front of
// next at /mcp. close stops the engine's upstream reads and its store.
func newHandler(next http.Handler, logger *zap.Logger) (h http.Handler, close func(), err error) {
	key := make([]byte, 32) // keys the event IDs and credential hashes
	rand.Read(key)
	store := buffer.NewMemoryStore(buffer.Options{Key: key,
		Hooks: resume.StoreHooks(func() *zap.Logger { return logger })})
	rt := resume.NewRuntime(store)
	// Zero values take the defaults; the store takes the engine's limits.
	eng, err := resume.New(resume.Config{Logger: logger}, rt)
	if err != nil {
		rt.Close()
		return nil, nil, err
	}
	mux := http.NewServeMux()
	mux.Handle("/mcp", eng.Handler(next))
	return mux, rt.Close, nil
}

// sdkServer is an MCP server of the official Go SDK with one tool, count,
// that sends a progress notification per step: a stateful Streamable HTTP
// handler with no event store (it cannot resume a stream itself).
func sdkServer() http.Handler {
	server := mcp.NewServer(&mcp.Implementation{Name: "embedded-example", Version: "1.0.0"}, nil)
	mcp.AddTool(server, &mcp.Tool{Name: "count", Description: "counts to n, reporting progress"}, count)
	return mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return server }, nil)
}

type countArgs struct {
	N          int `json:"n" jsonschema:"number of steps"`
	IntervalMS int `json:"interval_ms,omitempty" jsonschema:"milliseconds before each step"`
}

func count(ctx context.Context, req *mcp.CallToolRequest, args countArgs) (*mcp.CallToolResult, any, error) {
	for i := 1; i <= args.N; i++ {
		select {
		case <-time.After(time.Duration(args.IntervalMS) * time.Millisecond):
		case <-ctx.Done():
			return nil, nil, ctx.Err()
		}
		if token := req.Params.GetProgressToken(); token != nil {
			req.Session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{ProgressToken: token,
				Progress: float64(i), Total: float64(args.N), Message: fmt.Sprintf("step %d of %d", i, args.N)})
		}
	}
	return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: fmt.Sprintf("counted to %d", args.N)}}}, nil, nil
}

// reverseProxy forwards to an MCP server elsewhere.
func reverseProxy(target *url.URL) http.Handler {
	return &httputil.ReverseProxy{Rewrite: func(r *httputil.ProxyRequest) {
		r.SetURL(target)
		r.Out.URL.Path = target.Path
		r.Out.Host = target.Host
	}}
}
