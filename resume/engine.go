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
// A request visits the stages in this order, each in one file it stays in
// (go run ./internal/reqpath counts the returns to a file already left):
//
//	engine.go       the entry: Engine, New, Handler, ServeHTTP (credentials
//	                first, then dispatch by request kind), and what the
//	                engine knows of Streamable HTTP (headers, versions)
//	credentials.go  the credential gate (policy.Authorize, the upstream
//	                vouching for a changed credential) and session binding
//	calls.go        POSTs: initialize, requests, repeats, adoption on POST
//	initialize.go   learning a session from the initialize response
//	tap.go          a call tapped: the one upstream reader and the writer
//	                the upstream writes into
//	follow.go       asking the upstream again when it ends a stream early,
//	                or for a call whose producer replica died (takeOver,
//	                takeBack)
//	relay.go        all a client is written: headers, preambles, the relay
//	resume.go       GETs: Last-Event-ID and the resume decision's outcomes
//	standalone.go   the standalone GET stream, its upstream GET (opened only
//	                once the previous one is closed: the producer handover),
//	                and one adoption of a session at a time
//	delete.go       DELETE
//	signals.go      the gap events and errors a failing stream's log gets
//	refusals.go     every answer the proxy writes itself, in one table
//
// Beside the path: config.go (Config, defaults, validation), runtime.go
// (the store and its lifecycle: drain, stop, taps; admission of new work),
// metrics.go (the Prometheus collectors). Upstream statuses are read by
// policy.Classify.
package resume

import (
	"mime"
	"net/http"
	"strings"

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
// The store takes cfg's limits (engines sharing a runtime share them: the
// last one made sets them).
func New(cfg Config, rt *Runtime) (*Engine, error) {
	cfg.SetDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if st, ok := rt.Store(); ok {
		st.SetLimits(cfg.Limits())
	}
	h := &Engine{Config: cfg, rt: rt, logger: cfg.Logger, placeholders: cfg.Placeholders}
	if h.logger == nil {
		h.logger = zap.NewNop()
	}
	if h.placeholders == nil {
		h.placeholders = HeaderPlaceholders
	}
	if h.ClientConn == nil {
		h.ClientConn = connOf
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
	kind := requestKind(r)
	// Any request naming a session the proxy holds (or remembers) must carry
	// its identity, whatever its method, version, content type or body, and
	// a credential the upstream accepts for it: checked first, so no path
	// around it exists.
	seen, goOn, err := h.authorizeSeen(w, r, next, sid, kind)
	if !goOn {
		return err
	}
	// What the proxy takes part in: JSON POSTs and SSE GETs of versions
	// with resumable streams, and DELETEs. The rest passes through.
	if v := r.Header.Get(hdrVersion); v != "" && !resumable(v) && kind != policy.EndSession {
		return next.ServeHTTP(w, r)
	}
	switch kind {
	case policy.Call:
		if isJSON(r.Header.Get("Content-Type")) {
			return h.servePost(w, r, next, sid, seen)
		}
	case policy.ReadsLog:
		if sid != "" {
			return h.serveGet(w, r, next, sid, seen)
		}
	case policy.EndSession:
		return h.serveDelete(w, r, next, sid, seen)
	}
	return next.ServeHTTP(w, r)
}

// writerWrapper is the base of the engine's response writers: it passes
// everything to the writer it wraps, which http.ResponseController finds
// through Unwrap.
type writerWrapper struct{ http.ResponseWriter }

func (w *writerWrapper) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// What the engine knows of MCP's Streamable HTTP transport: header names,
// which protocol versions have resumable streams, how requests and SSE
// responses are recognised. (The proxy's own answers are refusals.go's;
// what upstream statuses mean is policy.Classify.)

// Header names (canonical form; matching is case-insensitive).
const (
	hdrSessionID   = "Mcp-Session-Id"
	hdrVersion     = "Mcp-Protocol-Version"
	hdrLastEventID = "Last-Event-Id"
)

// resumable reports whether a protocol version has resumable streams.
// 2026-07-28 removed them (a closed stream is a cancellation there), and
// versions this proxy does not know pass through untouched.
func resumable(version string) bool {
	switch version {
	case "2025-03-26", "2025-06-18", "2025-11-25":
		return true
	}
	return false
}

// defaultVersion is what the spec says to assume without a version header.
const defaultVersion = "2025-03-26"

func acceptsSSE(r *http.Request) bool {
	for _, v := range r.Header.Values("Accept") {
		if strings.Contains(v, "text/event-stream") {
			return true
		}
	}
	return false
}

func isJSON(contentType string) bool {
	if contentType == "application/json" {
		return true // as SDKs send it: no parameters to parse
	}
	ct, _, _ := mime.ParseMediaType(contentType)
	return ct == "application/json"
}

// sessionIDOf returns the request's Mcp-Session-Id, and false if it carries
// the header more than once: the proxy checks one value and the upstream
// might read another, so such requests are refused.
func sessionIDOf(r *http.Request) (string, bool) {
	vs := r.Header.Values(hdrSessionID)
	switch len(vs) {
	case 0:
		return "", true
	case 1:
		return vs[0], true
	}
	return "", false
}

// requestKind is what a request could get from the proxy's logs.
func requestKind(r *http.Request) policy.RequestKind {
	switch {
	case r.Method == http.MethodPost:
		return policy.Call
	case r.Method == http.MethodGet && acceptsSSE(r):
		return policy.ReadsLog
	case r.Method == http.MethodDelete:
		return policy.EndSession
	}
	return policy.OtherKind
}

// tappable reports whether an upstream response is an SSE stream the proxy
// can read: a 200 text/event-stream in plain bytes. (Tapped requests ask the
// upstream for identity encoding; one that compresses anyway passes through.)
func tappable(status int, h http.Header) bool {
	if status != http.StatusOK {
		return false
	}
	if ct := h.Get("Content-Type"); ct != "text/event-stream" { // as SDKs send it: no parameters to parse
		if ct, _, _ = mime.ParseMediaType(ct); ct != "text/event-stream" {
			return false
		}
	}
	enc := strings.TrimSpace(h.Get("Content-Encoding"))
	return enc == "" || strings.EqualFold(enc, "identity")
}
