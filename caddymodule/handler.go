// Package caddymodule is the Caddy glue of mcp-resume: the http.handlers.mcp_resume
// middleware, its Caddyfile directive, its admin API and its metrics. The
// retention logs live in package buffer and the decisions in package policy;
// this package translates HTTP into calls on them.
package caddymodule

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyevents"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/mcpresume/caddy-mcp-resume/buffer"
	"github.com/mcpresume/caddy-mcp-resume/policy"
)

func init() {
	caddy.RegisterModule(Handler{})
}

// Defaults, chosen so ordinary MCP traffic (small progress notifications,
// results of a few MiB) never meets backpressure.
const (
	DefaultResumeWindow         = 2 * time.Minute
	DefaultMaxStreamBytes       = 16 << 20
	DefaultMaxSessionBytes      = 64 << 20
	DefaultMaxTotalBytes        = 512 << 20
	DefaultMaxEventBytes        = 8 << 20
	DefaultMaxRequestBytes      = 8 << 20
	DefaultMaxSessions          = 10000
	DefaultMaxStreamsPerSession = 256
	DefaultStallTimeout         = 2 * time.Minute
	DefaultSessionIdleTimeout   = 10 * time.Minute
	DefaultKeepalive            = 15 * time.Second
)

// Handler makes the SSE streams of MCP servers (Streamable HTTP, protocol
// versions 2025-03-26, 2025-06-18 and 2025-11-25) resumable. It taps every SSE
// response into a per-session, per-stream retention log under IDs it mints,
// keeps reading the upstream after the client leaves, answers GET with
// Last-Event-ID from the log, and slows the upstream down instead of dropping
// events. Other traffic, including MCP 2026-07-28, passes through untouched.
//
// Put it before reverse_proxy (the Caddyfile directive is ordered there).
type Handler struct {
	// How long an event stays retained after it was delivered to a client, so
	// that a client that lost the connection can still ask for it. A stream
	// sustains at most max_stream_bytes per resume_window. Default: 2m.
	ResumeWindow caddy.Duration `json:"resume_window,omitempty"`

	// Bound on retained bytes per stream. Reaching it stops reading that
	// upstream response (backpressure). Default: 16 MiB.
	MaxStreamBytes int64 `json:"max_stream_bytes,omitempty"`

	// Bound on retained bytes per session. Default: 64 MiB.
	MaxSessionBytes int64 `json:"max_session_bytes,omitempty"`

	// Bound on retained bytes in the whole process. Default: 512 MiB.
	MaxTotalBytes int64 `json:"max_total_bytes,omitempty"`

	// Bound on one upstream SSE event; a larger event fails its stream.
	// Default: 8 MiB.
	MaxEventBytes int64 `json:"max_event_bytes,omitempty"`

	// Bound on a POST body the handler inspects; larger bodies get 413.
	// Default: 8 MiB.
	MaxRequestBytes int64 `json:"max_request_bytes,omitempty"`

	// Bound on sessions held; beyond it initialize gets 503. Default: 10000.
	MaxSessions int `json:"max_sessions,omitempty"`

	// Bound on live (or still retained) streams per session; beyond it a
	// request gets 503. Default: 256.
	MaxStreamsPerSession int `json:"max_streams_per_session,omitempty"`

	// How long a full log may block its upstream before the stream fails with
	// reason "stalled". Default: 2m.
	StallTimeout caddy.Duration `json:"stall_timeout,omitempty"`

	// How long a session with no connected client is kept; its detached
	// upstream reads end with it. Default: 10m.
	SessionIdleTimeout caddy.Duration `json:"session_idle_timeout,omitempty"`

	// Interval of SSE keep-alive comments on idle streams. Default: 15s.
	Keepalive caddy.Duration `json:"keepalive,omitempty"`

	// Request headers whose values bind a session at initialize; a later
	// request or resume with different values gets 403. Only a keyed hash is
	// kept. Default: ["Authorization"].
	BindHeaders []string `json:"bind_headers,omitempty"`

	zone   *zone
	logger *zap.Logger
}

// CaddyModule returns the Caddy module information.
func (Handler) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.handlers.mcp_resume",
		New: func() caddy.Module { return new(Handler) },
	}
}

// Provision sets defaults and attaches the shared retention store.
func (h *Handler) Provision(ctx caddy.Context) error {
	h.logger = ctx.Logger()
	h.setDefaults()
	if err := h.Validate(); err != nil {
		return err
	}
	z, err := loadZone(h.limits(), h.logger)
	if err != nil {
		return err
	}
	h.zone = z
	if err := registerMetrics(ctx.GetMetricsRegistry()); err != nil {
		return fmt.Errorf("mcp_resume: registering metrics: %v", err)
	}
	// Detached upstream reads must not hold up `caddy stop`: Caddy waits for
	// in-flight requests before its exit hooks run, so they are cancelled when
	// stopping starts. A reload also emits "stopping", but then the streams
	// (and the store) carry on with the new config.
	if app, err := ctx.App("events"); err == nil {
		_ = app.(*caddyevents.App).On("stopping", stoppingHandler(func() {
			if caddy.Exiting() {
				exitCancel()
				z.store.Close()
			}
		}))
	}
	return nil
}

func (h *Handler) setDefaults() {
	setDur := func(d *caddy.Duration, def time.Duration) {
		if *d == 0 {
			*d = caddy.Duration(def)
		}
	}
	setDur(&h.ResumeWindow, DefaultResumeWindow)
	setDur(&h.StallTimeout, DefaultStallTimeout)
	setDur(&h.SessionIdleTimeout, DefaultSessionIdleTimeout)
	setDur(&h.Keepalive, DefaultKeepalive)
	setInt := func(v *int64, def int64) {
		if *v == 0 {
			*v = def
		}
	}
	setInt(&h.MaxStreamBytes, DefaultMaxStreamBytes)
	setInt(&h.MaxSessionBytes, DefaultMaxSessionBytes)
	setInt(&h.MaxTotalBytes, DefaultMaxTotalBytes)
	setInt(&h.MaxRequestBytes, DefaultMaxRequestBytes)
	if h.MaxEventBytes == 0 {
		h.MaxEventBytes = min(DefaultMaxEventBytes, h.MaxStreamBytes/2)
	}
	if h.MaxSessions == 0 {
		h.MaxSessions = DefaultMaxSessions
	}
	if h.MaxStreamsPerSession == 0 {
		h.MaxStreamsPerSession = DefaultMaxStreamsPerSession
	}
	if h.BindHeaders == nil {
		h.BindHeaders = []string{"Authorization"}
	}
}

// Validate checks the configuration; errors name the subdirective.
func (h *Handler) Validate() error {
	if h.MaxStreamBytes > 0 && h.MaxStreamBytes < 8<<10 {
		return fmt.Errorf("mcp_resume: max_stream_bytes (%d) is too small; use at least 8KiB", h.MaxStreamBytes)
	}
	if h.MaxEventBytes > 0 && h.MaxEventBytes < 1<<10 {
		return fmt.Errorf("mcp_resume: max_event_bytes (%d) is too small for MCP messages; use at least 1KiB", h.MaxEventBytes)
	}
	type pos struct {
		name string
		v    int64
	}
	for _, p := range []pos{
		{"resume_window", int64(h.ResumeWindow)}, {"stall_timeout", int64(h.StallTimeout)},
		{"session_idle_timeout", int64(h.SessionIdleTimeout)}, {"keepalive", int64(h.Keepalive)},
		{"max_stream_bytes", h.MaxStreamBytes}, {"max_session_bytes", h.MaxSessionBytes},
		{"max_total_bytes", h.MaxTotalBytes}, {"max_event_bytes", h.MaxEventBytes},
		{"max_request_bytes", h.MaxRequestBytes}, {"max_sessions", int64(h.MaxSessions)},
		{"max_streams_per_session", int64(h.MaxStreamsPerSession)},
	} {
		if p.v < 0 {
			return fmt.Errorf("mcp_resume: %s must be positive, got %d", p.name, p.v)
		}
	}
	switch {
	case h.MaxEventBytes+buffer.EventOverhead > h.MaxStreamBytes:
		return fmt.Errorf("mcp_resume: max_event_bytes (%d) must be smaller than max_stream_bytes (%d), or the largest event could never be retained", h.MaxEventBytes, h.MaxStreamBytes)
	case h.MaxStreamBytes > h.MaxSessionBytes:
		return fmt.Errorf("mcp_resume: max_stream_bytes (%d) must not exceed max_session_bytes (%d)", h.MaxStreamBytes, h.MaxSessionBytes)
	case h.MaxSessionBytes > h.MaxTotalBytes:
		return fmt.Errorf("mcp_resume: max_session_bytes (%d) must not exceed max_total_bytes (%d)", h.MaxSessionBytes, h.MaxTotalBytes)
	case time.Duration(h.Keepalive) < 100*time.Millisecond:
		return fmt.Errorf("mcp_resume: keepalive (%s) is too short; use at least 100ms", time.Duration(h.Keepalive))
	case time.Duration(h.Keepalive) >= time.Minute:
		return fmt.Errorf("mcp_resume: keepalive (%s) must be under 1m, Caddy's default write idle timeout, or idle streams are cut", time.Duration(h.Keepalive))
	}
	for _, name := range h.BindHeaders {
		if name == "" || strings.ContainsAny(name, " :\r\n") {
			return fmt.Errorf("mcp_resume: bind_headers: %q is not a header name", name)
		}
	}
	return nil
}

func (h *Handler) limits() buffer.Limits {
	return buffer.Limits{
		MaxStreamBytes:       h.MaxStreamBytes,
		MaxSessionBytes:      h.MaxSessionBytes,
		MaxTotalBytes:        h.MaxTotalBytes,
		MaxSessions:          h.MaxSessions,
		MaxStreamsPerSession: h.MaxStreamsPerSession,
		ResumeWindow:         time.Duration(h.ResumeWindow),
		StallTimeout:         time.Duration(h.StallTimeout),
		SessionIdleTimeout:   time.Duration(h.SessionIdleTimeout),
	}
}

// Cleanup releases this instance's hold on the shared store.
func (h *Handler) Cleanup() error {
	if h.zone != nil {
		return releaseZone()
	}
	return nil
}

// ServeHTTP implements caddyhttp.MiddlewareHandler.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	// Any request naming a session the proxy holds (or remembers) must carry
	// its credentials, whatever its method, version, content type or body:
	// checked first, so no path around it exists.
	if sid := r.Header.Get(hdrSessionID); sid != "" && !h.sessionCredentialOK(r, sid) {
		credentialRejections.Inc()
		lastID := r.Header.Get(hdrLastEventID)
		if r.Method == http.MethodGet && lastID != "" {
			resumes.WithLabelValues(policy.Reject.String()).Inc()
		}
		return h.reject(w, sid, lastID, http.StatusForbidden, "credentials differ from the session's")
	}
	switch r.Method {
	case http.MethodPost:
		return h.servePost(w, r, next)
	case http.MethodGet:
		if acceptsSSE(r) {
			return h.serveGet(w, r, next)
		}
	case http.MethodDelete:
		return h.serveDelete(w, r, next)
	}
	return next.ServeHTTP(w, r)
}

// fingerprint is the keyed hash of the bound headers; the raw values are
// never kept.
func (h *Handler) fingerprint(r *http.Request) [32]byte {
	mac := hmac.New(sha256.New, h.zone.key)
	for _, name := range h.BindHeaders {
		for _, v := range r.Header.Values(name) {
			mac.Write([]byte(name))
			mac.Write([]byte{0})
			mac.Write([]byte(v))
			mac.Write([]byte{0})
		}
		mac.Write([]byte{1})
	}
	var fp [32]byte
	mac.Sum(fp[:0])
	return fp
}

// sessionCredentialOK checks a request against the session it names, held
// or remembered; a session the proxy knows nothing of has nothing to check.
func (h *Handler) sessionCredentialOK(r *http.Request, sid string) bool {
	if sess, ok := h.zone.store.Session(sid); ok {
		return h.credentialOK(r, sess.Meta().Fingerprint)
	}
	if tomb, ok := h.zone.store.Tombstone(sid); ok {
		return h.credentialOK(r, tomb.Fingerprint)
	}
	return true
}

func (h *Handler) credentialOK(r *http.Request, want [32]byte) bool {
	got := h.fingerprint(r)
	return hmac.Equal(got[:], want[:])
}

// detach returns a context for an upstream request that outlives the client
// connection (keeping the request's values, which reverse_proxy needs) but
// not Caddy itself. Callers also tie it to their session's end.
func (h *Handler) detach(r *http.Request) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(context.WithoutCancel(r.Context()))
	stop := context.AfterFunc(exitCtx, cancel)
	return ctx, func() {
		stop()
		cancel()
	}
}

// exitCtx ends when the process is exiting.
var exitCtx, exitCancel = context.WithCancel(context.Background())

type stoppingHandler func()

func (f stoppingHandler) Handle(context.Context, caddy.Event) error { f(); return nil }

// Interface guards
var (
	_ caddy.Provisioner           = (*Handler)(nil)
	_ caddy.Validator             = (*Handler)(nil)
	_ caddy.CleanerUpper          = (*Handler)(nil)
	_ caddyhttp.MiddlewareHandler = (*Handler)(nil)
)
