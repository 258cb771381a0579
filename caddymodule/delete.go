package caddymodule

import (
	"net/http"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/mcpresume/caddy-mcp-resume/policy"
)

// serveDelete forwards a session's DELETE and purges its logs once the
// upstream accepted it (or said it does not know the session).
func (h *Handler) serveDelete(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler, sid string) error {
	if sid == "" {
		return next.ServeHTTP(w, r)
	}
	if _, known := h.zone.store.Session(sid); !known {
		return next.ServeHTTP(w, r)
	}
	return next.ServeHTTP(&statusWriter{
		ResponseWriterWrapper: &caddyhttp.ResponseWriterWrapper{ResponseWriter: w},
		onStatus: func(status int) {
			if status/100 == 2 || status == http.StatusNotFound {
				h.zone.store.Delete(sid, policy.ReasonDeleted)
			}
		},
	}, r)
}
