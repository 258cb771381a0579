package caddymodule

import (
	"fmt"
	"regexp"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/mcpresume/caddy-mcp-resume/resume"
)

// Defaults are the engine's (resume.Default*), and the zone's.
const (
	DefaultResumeWindow         = resume.DefaultResumeWindow
	DefaultMaxStreamBytes       = resume.DefaultMaxStreamBytes
	DefaultMaxSessionBytes      = resume.DefaultMaxSessionBytes
	DefaultMaxTotalBytes        = resume.DefaultMaxTotalBytes
	DefaultMaxEventBytes        = resume.DefaultMaxEventBytes
	DefaultMaxRequestBytes      = resume.DefaultMaxRequestBytes
	DefaultMaxSessions          = resume.DefaultMaxSessions
	DefaultMaxStreamsPerSession = resume.DefaultMaxStreamsPerSession
	DefaultStallTimeout         = resume.DefaultStallTimeout
	DefaultSessionIdleTimeout   = resume.DefaultSessionIdleTimeout
	DefaultKeepalive            = resume.DefaultKeepalive
	DefaultZone                 = "default"
)

// config is the handler's configuration as the engine's.
func (h *Handler) config() resume.Config {
	return resume.Config{
		ResumeWindow:         time.Duration(h.ResumeWindow),
		MaxStreamBytes:       h.MaxStreamBytes,
		MaxSessionBytes:      h.MaxSessionBytes,
		MaxTotalBytes:        h.MaxTotalBytes,
		MaxEventBytes:        h.MaxEventBytes,
		MaxRequestBytes:      h.MaxRequestBytes,
		MaxSessions:          h.MaxSessions,
		MaxStreamsPerSession: h.MaxStreamsPerSession,
		StallTimeout:         time.Duration(h.StallTimeout),
		SessionIdleTimeout:   time.Duration(h.SessionIdleTimeout),
		Keepalive:            time.Duration(h.Keepalive),
		Bind:                 h.Bind,
		BindHeaders:          h.BindHeaders,
		Rebind:               h.Rebind,
	}
}

// setDefaults fills in the engine's defaults and the zone's.
func (h *Handler) setDefaults() {
	c := h.config()
	c.SetDefaults()
	h.ResumeWindow, h.StallTimeout = caddy.Duration(c.ResumeWindow), caddy.Duration(c.StallTimeout)
	h.SessionIdleTimeout, h.Keepalive = caddy.Duration(c.SessionIdleTimeout), caddy.Duration(c.Keepalive)
	h.MaxStreamBytes, h.MaxSessionBytes, h.MaxTotalBytes = c.MaxStreamBytes, c.MaxSessionBytes, c.MaxTotalBytes
	h.MaxEventBytes, h.MaxRequestBytes = c.MaxEventBytes, c.MaxRequestBytes
	h.MaxSessions, h.MaxStreamsPerSession = c.MaxSessions, c.MaxStreamsPerSession
	h.Bind, h.BindHeaders = c.Bind, c.BindHeaders
	if h.Zone == "" {
		h.Zone = DefaultZone
	}
}

// Validate checks the configuration; errors name the subdirective.
func (h *Handler) Validate() error {
	c := h.config()
	if err := c.Validate(); err != nil {
		return fmt.Errorf("mcp_resume: %v", err)
	}
	if !zoneNameRE.MatchString(h.Zone) {
		return fmt.Errorf("mcp_resume: zone: %q must be a plain name: 1 to 26 letters, digits, '_' or '-'", h.Zone)
	}
	return nil
}

// zoneNameRE: a zone names files and, in a shared store, NATS subjects.
var zoneNameRE = regexp.MustCompile(`^[A-Za-z0-9_-]{1,26}$`)
