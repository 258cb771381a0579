package caddymodule

import (
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/mcpresume/caddy-mcp-resume/buffer"
	"github.com/mcpresume/caddy-mcp-resume/policy"
)

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
	DefaultZone                 = "default"
)

// eventFraming bounds what the log adds to an event's fields: its "id:"
// line (at most eventid.MaxLen + 5 bytes), the closing blank line, and the
// chunk index and overhead an event alone in its chunk costs. Validate
// keeps max_event_bytes this far below max_stream_bytes, so an event within
// max_event_bytes always fits an empty stream.
const eventFraming = 64 + 4*16 + 64

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
	if h.Bind == nil && h.BindHeaders == nil {
		h.Bind = []string{bindBearer}
	}
	if h.Zone == "" {
		h.Zone = DefaultZone
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
	case h.MaxEventBytes+eventFraming > h.MaxStreamBytes:
		return fmt.Errorf("mcp_resume: max_event_bytes (%d) must be at least %d bytes smaller than max_stream_bytes (%d), or the largest event could never be retained", h.MaxEventBytes, eventFraming, h.MaxStreamBytes)
	case h.MaxStreamBytes > h.MaxSessionBytes:
		return fmt.Errorf("mcp_resume: max_stream_bytes (%d) must not exceed max_session_bytes (%d)", h.MaxStreamBytes, h.MaxSessionBytes)
	case h.MaxSessionBytes > h.MaxTotalBytes:
		return fmt.Errorf("mcp_resume: max_session_bytes (%d) must not exceed max_total_bytes (%d)", h.MaxSessionBytes, h.MaxTotalBytes)
	case time.Duration(h.Keepalive) < 100*time.Millisecond:
		return fmt.Errorf("mcp_resume: keepalive (%s) is too short; use at least 100ms", time.Duration(h.Keepalive))
	case time.Duration(h.Keepalive) >= time.Minute:
		return fmt.Errorf("mcp_resume: keepalive (%s) must be under 1m: load balancers and proxies commonly cut connections idle for 60s", time.Duration(h.Keepalive))
	}
	if h.Bind != nil && h.BindHeaders != nil {
		return fmt.Errorf("mcp_resume: bind and bind_headers: use one (bind_headers X is bind {http.request.header.X})")
	}
	if h.Bind != nil && len(h.Bind) == 0 {
		return fmt.Errorf("mcp_resume: bind: expected placeholders (e.g. {http.auth.user.id}) or bearer")
	}
	for _, v := range h.Bind {
		if v != bindBearer && !placeholderRE.MatchString(v) {
			return fmt.Errorf("mcp_resume: bind: %q is neither a placeholder (e.g. {http.auth.user.id}, {http.request.header.X-User}) nor bearer", v)
		}
	}
	if h.Rebind != "" && !hasBearer(h.binding()) {
		return fmt.Errorf("mcp_resume: rebind applies to a bearer credential, and bind has no bearer")
	}
	for _, name := range h.BindHeaders {
		if name == "" || strings.ContainsAny(name, " :{}\r\n") || name == bindBearer {
			return fmt.Errorf("mcp_resume: bind_headers: %q is not a header name", name)
		}
	}
	if _, ok := policy.RebindModes[h.Rebind]; !ok && h.Rebind != "" {
		return fmt.Errorf("mcp_resume: rebind: %q is not one of subject, upstream, off", h.Rebind)
	}
	if !zoneNameRE.MatchString(h.Zone) {
		return fmt.Errorf("mcp_resume: zone: %q must be a plain name: 1 to 26 letters, digits, '_' or '-'", h.Zone)
	}
	return nil
}

// placeholderRE: a bind value holds at least one well-formed placeholder
// and no stray brace (a literal would bind everyone to the same value).
var placeholderRE = regexp.MustCompile(`^[^{}]*(\{[^{}\s]+\}[^{}]*)+$`)

// zoneNameRE: a zone names files and, in a shared store, NATS subjects.
var zoneNameRE = regexp.MustCompile(`^[A-Za-z0-9_-]{1,26}$`)

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
