package caddymodule

import (
	"strconv"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/dustin/go-humanize"
)

func init() {
	httpcaddyfile.RegisterHandlerDirective("mcp_resume", parseCaddyfile)
	// Inside encode (so it sees plain SSE), right before the proxy it wraps;
	// users need no `order` line.
	httpcaddyfile.RegisterDirectiveOrder("mcp_resume", httpcaddyfile.Before, "reverse_proxy")
}

func parseCaddyfile(h httpcaddyfile.Helper) (caddyhttp.MiddlewareHandler, error) {
	m := new(Handler)
	err := m.UnmarshalCaddyfile(h.Dispenser)
	return m, err
}

// UnmarshalCaddyfile sets up the handler from Caddyfile tokens. Syntax:
//
//	mcp_resume [<matcher>] {
//	    resume_window           <duration>
//	    max_stream_bytes        <size>
//	    max_session_bytes       <size>
//	    max_total_bytes         <size>
//	    max_event_bytes         <size>
//	    max_request_bytes       <size>
//	    max_sessions            <count>
//	    max_streams_per_session <count>
//	    stall_timeout           <duration>
//	    session_idle_timeout    <duration>
//	    keepalive               <duration>
//	    bind                    <placeholder...> | bearer
//	    rebind                  subject | upstream | off
//	    bind_headers            <header...>
//	    zone                    <name>
//	    store                   memory | nats { ... }
//	}
//
// Sizes take units (16MiB, 512MB, 1GiB); durations take Caddy's units (90s, 2m, 1d).
func (h *Handler) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // the directive name
	if d.NextArg() {
		return d.ArgErr()
	}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		name := d.Val()
		switch name {
		case "resume_window", "stall_timeout", "session_idle_timeout", "keepalive":
			var v string
			if !d.AllArgs(&v) {
				return d.Errf("%s: expected one duration, e.g. %s 2m", name, name)
			}
			dur, err := caddy.ParseDuration(v)
			if err != nil || dur <= 0 {
				return d.Errf("%s: %q is not a positive duration (e.g. 90s, 2m)", name, v)
			}
			*map[string]*caddy.Duration{
				"resume_window": &h.ResumeWindow, "stall_timeout": &h.StallTimeout,
				"session_idle_timeout": &h.SessionIdleTimeout, "keepalive": &h.Keepalive,
			}[name] = caddy.Duration(dur)
		case "max_stream_bytes", "max_session_bytes", "max_total_bytes", "max_event_bytes", "max_request_bytes":
			var v string
			if !d.AllArgs(&v) {
				return d.Errf("%s: expected one size, e.g. %s 16MiB", name, name)
			}
			n, err := humanize.ParseBytes(v)
			if err != nil || n == 0 || n > 1<<50 {
				return d.Errf("%s: %q is not a positive size (e.g. 16MiB, 512MB)", name, v)
			}
			*map[string]*int64{
				"max_stream_bytes": &h.MaxStreamBytes, "max_session_bytes": &h.MaxSessionBytes,
				"max_total_bytes": &h.MaxTotalBytes, "max_event_bytes": &h.MaxEventBytes,
				"max_request_bytes": &h.MaxRequestBytes,
			}[name] = int64(n)
		case "max_sessions", "max_streams_per_session":
			var v string
			if !d.AllArgs(&v) {
				return d.Errf("%s: expected one count", name)
			}
			n, err := strconv.Atoi(v)
			if err != nil || n <= 0 {
				return d.Errf("%s: %q is not a positive count", name, v)
			}
			*map[string]*int{"max_sessions": &h.MaxSessions, "max_streams_per_session": &h.MaxStreamsPerSession}[name] = n
		case "bind_headers":
			h.BindHeaders = d.RemainingArgs()
			if len(h.BindHeaders) == 0 {
				return d.Errf("bind_headers: expected one or more header names")
			}
		case "bind":
			h.Bind = d.RemainingArgs()
			if len(h.Bind) == 0 {
				return d.Errf("bind: expected placeholders (e.g. bind {http.auth.user.id}) or bearer")
			}
		case "rebind":
			if !d.AllArgs(&h.Rebind) {
				return d.Errf("rebind: expected one of subject, upstream, off")
			}
		case "zone":
			if !d.AllArgs(&h.Zone) {
				return d.Errf("zone: expected one name, e.g. zone site_a")
			}
		case "store":
			if !d.NextArg() {
				return d.Errf("store: expected a backend: memory, or nats { ... }")
			}
			backend := d.Val()
			mod, err := caddyfile.UnmarshalModule(d, "mcp_resume.stores."+backend)
			if err != nil {
				return d.Errf("store: %v", err)
			}
			h.StoreRaw = caddyconfig.JSONModuleObject(mod, "backend", backend, nil)
			continue // the store's block is consumed
		default:
			return d.Errf("unrecognized mcp_resume subdirective %q", name)
		}
		if d.NextArg() && name != "bind_headers" && name != "bind" {
			return d.Errf("%s: too many arguments", name)
		}
	}
	return nil
}

// Interface guard
var _ caddyfile.Unmarshaler = (*Handler)(nil)
