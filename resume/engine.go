// Package resume is the protocol engine of mcp-resume, a net/http
// middleware with no Caddy in it: put in front of an MCP server's
// Streamable HTTP handler (the official Go SDK's StreamableHTTPHandler, an
// httputil.ReverseProxy, or Caddy's reverse_proxy through the caddymodule
// adapter), it makes the server's SSE streams resumable. It taps every SSE
// response into a per-session, per-stream retention log (package buffer, or
// a shared store such as package natsstore) under event IDs it mints, keeps
// reading the upstream after the client drops, follows an upstream that
// closes a stream early, answers GET with Last-Event-ID from the log, and
// binds sessions to their credentials. The rules live in package policy.
//
//	rt := resume.NewRuntime(buffer.NewMemoryStore(buffer.Options{Key: key}))
//	defer rt.Close()
//	eng, err := resume.New(resume.Config{}, rt)
//	http.Handle("/mcp", eng.Handler(mcpHandler))
//
// A request visits the stages in this order, each in one file: engine.go
// (the entry: credentials first, then dispatch by method), credentials.go
// (binding, the upstream vouching for a changed credential), calls.go
// (POSTs: initialize, requests, repeats, adoption), initialize.go (learning
// a session from the initialize response), tap.go (the one upstream reader,
// with tapwriter.go, the writer reverse_proxy writes into), follow.go
// (asking the upstream again when it closes a stream early), relay.go (log
// to client), resume.go (GET with Last-Event-ID), standalone.go (the GET
// stream and adoption on resume), delete.go, signals.go (gap events and the
// errors they carry), refusals.go (every answer the proxy writes itself).
// protocol.go is what the engine knows of Streamable HTTP; config.go the
// limits; runtime.go the store and its lifecycle (drain, stop); metrics.go
// the Prometheus collectors.
package resume

import (
	"net/http"

	"go.uber.org/zap"

	"github.com/mcpresume/caddy-mcp-resume/policy"
)

// Next is the handler the engine forwards to: the upstream. Caddy's
// caddyhttp.Handler satisfies it; NextHandler adapts an http.Handler.
type Next interface {
	ServeHTTP(http.ResponseWriter, *http.Request) error
}

// NextHandler adapts a net/http handler to Next.
func NextHandler(h http.Handler) Next { return nextHandler{h} }

type nextHandler struct{ h http.Handler }

func (n nextHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) error {
	n.h.ServeHTTP(w, r)
	return nil
}

// Engine is the middleware: one configuration on one Runtime (a store).
// Engines sharing a Runtime share its sessions.
type Engine struct {
	Config
	rt           *Runtime
	logger       *zap.Logger
	placeholders func(*http.Request, string) string
}

// New returns an engine with cfg (zero values take the defaults) on rt.
func New(cfg Config, rt *Runtime) (*Engine, error) {
	cfg.SetDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	h := &Engine{Config: cfg, rt: rt, logger: cfg.Logger, placeholders: cfg.Placeholders}
	if h.logger == nil {
		h.logger = zap.NewNop()
	}
	if h.placeholders == nil {
		h.placeholders = HeaderPlaceholders
	}
	return h, nil
}

// Runtime returns the engine's runtime.
func (h *Engine) Runtime() *Runtime { return h.rt }

// Handler returns the engine in front of next, as a net/http handler.
func (h *Engine) Handler(next http.Handler) http.Handler {
	n := NextHandler(next)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.ServeHTTP(w, r, n) // errors are next's, and an http.Handler returns none
	})
}

// ServeHTTP handles one request, forwarding to next what goes upstream; an
// error is next's (e.g. reverse_proxy's 502), for the caller to answer.
func (h *Engine) ServeHTTP(w http.ResponseWriter, r *http.Request, next Next) error {
	sid, ok := sessionIDOf(r)
	if !ok {
		return h.refuse(w, refuseSessionIDs, to{})
	}
	if _, ok := h.rt.Wait(r.Context()); !ok {
		return h.refuse(w, refuseConnecting, to{sid: sid})
	}
	// Any request naming a session the proxy holds (or remembers) must carry
	// its identity, whatever its method, version, content type or body, and
	// a credential the upstream accepts for it: checked first, so no path
	// around it exists.
	switch a, b := h.access(r, sid); policy.Authorize(a) {
	case policy.Deny:
		lastID := r.Header.Get(hdrLastEventID)
		if r.Method == http.MethodGet && lastID != "" {
			resumes.WithLabelValues(policy.Reject.String()).Inc()
		}
		return h.refuse(w, refuseCredentials, to{sid: sid, lastID: lastID})
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

// writerWrapper is the base of the engine's response writers: it passes
// everything to the writer it wraps, which http.ResponseController finds
// through Unwrap.
type writerWrapper struct{ http.ResponseWriter }

func (w *writerWrapper) Unwrap() http.ResponseWriter { return w.ResponseWriter }
