// Package demoserver is a small MCP server, built on the official Go SDK, that
// plays the upstream behind the mcp-resume Caddy module in demos and
// end-to-end tests.
//
// It is deliberately NOT resumable: it runs the SDK's streamable HTTP handler
// without an EventStore, so its SSE events carry no "id:" lines and a GET with
// Last-Event-ID is refused with 400 ("stream replay unsupported"). Anything
// written while a client is disconnected is lost. Making such streams
// resumable is the proxy's job.
//
// Tools:
//   - count {n, interval_ms, close_after, retry_ms}: progress notifications on
//     the call's own SSE stream, then the result. With an event store,
//     close_after k closes the call's SSE stream after progress k
//     (2025-11-25 SSE polling: the client must come back with
//     Last-Event-ID), announcing retry_ms.
//   - notify {n, interval_ms}: returns at once, then sends logging
//     notifications on the session's standalone GET stream.
//   - echo {text}: returns text.
//   - big {bytes}: returns a text result of the given size.
package demoserver

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// Options configures the demo server. The zero value is usable.
type Options struct {
	// ProgressInterval is the default pause between steps of the count and
	// notify tools; a call's interval_ms argument overrides it.
	// Zero or negative means 500ms.
	ProgressInterval time.Duration

	// Logger receives server-side logs, including the SDK's. Nil discards them.
	Logger *slog.Logger

	// DisableLocalhostProtection turns off the SDK's DNS-rebinding check, which
	// answers 403 to a request that reached a loopback address (127.0.0.1,
	// ::1) with a Host header that is not loopback ("localhost", "127.0.0.1",
	// "[::1]", with any port). A proxy that forwards the client's Host (Caddy's
	// reverse_proxy does by default) to a loopback upstream trips it unless
	// the client itself used a loopback host; either rewrite Host to the
	// upstream (header_up Host {upstream_hostport}) or set this.
	DisableLocalhostProtection bool

	// EventStore makes the server resumable itself: its SSE events carry IDs,
	// a GET with Last-Event-ID replays what came after, and the count tool's
	// close_after works. The server most users run has none.
	EventStore bool

	// EventStoreMaxBytes, if set, bounds what the event store keeps (the
	// SDK's MemoryEventStore.SetMaxBytes): it forgets the oldest events
	// beyond it, and a GET whose Last-Event-ID precedes what it kept is
	// refused (400 "failed to replay events"), as a server whose store
	// purged them refuses it.
	EventStoreMaxBytes int

	// CloseStandaloneAfter, if set, ends every standalone GET stream after
	// that long, as servers that poll (or restart their connections) do.
	// With EventStore, notifications sent meanwhile are kept for the next
	// GET's Last-Event-ID.
	CloseStandaloneAfter time.Duration
}

const (
	defaultProgressInterval = 500 * time.Millisecond
	defaultCount            = 5
	defaultNotices          = 3
	maxCount                = 10000
	// maxBigBytes bounds the big tool so a test typo cannot exhaust memory.
	// Note that the SDK client by default rejects SSE events over 16 MiB
	// (mcp.DefaultMaxEventSize), so results near this bound need a client
	// with a larger StreamableClientTransport.MaxEventSize.
	maxBigBytes = 64 << 20
)

// New returns the SDK's streamable HTTP handler serving the demo tools, with
// a fresh mcp.Server for each session.
//
// Besides the Host check described at [Options.DisableLocalhostProtection],
// the SDK handler requires: POST with Content-Type application/json and an
// Accept header that allows both application/json and text/event-stream; GET
// with Accept allowing text/event-stream; a known Mcp-Session-Id on GET,
// DELETE and every POST after initialize (404 otherwise); bodies up to 4 MiB.
func New(opts Options) http.Handler {
	if opts.ProgressInterval <= 0 {
		opts.ProgressInterval = defaultProgressInterval
	}
	logger := opts.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	// Servers are built per session, so share the reflected tool schemas.
	cache := mcp.NewSchemaCache()
	// The SDK calls this for every HTTP request (it also uses the result to
	// validate MCP-Protocol-Version), but only connects a session to the
	// server built for a POST without Mcp-Session-Id. The others are cheap
	// garbage, which is why nothing here starts goroutines.
	getServer := func(*http.Request) *mcp.Server {
		return newServer(opts.ProgressInterval, logger, cache)
	}
	var store mcp.EventStore // none by default: this upstream is not resumable, on purpose
	if opts.EventStore {
		ms := mcp.NewMemoryEventStore(nil)
		if opts.EventStoreMaxBytes > 0 {
			ms.SetMaxBytes(opts.EventStoreMaxBytes)
		}
		store = ms
	}
	h := mcp.NewStreamableHTTPHandler(getServer, &mcp.StreamableHTTPOptions{
		EventStore: store,
		// Answer calls with text/event-stream, not a single JSON body, so
		// there is an SSE stream for the proxy to make resumable.
		JSONResponse:               false,
		Logger:                     logger,
		DisableLocalhostProtection: opts.DisableLocalhostProtection,
	})
	if opts.CloseStandaloneAfter <= 0 {
		return h
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet {
			ctx, cancel := context.WithTimeout(r.Context(), opts.CloseStandaloneAfter)
			defer cancel()
			r = r.WithContext(ctx)
		}
		h.ServeHTTP(w, r)
	})
}

// ListenAndServe serves New(opts) at "/mcp" on addr until ctx ends, then
// shuts the server down. It logs the address actually bound (useful with
// port 0) to opts.Logger.
func ListenAndServe(ctx context.Context, addr string, opts Options) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	logger := opts.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	mux := http.NewServeMux()
	mux.Handle("/mcp", New(opts))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}

	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	logger.Info("MCP demo server listening", "addr", ln.Addr().String(), "url", "http://"+ln.Addr().String()+"/mcp")

	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	// Standalone GET streams never go idle, so Shutdown alone would wait for
	// them until the grace period ends; then cut them off with Close.
	shutCtx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutCtx); err != nil {
		srv.Close()
	}
	if err := <-errc; !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// demo holds the state of one mcp.Server, which serves exactly one session.
type demo struct {
	interval time.Duration
	log      *slog.Logger

	// sessionCtx lives as long as the session. It is derived from
	// context.Background on purpose: the SDK routes a server->client message
	// to the SSE stream of the request whose ID it finds in the context, and
	// to the standalone GET stream when there is none. Background work must
	// therefore not use (even a WithoutCancel copy of) a request context.
	sessionCtx context.Context
	endSession context.CancelFunc
}

func newServer(interval time.Duration, logger *slog.Logger, cache *mcp.SchemaCache) *mcp.Server {
	d := &demo{interval: interval, log: logger}
	// No goroutine watches this context until a session initializes, so an
	// unused server leaks nothing.
	d.sessionCtx, d.endSession = context.WithCancel(context.Background())

	s := mcp.NewServer(&mcp.Implementation{Name: "mcp-demo-server", Version: "0.1.0"}, &mcp.ServerOptions{
		Logger:      logger,
		SchemaCache: cache,
	})
	s.AddReceivingMiddleware(d.onInitialize)
	mcp.AddTool(s, &mcp.Tool{
		Name:        "count",
		Description: "Counts to n, sending a progress notification per step, then returns.",
	}, d.count)
	mcp.AddTool(s, &mcp.Tool{
		Name:        "notify",
		Description: "Returns at once, then sends n logging notifications on the standalone GET stream.",
	}, d.notify)
	mcp.AddTool(s, &mcp.Tool{Name: "echo", Description: "Returns its text."}, echo)
	mcp.AddTool(s, &mcp.Tool{Name: "big", Description: "Returns a text result of the given number of bytes."}, big)
	return s
}

// onInitialize runs once the session's initialize request succeeds.
//
// It seeds the session's log level with "info": in a stateful session the SDK
// drops every ServerSession.Log until the client sends logging/setLevel (the
// Go SDK client never does so on its own), and the notify tool should work
// without client setup. A later logging/setLevel from the client overrides
// it. "info" is also the level the SDK itself assumes for stateless sessions.
// logging/setLevel has no other entry point than the method handler chain,
// hence the synthesized request.
//
// It also ends sessionCtx when the session closes, stopping notify goroutines.
func (d *demo) onInitialize(next mcp.MethodHandler) mcp.MethodHandler {
	return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
		res, err := next(ctx, method, req)
		if err != nil || method != "initialize" {
			return res, err
		}
		ss, ok := req.GetSession().(*mcp.ServerSession)
		if !ok {
			return res, err
		}
		setLevel := &mcp.ServerRequest[*mcp.SetLoggingLevelParams]{
			Session: ss,
			Params:  &mcp.SetLoggingLevelParams{Level: "info"},
		}
		if _, lerr := next(ctx, "logging/setLevel", setLevel); lerr != nil {
			d.log.Warn("seeding log level", "err", lerr)
		}
		go func() {
			ss.Wait()
			d.endSession()
		}()
		return res, err
	}
}

// intervalFor returns the pause to use for a call: ms when given, else the
// server's default.
func (d *demo) intervalFor(ms *int) (time.Duration, error) {
	if ms == nil {
		return d.interval, nil
	}
	if *ms < 0 {
		return 0, fmt.Errorf("interval_ms must be >= 0, got %d", *ms)
	}
	return time.Duration(*ms) * time.Millisecond, nil
}

type countArgs struct {
	N          int  `json:"n,omitempty" jsonschema:"number of steps; 0 or absent means 5; at most 10000"`
	IntervalMS *int `json:"interval_ms,omitempty" jsonschema:"milliseconds before each step; overrides the server default; 0 means no pause"`
	CloseAfter int  `json:"close_after,omitempty" jsonschema:"with an event store: close the call's SSE stream after this step (SSE polling)"`
	RetryMS    int  `json:"retry_ms,omitempty" jsonschema:"the retry delay announced when closing the stream"`
}

type countResult struct {
	Count int `json:"count"`
}

func (d *demo) count(ctx context.Context, req *mcp.CallToolRequest, args countArgs) (*mcp.CallToolResult, countResult, error) {
	n, err := orDefault("n", args.N, defaultCount)
	if err != nil {
		return nil, countResult{}, err
	}
	interval, err := d.intervalFor(args.IntervalMS)
	if err != nil {
		return nil, countResult{}, err
	}
	// Without a token the client asked for no progress; keep the pacing.
	token := req.Params.GetProgressToken()
	for i := 1; i <= n; i++ {
		if err := sleep(ctx, interval); err != nil {
			return nil, countResult{}, err
		}
		if token == nil {
			continue
		}
		// ctx carries the request ID, so the SDK writes this to the call's
		// own SSE response. If that response is gone (the client dropped
		// it) the SDK cannot deliver and, lacking an event store, forgets
		// it; the count goes on regardless, as a real upstream's would.
		err := req.Session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{
			ProgressToken: token,
			Progress:      float64(i),
			Total:         float64(n),
			Message:       fmt.Sprintf("step %d of %d", i, n),
		})
		if err != nil {
			d.log.Debug("progress notification not delivered", "step", i, "err", err)
		}
		if i == args.CloseAfter {
			if req.Extra != nil && req.Extra.CloseSSEStream != nil { // set with an event store, on 2025-11-25
				req.Extra.CloseSSEStream(mcp.CloseSSEStreamArgs{RetryAfter: time.Duration(args.RetryMS) * time.Millisecond})
			}
		}
	}
	return &mcp.CallToolResult{
		Content: []mcp.Content{&mcp.TextContent{Text: fmt.Sprintf("counted to %d", n)}},
	}, countResult{Count: n}, nil
}

type notifyArgs struct {
	N          int  `json:"n,omitempty" jsonschema:"number of notifications; 0 or absent means 3; at most 10000"`
	IntervalMS *int `json:"interval_ms,omitempty" jsonschema:"milliseconds before each notification; overrides the server default; 0 means no pause"`
}

func (d *demo) notify(_ context.Context, req *mcp.CallToolRequest, args notifyArgs) (*mcp.CallToolResult, any, error) {
	n, err := orDefault("n", args.N, defaultNotices)
	if err != nil {
		return nil, nil, err
	}
	interval, err := d.intervalFor(args.IntervalMS)
	if err != nil {
		return nil, nil, err
	}
	go d.sendNotices(req.Session, n, interval)
	return text(fmt.Sprintf("scheduled %d notifications", n)), nil, nil
}

// sendNotices sends n notifications/message (level info, logger "demo") from
// outside any request, so they go out on the standalone GET stream. If no GET
// stream is open at that moment the SDK drops them (no event store).
func (d *demo) sendNotices(ss *mcp.ServerSession, n int, interval time.Duration) {
	ctx := d.sessionCtx
	for i := 1; i <= n; i++ {
		if sleep(ctx, interval) != nil {
			return // session closed
		}
		err := ss.Log(ctx, &mcp.LoggingMessageParams{
			Level:  "info",
			Logger: "demo",
			Data:   fmt.Sprintf("notice %d of %d", i, n),
		})
		if err != nil {
			d.log.Debug("notice not delivered", "notice", i, "err", err)
		}
	}
}

type echoArgs struct {
	Text string `json:"text" jsonschema:"text to return"`
}

func echo(_ context.Context, _ *mcp.CallToolRequest, args echoArgs) (*mcp.CallToolResult, any, error) {
	return text(args.Text), nil, nil
}

type bigArgs struct {
	Bytes int `json:"bytes" jsonschema:"size of the text result in bytes; at most 64 MiB"`
}

func big(_ context.Context, _ *mcp.CallToolRequest, args bigArgs) (*mcp.CallToolResult, any, error) {
	if args.Bytes < 0 || args.Bytes > maxBigBytes {
		return nil, nil, fmt.Errorf("bytes must be in [0, %d], got %d", maxBigBytes, args.Bytes)
	}
	return text(BigText(args.Bytes)), nil, nil
}

// BigText returns the text the big tool answers for n bytes: a repeating
// printable pattern, so that truncation or reordering is visible in tests.
func BigText(n int) string {
	const pattern = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ\n"
	return strings.Repeat(pattern, n/len(pattern)+1)[:n]
}

func text(s string) *mcp.CallToolResult {
	return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: s}}}
}

// orDefault applies def to an absent (zero) count and bounds it.
func orDefault(name string, v, def int) (int, error) {
	if v == 0 {
		return def, nil
	}
	if v < 0 || v > maxCount {
		return 0, fmt.Errorf("%s must be in [1, %d], got %d", name, maxCount, v)
	}
	return v, nil
}

// sleep pauses for d, returning early with ctx.Err() if ctx ends. With d <= 0
// it only checks ctx, so a cancelled zero-interval loop still stops.
func sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
