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
// classify, at the end of this file.

// refusal is a kind of answer the proxy writes itself.
type refusal uint8

const (
	refuseSessionIDs      refusal = iota // more than one Mcp-Session-Id
	refuseUnreadable                     // a POST body that could not be read
	refuseCredentials                    // another identity, or a credential the upstream does not vouch for
	refusePrincipal                      // a changed credential naming another principal
	refuseUnverifiable                   // a changed credential the proxy cannot tell is the principal's
	refuseCursor                         // a Last-Event-ID policy refuses (its detail says why)
	refuseSessionEnded                   // a resume of a session that ended meanwhile
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
	refuseSessionEnded:    {status: 400, code: jsonrpc.CodeResumeDenied, rejected: true, message: "the session ended"},
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

// refuseNew answers 503 to a request that would open a session or an
// upstream read the runtime cannot take now: a call while the process is
// stopping (the client retries, on another replica), or anything while the
// shared store is unreachable. It is asked before the request goes
// upstream: once the upstream has run a call, its answer reaches the client
// whatever the store says. It reports whether it answered.
func (h *Engine) refuseNew(w http.ResponseWriter, id string, call bool) bool {
	if call && h.rt.Draining() {
		h.refuse(w, refuseDraining, to{id: id})
		return true
	}
	if err := h.rt.Unavailable(); err != nil {
		h.logger.Warn("request refused: the shared store is unavailable", zap.Error(err))
		h.refuse(w, refuseUnavailable, to{id: id})
		return true
	}
	return false
}

// upstreamClass is what an upstream status says to the proxy.
type upstreamClass uint8

const (
	upstreamNone        upstreamClass = iota // no status (the upstream was unreachable)
	upstreamAccepted                         // 2xx
	upstreamSessionGone                      // 404: the upstream does not know the session
	upstreamDenied                           // 401, 403: the credential is refused
	upstreamRefused                          // any other 4xx but 409 and 429: asking again will not help
	upstreamRetry                            // 409 (it still holds another stream), 429, 5xx: may pass with time
	upstreamOther                            // 1xx, 3xx
)

// classify is the one reading of upstream statuses: the follower's
// (refused: do not ask again), the credential check's (the verdict), and
// the session's end (404), from one switch.
func classify(status int) upstreamClass {
	switch {
	case status == 0:
		return upstreamNone
	case status/100 == 2:
		return upstreamAccepted
	case status == http.StatusNotFound:
		return upstreamSessionGone
	case status == http.StatusUnauthorized || status == http.StatusForbidden:
		return upstreamDenied
	case status == http.StatusConflict || status == http.StatusTooManyRequests || status >= 500:
		return upstreamRetry
	case status >= 400:
		return upstreamRefused
	}
	return upstreamOther
}

// refused reports a status that a reconnect must not retry: the upstream
// does not know the stream or will not serve it. 409 (the upstream still
// holds the old connection) and 429 pass with time; 5xx may too.
func refused(status int) bool {
	switch classify(status) {
	case upstreamSessionGone, upstreamDenied, upstreamRefused:
		return true
	}
	return false
}
