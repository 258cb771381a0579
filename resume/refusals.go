package resume

import (
	"net/http"
	"strconv"

	"go.uber.org/zap"

	"github.com/mcpresume/caddy-mcp-resume/internal/jsonrpc"
)

// reject answers a request the proxy refuses, with a JSON-RPC error body.
func (h *Engine) reject(w http.ResponseWriter, sid, lastID string, status int, detail string) error {
	h.logger.Warn("request rejected", zap.String("session", sid), zap.String("last_event_id", truncate(lastID, 80)),
		zap.Int("status", status), zap.String("why", detail))
	writeError(w, status, jsonrpc.CodeResumeDenied, "", "mcp-resume: "+detail)
	return nil
}

// refuseNew answers 503 to a request that would open a session or an
// upstream read the zone cannot take now: a call while the process is
// stopping (the client retries, on another replica), or anything while the
// shared store is unreachable. It is asked before the request goes
// upstream: once the upstream has run a call, its answer reaches the client
// whatever the store says. It reports whether it answered.
func (h *Engine) refuseNew(w http.ResponseWriter, id string, call bool) bool {
	if call && h.rt.Draining() {
		w.Header().Set("Connection", "close") // the retry goes to a replica that stays
		h.refuse(w, id, "draining", "this proxy is shutting down; retry", 1)
		return true
	}
	if err := h.rt.Unavailable(); err != nil {
		h.logger.Warn("request refused: the shared store is unavailable", zap.Error(err))
		h.refuse(w, id, "unavailable", "the retention store is unavailable; retry later", 5)
		return true
	}
	return false
}

// refuse answers 503 with a JSON-RPC error and Retry-After.
func (h *Engine) refuse(w http.ResponseWriter, id, reason, why string, retryAfter int) error {
	storeRefusals.WithLabelValues(reason).Inc()
	w.Header().Set("Retry-After", strconv.Itoa(retryAfter))
	writeError(w, http.StatusServiceUnavailable, jsonrpc.CodeLimit, id, "mcp-resume: "+why)
	return nil
}
