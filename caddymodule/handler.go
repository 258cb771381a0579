// Package caddymodule is the Caddy glue of mcp-resume: the
// http.handlers.mcp_resume middleware, its Caddyfile directive, its admin
// API and its metrics registration. The protocol is package resume's (a
// net/http middleware with no Caddy in it), the retention logs package
// buffer's and the rules package policy's; this package configures an
// engine per handler and hands each request to it.
//
// Files: handler.go (the module: Provision, Cleanup, ServeHTTP), config.go
// (defaults and validation, as resume.Config), caddyfile.go, zone.go (the
// retention stores across reloads, their drains on reload and exit),
// lifecycle.go (a zone's life as a state machine: states, events, and the
// transitions as one pure function), store.go (the mcp_resume.stores
// namespace, its optional Drainer, and the memory store; the nats store is
// the module of package caddymodule/storenats), admin.go.
package caddymodule

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"strings"
	"sync/atomic"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyevents"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/mcpresume/caddy-mcp-resume/resume"
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
	engine   *resume.Engine
	storeKey string
	logger   *zap.Logger
	// connServers: the servers this handler registered resume.ConnContext on.
	connServers []*caddyhttp.Server
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
	cfg := h.config()
	z, err := loadZone(h.Zone, h.storeKey, backend, drainFor(backend), cfg.Limits(), h.MaxEventBytes, h.logger)
	if err != nil {
		return err
	}
	h.zone = z
	h.registerConnContext(ctx)
	cfg.Logger = h.logger
	cfg.Placeholders = replace
	if h.engine, err = resume.New(cfg, z.rt); err != nil {
		return fmt.Errorf("mcp_resume: %v", err)
	}
	if reg := ctx.GetMetricsRegistry(); reg != nil {
		if err := resume.Register(reg, storeViews); err != nil {
			return fmt.Errorf("mcp_resume: registering metrics: %v", err)
		}
	}
	if app, err := ctx.App("events"); err == nil {
		events := app.(*caddyevents.App)
		// A shared store connects once Caddy runs this config: never for
		// `caddy validate`, which provisions but does not start.
		_ = events.On("started", eventHandler(func() { z.fire(zoneOpen) }))
		// Detached upstream reads must not hold up `caddy stop` forever: Caddy
		// waits for in-flight requests before its exit hooks run. A reload
		// also emits "stopping", but then the streams carry on with the new
		// config.
		_ = events.On("stopping", eventHandler(func() {
			if caddy.Exiting() {
				z.exit()
			}
		}))
	}
	return nil
}

// Cleanup releases this instance's hold on its zone.
func (h *Handler) Cleanup() error {
	h.forgetConnServers()
	if h.zone != nil {
		return releaseZone(h.Zone, h.storeKey)
	}
	return nil
}

// ServeHTTP implements caddyhttp.MiddlewareHandler: the engine has it.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	groups, ok := r.Context().Value(routeGroupsKey).(map[string]struct{})
	if !ok {
		return h.engine.ServeHTTP(w, r, next)
	}
	g := &groupsAsAtEntry{next: next}
	if len(groups) > 0 {
		g.groups = maps.Clone(groups)
	}
	return h.engine.ServeHTTP(w, r, g)
}

// routeGroupsKey is the context key of the route groups a request entered
// (caddyhttp's routeGroupCtxKey, unexported: a caddy.CtxKey, so the same
// value names it).
const routeGroupsKey = caddy.CtxKey("route_group")

// groupsAsAtEntry runs the handlers after this one for each request the
// engine sends through them with the route groups the client's request had
// entered when it reached this one. The engine may send several: a ping
// that vouches for a credential before the request itself, the tap's later
// requests (a reconnect, a reopened GET). Each must run the grouped routes
// among those handlers (a rewrite, a handle) as the first did, not skip
// them as entered already (review 36: a rewrite after mcp_resume in a route
// was skipped on the tap's reconnect GET, which the upstream answered 404).
type groupsAsAtEntry struct {
	next   caddyhttp.Handler
	groups map[string]struct{} // as at entry (nil: none)
	used   atomic.Bool         // the first went through with the request's own record
}

func (g *groupsAsAtEntry) ServeHTTP(w http.ResponseWriter, r *http.Request) error {
	if !g.used.Swap(true) {
		return g.next.ServeHTTP(w, r)
	}
	fresh := make(map[string]struct{}, len(g.groups))
	maps.Copy(fresh, g.groups)
	return g.next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), routeGroupsKey, fresh)))
}

// replace resolves bind placeholders with the request's Caddy replacer, so
// bind sees what the handlers before this one set ({http.auth.user.id}).
func replace(r *http.Request, s string) string {
	repl, ok := r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer)
	if !ok {
		repl = caddy.NewReplacer()
	}
	return repl.ReplaceAll(s, "")
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
