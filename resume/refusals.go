package resume

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/mcpresume/caddy-mcp-resume/internal/jsonrpc"
)

// Every answer the proxy writes itself instead of the upstream's, in one
// table: a JSON-RPC error body (with the request's id when it is known)
// under an HTTP status, Retry-After for what passes with time, the metric
// that counts it, and the message, always "mcp-resume: ..." (README.md
// lists them). What the upstream answers is classified in one place too:
// policy.Classify.

// refusal is a kind of answer the proxy writes itself.
type refusal uint8

const (
	refuseSessionIDs      refusal = iota // more than one Mcp-Session-Id
	refuseUnreadable                     // a POST body that could not be read
	refuseCredentials                    // another identity, or a credential the upstream does not vouch for
	refusePrincipal                      // a changed credential naming another principal
	refuseUnverifiable                   // a changed credential the proxy cannot tell is the principal's
	refuseCursor                         // a Last-Event-ID policy refuses (its detail says why)
	refuseStandalone                     // the standalone stream cannot take a client now
	refuseConnecting                     // the shared store is not connected yet
	refuseUnavailable                    // the shared store lost its connection
	refuseDraining                       // the process is stopping: no new calls
	refuseUnchecked                      // the upstream gave no verdict on a credential
	refuseMaxSessions                    // max_sessions reached
	refuseMaxStreams                     // max_streams_per_session reached
	refuseMaxRequestBytes                // a body over max_request_bytes
	refuseIdentityMissing                // bind came out empty: the proxy is misconfigured
)

// refusalRow is one kind's answer. retryAfter 0 is none; vec and label (or
// counter) count it; rejected ones are logged as "request rejected".
type refusalRow struct {
	status     int
	code       int
	retryAfter int
	vec        *prometheus.CounterVec
	label      string
	counter    prometheus.Counter
	closeConn  bool
	rejected   bool
	message    string // a format when the kind takes arguments
}

var refusals = [...]refusalRow{
	refuseSessionIDs:      {status: 400, code: jsonrpc.CodeResumeDenied, rejected: true, message: "more than one Mcp-Session-Id"},
	refuseUnreadable:      {status: 400, code: jsonrpc.CodeResumeDenied, rejected: true, message: "the request body could not be read"},
	refuseCredentials:     {status: 403, code: jsonrpc.CodeResumeDenied, rejected: true, counter: credentialRejections, message: "credentials differ from the session's"},
	refusePrincipal:       {status: 403, code: jsonrpc.CodeResumeDenied, rejected: true, counter: credentialRejections, message: "credentials name another principal than the session's"},
	refuseUnverifiable:    {status: 403, code: jsonrpc.CodeResumeDenied, rejected: true, counter: credentialRejections, message: "the credential changed and the proxy cannot tell it names the session's principal (see rebind)"},
	refuseCursor:          {status: 400, code: jsonrpc.CodeResumeDenied, rejected: true, message: "%s"},
	refuseStandalone:      {status: 503, code: jsonrpc.CodeResumeDenied, retryAfter: 5, rejected: true, message: "the session's standalone stream is unavailable"},
	refuseConnecting:      {status: 503, code: jsonrpc.CodeLimit, retryAfter: 5, vec: storeRefusals, label: "connecting", message: "the retention store is not connected; retry later"},
	refuseUnavailable:     {status: 503, code: jsonrpc.CodeLimit, retryAfter: 5, vec: storeRefusals, label: "unavailable", message: "the retention store is unavailable; retry later"},
	refuseDraining:        {status: 503, code: jsonrpc.CodeLimit, retryAfter: 1, vec: storeRefusals, label: "draining", closeConn: true, message: "this proxy is shutting down; retry"},
	refuseUnchecked:       {status: 503, code: jsonrpc.CodeLimit, retryAfter: 1, message: "the upstream could not check the request's credentials; retry"},
	refuseMaxSessions:     {status: 503, code: jsonrpc.CodeLimit, retryAfter: 5, vec: limitsHit, label: "max_sessions", message: "too many sessions (max_sessions); retry later"},
	refuseMaxStreams:      {status: 503, code: jsonrpc.CodeLimit, retryAfter: 5, vec: limitsHit, label: "max_streams_per_session", message: "too many open streams in this session (max_streams_per_session)"},
	refuseMaxRequestBytes: {status: 413, code: jsonrpc.CodeLimit, vec: limitsHit, label: "max_request_bytes", message: "request body exceeds max_request_bytes (%d)"},
	refuseIdentityMissing: {status: 500, code: jsonrpc.CodeResumeDenied, message: "the session's identity (bind) is empty: the proxy is misconfigured"},
}

// to is whom a refusal answers: the request's JSON-RPC id (canonical JSON)
// when one is known, and for the log its session and Last-Event-ID.
type to struct{ id, sid, lastID string }

// refuse writes the answer of kind k (args fill its message), counts and
// logs it. It returns nil: the request is answered.
func (h *Engine) refuse(w http.ResponseWriter, k refusal, t to, args ...any) error {
	row := refusals[k]
	msg := row.message
	if len(args) > 0 {
		msg = fmt.Sprintf(msg, args...)
	}
	switch {
	case row.vec != nil:
		row.vec.WithLabelValues(row.label).Inc()
	case row.counter != nil:
		row.counter.Inc()
	}
	if row.rejected {
		h.logger.Warn("request rejected", zap.String("session", t.sid), zap.String("last_event_id", truncate(t.lastID, 80)),
			zap.Int("status", row.status), zap.String("why", msg))
	}
	if row.retryAfter > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(row.retryAfter))
	}
	if row.closeConn {
		w.Header().Set("Connection", "close") // the retry goes to a replica that stays
	}
	var id json.RawMessage
	if t.id != "" {
		id = json.RawMessage(t.id)
	}
	body := jsonrpc.ErrorResponse(id, row.code, "mcp-resume: "+msg, nil)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(body))) // complete in itself, whatever the handler does next
	w.WriteHeader(row.status)
	w.Write(body)
	return nil
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}
