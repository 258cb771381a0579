package resume

import (
	"net/http"

	"github.com/mcpresume/caddy-mcp-resume/policy"
)

// serveDelete forwards a session's DELETE and purges its logs once the
// upstream accepted it (or said it does not know the session).
func (h *Engine) serveDelete(w http.ResponseWriter, r *http.Request, next Next, sid string) error {
	if sid == "" {
		return next.ServeHTTP(w, r)
	}
	if _, known := h.rt.store.Session(sid); !known {
		return next.ServeHTTP(w, r)
	}
	return next.ServeHTTP(&statusWriter{
		writerWrapper: &writerWrapper{ResponseWriter: w},
		onStatus: func(status int) {
			if c := policy.Classify(status); c == policy.UpstreamAccepted || c == policy.UpstreamSessionGone {
				h.rt.store.Delete(sid, policy.ReasonDeleted)
			}
		},
	}, r)
}
