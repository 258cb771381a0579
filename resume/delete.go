package resume

import (
	"net/http"

	"github.com/mcpresume/caddy-mcp-resume/buffer"
	"github.com/mcpresume/caddy-mcp-resume/policy"
)

// serveDelete forwards a session's DELETE and purges its logs once the
// upstream accepted it (or said it does not know the session).
func (h *Engine) serveDelete(w http.ResponseWriter, r *http.Request, next Next, sid string, seen buffer.Session) error {
	if sid == "" {
		return next.ServeHTTP(w, r)
	}
	sess, known := h.rt.store.Session(sid)
	if !known {
		return next.ServeHTTP(w, r)
	}
	if goOn, err := h.reauthorize(w, r, next, sid, policy.EndSession, seen, sess); !goOn {
		return err
	}
	return next.ServeHTTP(&statusWriter{
		writerWrapper: writerWrapper{ResponseWriter: w},
		onStatus: func(status int) {
			if c := policy.Classify(status); c == policy.UpstreamAccepted || c == policy.UpstreamSessionGone {
				h.rt.store.Delete(sid, policy.ReasonDeleted)
			}
		},
	}, r)
}
