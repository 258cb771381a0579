package caddymodule

import (
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
)

func TestUnmarshalCaddyfile(t *testing.T) {
	d := caddyfile.NewTestDispenser(`mcp_resume {
		resume_window 90s
		max_stream_bytes 1MiB
		max_session_bytes 4MiB
		max_total_bytes 64MiB
		max_event_bytes 256KiB
		max_request_bytes 1MB
		max_sessions 50
		max_streams_per_session 8
		stall_timeout 30s
		session_idle_timeout 1h
		keepalive 10s
		bind_headers Authorization X-Api-Key
	}`)
	var h Handler
	if err := h.UnmarshalCaddyfile(d); err != nil {
		t.Fatal(err)
	}
	want := Handler{
		ResumeWindow: caddy.Duration(90 * time.Second), MaxStreamBytes: 1 << 20, MaxSessionBytes: 4 << 20,
		MaxTotalBytes: 64 << 20, MaxEventBytes: 256 << 10, MaxRequestBytes: 1000000, MaxSessions: 50,
		MaxStreamsPerSession: 8, StallTimeout: caddy.Duration(30 * time.Second),
		SessionIdleTimeout: caddy.Duration(time.Hour), Keepalive: caddy.Duration(10 * time.Second),
		BindHeaders: []string{"Authorization", "X-Api-Key"},
	}
	if h.ResumeWindow != want.ResumeWindow || h.MaxStreamBytes != want.MaxStreamBytes || h.MaxSessionBytes != want.MaxSessionBytes ||
		h.MaxTotalBytes != want.MaxTotalBytes || h.MaxEventBytes != want.MaxEventBytes || h.MaxRequestBytes != want.MaxRequestBytes ||
		h.MaxSessions != want.MaxSessions || h.MaxStreamsPerSession != want.MaxStreamsPerSession || h.StallTimeout != want.StallTimeout ||
		h.SessionIdleTimeout != want.SessionIdleTimeout || h.Keepalive != want.Keepalive ||
		strings.Join(h.BindHeaders, ",") != strings.Join(want.BindHeaders, ",") {
		t.Fatalf("got %+v", h)
	}
	h.setDefaults()
	if err := h.Validate(); err != nil {
		t.Fatal(err)
	}
}

func TestCaddyfileErrorsNameTheSubdirective(t *testing.T) {
	for input, want := range map[string]string{
		"mcp_resume {\n resume_window banana\n}":  "resume_window",
		"mcp_resume {\n max_stream_bytes lots\n}": "max_stream_bytes",
		"mcp_resume {\n max_sessions -1\n}":       "max_sessions",
		"mcp_resume {\n keepalive 1s 2s\n}":       "keepalive",
		"mcp_resume {\n bind_headers\n}":          "bind_headers",
		"mcp_resume {\n bind\n}":                  "bind",
		"mcp_resume {\n rebind\n}":                "rebind",
		"mcp_resume {\n rebind a b\n}":            "rebind",
		"mcp_resume {\n replay_everything yes\n}": "replay_everything",
		"mcp_resume extra":                        "wrong argument count",
	} {
		var h Handler
		err := h.UnmarshalCaddyfile(caddyfile.NewTestDispenser(input))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: error %v, want it to mention %q", input, err, want)
		}
	}
}

// What the Caddyfile lets through but the configuration cannot mean fails
// validation, naming the subdirective.
func TestBindingValidation(t *testing.T) {
	for _, c := range []struct {
		h    Handler
		want string
	}{
		{Handler{Bind: []string{"{http.auth.user.id}"}, BindHeaders: []string{"X-User"}}, "bind and bind_headers"},
		{Handler{Bind: []string{"user"}}, `bind: "user" is neither a placeholder`},
		{Handler{Bind: []string{}}, "bind: expected"},
		{Handler{BindHeaders: []string{"{http.auth.user.id}"}}, "bind_headers: "},
		{Handler{Rebind: "sometimes"}, `rebind: "sometimes"`},
	} {
		c.h.setDefaults()
		if err := c.h.Validate(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want an error mentioning %q", c.h.Bind, err, c.want)
		}
	}
	for _, h := range []Handler{
		{Bind: []string{"{http.auth.user.id}", "bearer"}, Rebind: "upstream"},
		{Bind: []string{"tenant-{http.request.header.X-Tenant}"}},
		{Bind: []string{"bearer"}, Rebind: "off"},
		{BindHeaders: []string{"X-Api-Key"}},
	} {
		h.setDefaults()
		if err := h.Validate(); err != nil {
			t.Errorf("%+v: %v", h.Bind, err)
		}
	}
}

func TestDefaultsAreValid(t *testing.T) {
	var h Handler
	h.setDefaults()
	if err := h.Validate(); err != nil {
		t.Fatal(err)
	}
	if h.MaxEventBytes != DefaultMaxEventBytes || strings.Join(h.Bind, ",") != "bearer" || h.Rebind != "" {
		t.Fatalf("defaults: %+v", h)
	}
}
