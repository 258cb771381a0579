// Package caddymodule is the Caddy glue of mcp-resume: the http.handlers.mcp_resume
// middleware, its Caddyfile directive, its admin API and its metrics. The
// retention logs live in package buffer and the rules in package policy;
// this package translates HTTP into calls on them.
//
// Files by concept: handler.go (the module and request dispatch), config.go
// (defaults and validation), caddyfile.go, protocol.go (what the proxy knows
// of Streamable HTTP), initialize.go (learning sessions), calls.go (POSTs
// with requests), tap.go (the one upstream tap), relay.go (log to client),
// resume.go (GET with Last-Event-ID), standalone.go (the GET stream and
// adoption), signals.go (gap events and errors), delete.go, zone.go (the
// stores), admin.go, metrics.go.
package caddymodule

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyevents"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/mcpresume/caddy-mcp-resume/internal/jsonrpc"
	"github.com/mcpresume/caddy-mcp-resume/policy"
)

func init() {
	caddy.RegisterModule(Handler{})
}

// Handler makes the SSE streams of MCP servers (Streamable HTTP, protocol
// versions 2025-03-26, 2025-06-18 and 2025-11-25) resumable. It taps every SSE
// response into a per-session, per-stream retention log under IDs it mints,
// keeps reading the upstream after the client leaves (and follows an upstream
// that closes a stream early), answers GET with Last-Event-ID from the log,
// and slows the upstream down instead of dropping events. Other traffic,
// including MCP 2026-07-28, passes through untouched.
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

	// Bound on retained bytes in the zone. A quarter of it is kept for
	// streams a client is reading. Default: 512 MiB.
	MaxTotalBytes int64 `json:"max_total_bytes,omitempty"`

	// Bound on one upstream SSE event (its fields as retained); a larger
	// event fails its stream. Default: 8 MiB.
	MaxEventBytes int64 `json:"max_event_bytes,omitempty"`

	// Bound on a POST body the handler inspects; larger bodies get 413.
	// Default: 8 MiB.
	MaxRequestBytes int64 `json:"max_request_bytes,omitempty"`

	// Bound on sessions held; beyond it initialize gets 503. Sessions
	// adopted on a POST alone have a quarter of it of their own. Default: 10000.
	MaxSessions int `json:"max_sessions,omitempty"`

	// Bound on calls running at once per session (live request streams);
	// beyond it a request gets 503. Default: 256.
	MaxStreamsPerSession int `json:"max_streams_per_session,omitempty"`

	// How long a full log may hold its upstream paused while its client makes
	// no progress before the stream fails with reason "stalled". Default: 2m.
	StallTimeout caddy.Duration `json:"stall_timeout,omitempty"`

	// How long a session with no connected client is kept; its detached
	// upstream reads end with it. Default: 10m.
	SessionIdleTimeout caddy.Duration `json:"session_idle_timeout,omitempty"`

	// Interval of SSE keep-alive comments on idle streams. Default: 15s.
	Keepalive caddy.Duration `json:"keepalive,omitempty"`

	// What a session is bound to at initialize: Caddy placeholders whose
	// values must stay the same for the session's life (the identity an
	// authentication handler before this one verified, e.g.
	// "{http.auth.user.id}"; a request with other values gets 403), and
	// "bearer": the Authorization header, which may change (OAuth clients
	// refresh their tokens) when the upstream accepts the new one for the
	// session (see rebind). Only keyed hashes are kept, with the list
	// itself: changing bind on reload applies to new sessions.
	// Default: ["bearer"].
	Bind []string `json:"bind,omitempty"`

	// How a changed bearer credential may take its session over: "subject"
	// (the upstream accepts it and it is a JWT naming the same issuer and
	// subject as the bound one; the default), "upstream" (the upstream
	// accepts it, for opaque tokens in front of an upstream that binds its
	// sessions to their user itself; JWTs naming another subject are still
	// refused) or "off" (a changed credential gets 403).
	Rebind string `json:"rebind,omitempty"`

	// Request headers whose values must stay the same for the session's
	// life, the form of bind before placeholders: bind_headers X-Api-Key is
	// bind {http.request.header.X-Api-Key}. Not with bind. A header listed
	// here is never vouched for by the upstream: bind_headers Authorization
	// locks out clients whose tokens rotate.
	BindHeaders []string `json:"bind_headers,omitempty"`

	// The retention store this handler uses. Handlers in one zone share
	// sessions and limits; sites with different upstreams should each have
	// their own. Default: "default".
	Zone string `json:"zone,omitempty"`

	// The zone's retention store, a module in the mcp_resume.stores
	// namespace: "memory" (the default: this process's memory) or "nats"
	// (NATS JetStream, shared by replicas and kept across restarts).
	StoreRaw json.RawMessage `json:"store,omitempty" caddy:"namespace=mcp_resume.stores inline_key=backend"`

	zone     *zone
	storeKey string
	logger   *zap.Logger
}

// CaddyModule returns the Caddy module information.
func (Handler) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.handlers.mcp_resume",
		New: func() caddy.Module { return new(Handler) },
	}
}

// Provision sets defaults and attaches the zone's retention store.
func (h *Handler) Provision(ctx caddy.Context) error {
	h.logger = ctx.Logger()
	h.setDefaults()
	if err := h.Validate(); err != nil {
		return err
	}
	for _, name := range h.BindHeaders {
		if strings.EqualFold(name, "Authorization") {
			h.logger.Warn("bind_headers Authorization: a client whose token rotates (OAuth) gets 403 on every request after its refresh; bind bearer lets the upstream vouch for refreshed tokens")
		}
	}
	var backend StoreModule = MemoryStore{}
	if h.StoreRaw != nil {
		mod, err := ctx.LoadModule(h, "StoreRaw")
		if err != nil {
			return fmt.Errorf("mcp_resume: store: %v", err)
		}
		backend = mod.(StoreModule)
	}
	h.storeKey = backend.Identity(h.Zone) // another store is another zone
	drain := DefaultDrainTimeout
	if n, ok := backend.(*NATSStore); ok {
		drain = n.drainTimeout()
	}
	z, err := loadZone(h.Zone, h.storeKey, backend, drain, h.limits(), h.MaxEventBytes, h.logger)
	if err != nil {
		return err
	}
	h.zone = z
	if err := registerMetrics(ctx.GetMetricsRegistry()); err != nil {
		return fmt.Errorf("mcp_resume: registering metrics: %v", err)
	}
	if app, err := ctx.App("events"); err == nil {
		events := app.(*caddyevents.App)
		// A shared store connects once Caddy runs this config: never for
		// `caddy validate`, which provisions but does not start.
		_ = events.On("started", eventHandler(z.open))
		// Detached upstream reads must not hold up `caddy stop` forever: Caddy
		// waits for in-flight requests before its exit hooks run. A reload
		// also emits "stopping", but then the streams carry on with the new
		// config.
		_ = events.On("stopping", eventHandler(func() {
			if caddy.Exiting() {
				z.exiting()
				boundDrainsLeftByReload()
			}
		}))
	}
	return nil
}

// Cleanup releases this instance's hold on its zone.
func (h *Handler) Cleanup() error {
	if h.zone != nil {
		return releaseZone(h.Zone, h.storeKey)
	}
	return nil
}

// ServeHTTP implements caddyhttp.MiddlewareHandler.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	sid, ok := sessionIDOf(r)
	if !ok {
		return h.reject(w, "", "", http.StatusBadRequest, "more than one Mcp-Session-Id")
	}
	if _, ok := h.zone.wait(r.Context()); !ok {
		return h.refuse(w, "", "connecting", "the retention store is not connected; retry later", 5)
	}
	// Any request naming a session the proxy holds (or remembers) must carry
	// its identity, whatever its method, version, content type or body, and
	// a credential the upstream accepts for it: checked first, so no path
	// around it exists.
	switch a, b := h.access(r, sid); policy.Authorize(a) {
	case policy.Deny:
		credentialRejections.Inc()
		lastID := r.Header.Get(hdrLastEventID)
		if r.Method == http.MethodGet && lastID != "" {
			resumes.WithLabelValues(policy.Reject.String()).Inc()
		}
		return h.reject(w, sid, lastID, http.StatusForbidden, "credentials differ from the session's")
	case policy.Vouch:
		if goOn, err := h.vouch(w, r, next, sid, a, b); !goOn {
			return err
		}
	}
	switch r.Method {
	case http.MethodPost:
		return h.servePost(w, r, next, sid)
	case http.MethodGet:
		if acceptsSSE(r) {
			return h.serveGet(w, r, next, sid)
		}
	case http.MethodDelete:
		return h.serveDelete(w, r, next, sid)
	}
	return next.ServeHTTP(w, r)
}

// reject answers a request the proxy refuses, with a JSON-RPC error body.
func (h *Handler) reject(w http.ResponseWriter, sid, lastID string, status int, detail string) error {
	h.logger.Warn("request rejected", zap.String("session", sid), zap.String("last_event_id", truncate(lastID, 80)),
		zap.Int("status", status), zap.String("why", detail))
	writeError(w, status, jsonrpc.CodeResumeDenied, "", "mcp-resume: "+detail)
	return nil
}

// detach returns a context for an upstream request that outlives the client
// connection (keeping the request's values, which reverse_proxy needs) but
// not Caddy itself. Callers also tie it to their session's end.
func (h *Handler) detach(r *http.Request) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(context.WithoutCancel(r.Context()))
	stop := context.AfterFunc(h.zone.stopCtx, cancel)
	return ctx, func() {
		stop()
		cancel()
	}
}

// refuseNew answers 503 to a request that would open a session or an
// upstream read the zone cannot take now: a call while the process is
// stopping (the client retries, on another replica), or anything while the
// shared store is unreachable. It is asked before the request goes
// upstream: once the upstream has run a call, its answer reaches the client
// whatever the store says. It reports whether it answered.
func (h *Handler) refuseNew(w http.ResponseWriter, id string, call bool) bool {
	if call && h.zone.draining.Load() {
		w.Header().Set("Connection", "close") // the retry goes to a replica that stays
		h.refuse(w, id, "draining", "this proxy is shutting down; retry", 1)
		return true
	}
	if err := h.zone.unavailable(); err != nil {
		h.logger.Warn("request refused: the shared store is unavailable", zap.Error(err))
		h.refuse(w, id, "unavailable", "the retention store is unavailable; retry later", 5)
		return true
	}
	return false
}

// refuse answers 503 with a JSON-RPC error and Retry-After.
func (h *Handler) refuse(w http.ResponseWriter, id, reason, why string, retryAfter int) error {
	storeRefusals.WithLabelValues(reason).Inc()
	w.Header().Set("Retry-After", strconv.Itoa(retryAfter))
	writeError(w, http.StatusServiceUnavailable, jsonrpc.CodeLimit, id, "mcp-resume: "+why)
	return nil
}

type eventHandler func()

func (f eventHandler) Handle(context.Context, caddy.Event) error { f(); return nil }

// Interface guards
var (
	_ caddy.Provisioner           = (*Handler)(nil)
	_ caddy.Validator             = (*Handler)(nil)
	_ caddy.CleanerUpper          = (*Handler)(nil)
	_ caddyhttp.MiddlewareHandler = (*Handler)(nil)
)
