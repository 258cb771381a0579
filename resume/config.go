package resume

import (
	"fmt"
	"net"
	"net/http"
	"regexp"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/mcpresume/caddy-mcp-resume/buffer"
	"github.com/mcpresume/caddy-mcp-resume/policy"
)

// Config is an engine's configuration; zero values take the defaults. The
// names in errors are the Caddyfile's (max_stream_bytes for MaxStreamBytes).
type Config struct {
	// How long an event stays retained after it was delivered to a client.
	ResumeWindow time.Duration
	// Bounds on retained bytes per stream, per session and in the store; on
	// one upstream event; on a POST body the engine inspects.
	MaxStreamBytes, MaxSessionBytes, MaxTotalBytes, MaxEventBytes, MaxRequestBytes int64
	// Bounds on sessions held, and on calls running at once per session.
	MaxSessions, MaxStreamsPerSession int
	// How long a full log may hold its upstream paused while its client
	// makes no progress; how long a session with no client is kept; the
	// interval of keep-alive comments.
	StallTimeout, SessionIdleTimeout, Keepalive time.Duration
	// What a session is bound to: placeholders (resolved by Placeholders)
	// and "bearer" (the Authorization header, which the upstream vouches for
	// when it changes). Default: ["bearer"]. BindHeaders is the older form:
	// header names.
	Bind, BindHeaders []string
	// How a changed bearer credential may take its session over: subject
	// (default), upstream or off.
	Rebind string
	// Placeholders replaces the placeholders of a Bind entry for a request.
	// Default: HeaderPlaceholders ({http.request.header.X}).
	Placeholders func(r *http.Request, s string) string
	// Logger gets the engine's logs. Default: none.
	Logger *zap.Logger
	// ClientConn returns the connection a request came on, or nil. With it
	// the tap may write a call's short answer to an HTTP/1 client itself,
	// when nothing sent on the connection waits in the kernel (sendqueue.go),
	// saving the relay a goroutine. Default: the connection ConnContext put
	// in the request's context.
	ClientConn func(r *http.Request) net.Conn
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

// BindBearer, in a binding, stands for the request's bearer credential (the
// Authorization header), which the upstream vouches for when it changes.
const BindBearer = "bearer"

// eventFraming bounds what the log adds to an event's fields: its "id:"
// line (at most eventid.MaxLen + 5 bytes), the closing blank line, and the
// chunk index and overhead an event alone in its chunk costs. Validate
// keeps max_event_bytes this far below max_stream_bytes, so an event within
// max_event_bytes always fits an empty stream.
const eventFraming = 64 + 4*16 + 64

// SetDefaults fills in the zero values.
func (c *Config) SetDefaults() {
	set := func(d *time.Duration, def time.Duration) {
		if *d == 0 {
			*d = def
		}
	}
	set(&c.ResumeWindow, DefaultResumeWindow)
	set(&c.StallTimeout, DefaultStallTimeout)
	set(&c.SessionIdleTimeout, DefaultSessionIdleTimeout)
	set(&c.Keepalive, DefaultKeepalive)
	setInt := func(v *int64, def int64) {
		if *v == 0 {
			*v = def
		}
	}
	setInt(&c.MaxStreamBytes, DefaultMaxStreamBytes)
	setInt(&c.MaxSessionBytes, DefaultMaxSessionBytes)
	setInt(&c.MaxTotalBytes, DefaultMaxTotalBytes)
	setInt(&c.MaxRequestBytes, DefaultMaxRequestBytes)
	if c.MaxEventBytes == 0 {
		c.MaxEventBytes = min(DefaultMaxEventBytes, c.MaxStreamBytes/2)
	}
	if c.MaxSessions == 0 {
		c.MaxSessions = DefaultMaxSessions
	}
	if c.MaxStreamsPerSession == 0 {
		c.MaxStreamsPerSession = DefaultMaxStreamsPerSession
	}
	if c.Bind == nil && c.BindHeaders == nil {
		c.Bind = []string{BindBearer}
	}
}

// Validate checks the configuration; errors name the option as the
// Caddyfile spells it.
func (c *Config) Validate() error {
	if c.MaxStreamBytes > 0 && c.MaxStreamBytes < 8<<10 {
		return fmt.Errorf("max_stream_bytes (%d) is too small; use at least 8KiB", c.MaxStreamBytes)
	}
	if c.MaxEventBytes > 0 && c.MaxEventBytes < 1<<10 {
		return fmt.Errorf("max_event_bytes (%d) is too small for MCP messages; use at least 1KiB", c.MaxEventBytes)
	}
	type pos struct {
		name string
		v    int64
	}
	for _, p := range []pos{
		{"resume_window", int64(c.ResumeWindow)}, {"stall_timeout", int64(c.StallTimeout)},
		{"session_idle_timeout", int64(c.SessionIdleTimeout)}, {"keepalive", int64(c.Keepalive)},
		{"max_stream_bytes", c.MaxStreamBytes}, {"max_session_bytes", c.MaxSessionBytes},
		{"max_total_bytes", c.MaxTotalBytes}, {"max_event_bytes", c.MaxEventBytes},
		{"max_request_bytes", c.MaxRequestBytes}, {"max_sessions", int64(c.MaxSessions)},
		{"max_streams_per_session", int64(c.MaxStreamsPerSession)},
	} {
		if p.v < 0 {
			return fmt.Errorf("%s must be positive, got %d", p.name, p.v)
		}
	}
	switch {
	case c.MaxEventBytes+eventFraming > c.MaxStreamBytes:
		return fmt.Errorf("max_event_bytes (%d) must be at least %d bytes smaller than max_stream_bytes (%d), or the largest event could never be retained", c.MaxEventBytes, eventFraming, c.MaxStreamBytes)
	case c.MaxStreamBytes > c.MaxSessionBytes:
		return fmt.Errorf("max_stream_bytes (%d) must not exceed max_session_bytes (%d)", c.MaxStreamBytes, c.MaxSessionBytes)
	case c.MaxSessionBytes > c.MaxTotalBytes:
		return fmt.Errorf("max_session_bytes (%d) must not exceed max_total_bytes (%d)", c.MaxSessionBytes, c.MaxTotalBytes)
	case c.Keepalive < 100*time.Millisecond:
		return fmt.Errorf("keepalive (%s) is too short; use at least 100ms", c.Keepalive)
	case c.Keepalive >= time.Minute:
		return fmt.Errorf("keepalive (%s) must be under 1m: load balancers and proxies commonly cut connections idle for 60s", c.Keepalive)
	}
	if c.Bind != nil && c.BindHeaders != nil {
		return fmt.Errorf("bind and bind_headers: use one (bind_headers X is bind {http.request.header.X})")
	}
	if c.Bind != nil && len(c.Bind) == 0 {
		return fmt.Errorf("bind: expected placeholders (e.g. {http.auth.user.id}) or bearer")
	}
	for _, v := range c.Bind {
		if v != BindBearer && !placeholderRE.MatchString(v) {
			return fmt.Errorf("bind: %q is neither a placeholder (e.g. {http.auth.user.id}, {http.request.header.X-User}) nor bearer", v)
		}
	}
	if c.Rebind != "" && !hasBearer(c.binding()) {
		return fmt.Errorf("rebind applies to a bearer credential, and bind has no bearer")
	}
	for _, name := range c.BindHeaders {
		if name == "" || strings.ContainsAny(name, " :{}\r\n") || name == BindBearer {
			return fmt.Errorf("bind_headers: %q is not a header name", name)
		}
	}
	if _, ok := policy.RebindModes[c.Rebind]; !ok && c.Rebind != "" {
		return fmt.Errorf("rebind: %q is not one of subject, upstream, off", c.Rebind)
	}
	return nil
}

// placeholderRE: a bind value holds at least one well-formed placeholder
// and no stray brace (a literal would bind everyone to the same value).
var placeholderRE = regexp.MustCompile(`^[^{}]*(\{[^{}\s]+\}[^{}]*)+$`)

// Limits are the store's bounds under this configuration.
func (c *Config) Limits() buffer.Limits {
	return buffer.Limits{
		MaxStreamBytes:       c.MaxStreamBytes,
		MaxSessionBytes:      c.MaxSessionBytes,
		MaxTotalBytes:        c.MaxTotalBytes,
		MaxSessions:          c.MaxSessions,
		MaxStreamsPerSession: c.MaxStreamsPerSession,
		ResumeWindow:         c.ResumeWindow,
		StallTimeout:         c.StallTimeout,
		SessionIdleTimeout:   c.SessionIdleTimeout,
	}
}
