package resume

import (
	"bytes"
	"net/http"

	"go.uber.org/zap"

	"github.com/mcpresume/caddy-mcp-resume/buffer"
	"github.com/mcpresume/caddy-mcp-resume/internal/jsonrpc"
	"github.com/mcpresume/caddy-mcp-resume/internal/sse"
	"github.com/mcpresume/caddy-mcp-resume/policy"
)

// maxInitPeek bounds what is held back of an initialize response while the
// proxy learns the session from it.
const maxInitPeek = 1 << 20

// serveInitialize forwards an initialize request and learns the session from
// the response: the Mcp-Session-Id header and the negotiated version. The
// session is registered before any byte of the result reaches the client, so
// the client's next request always finds it. A session of a version without
// resumable streams is remembered too, so its traffic is never tapped later.
func (h *Engine) serveInitialize(w http.ResponseWriter, r *http.Request, next Next, call jsonrpc.Call) error {
	asked := call.ProtocolVersion
	tapped := asked == "" || resumable(asked)
	meta, unbound := h.newBinding(r)
	if tapped && !h.rt.store.Admit(policy.Initialized) {
		h.logger.Warn("initialize refused: max_sessions reached", zap.Int("max_sessions", h.MaxSessions))
		return h.refuse(w, refuseMaxSessions, to{id: jsonrpc.CanonicalID(call.ID)})
	}
	if tapped && unbound {
		h.logger.Error("session not bound: its bind placeholders are empty for this request; is the authentication handler before mcp_resume?",
			zap.Strings("bind", h.binding()))
		return h.refuse(w, refuseIdentityMissing, to{id: jsonrpc.CanonicalID(call.ID)})
	}
	up := r.Clone(r.Context())
	up.Header.Del("Accept-Encoding") // the response is read here
	iw := &initWriter{
		writerWrapper: &writerWrapper{ResponseWriter: w},
		h:             h,
		meta:          meta,
	}
	err := next.ServeHTTP(iw, up)
	iw.finish()
	return err
}

type initMode uint8

const (
	initUndecided initMode = iota
	initPass               // not a session-creating response, or learned already
	initJSON               // holding an application/json body until it is complete
	initSSE                // holding SSE bytes until the result event is parsed
)

// initWriter holds an initialize response back until it has learned the
// session from it (at most maxInitPeek bytes), then lets it through.
type initWriter struct {
	*writerWrapper
	h      *Engine
	meta   buffer.SessionMeta // the session's binding, its version and origin to come
	mode   initMode
	status int
	held   []byte
	parser sse.Parser
}

func (iw *initWriter) WriteHeader(status int) {
	if status < 200 {
		iw.writerWrapper.WriteHeader(status)
		return
	}
	iw.status = status
	sid := iw.Header().Get(hdrSessionID)
	switch {
	case status != http.StatusOK || sid == "":
		iw.mode = initPass
	case isJSON(iw.Header().Get("Content-Type")):
		iw.mode = initJSON
		return // held with the body
	case tappable(status, iw.Header()):
		iw.mode = initSSE
	default:
		iw.mode = initPass
	}
	iw.writerWrapper.WriteHeader(status)
}

func (iw *initWriter) Write(p []byte) (int, error) {
	if iw.mode == initUndecided {
		iw.WriteHeader(http.StatusOK)
	}
	switch iw.mode {
	case initJSON:
		iw.held = append(iw.held, p...)
		if len(iw.held) > maxInitPeek {
			iw.giveUp()
		}
		return len(p), nil
	case initSSE:
		iw.held = append(iw.held, p...)
		err := iw.parser.Feed(p, func(ev *sse.Event) error {
			var version string
			jsonrpc.PeekAll(ev.Data, func(m jsonrpc.Message) {
				if m.Kind == jsonrpc.Response {
					version = jsonrpc.ProtocolVersionOf(ev.Data)
				}
			})
			if version != "" {
				iw.learn(version)
			}
			return nil
		})
		if iw.mode == initSSE && (err != nil || len(iw.held) > maxInitPeek) {
			iw.giveUp()
		} else if iw.mode == initPass {
			held := iw.held
			iw.held = nil
			if _, err := iw.writerWrapper.Write(held); err != nil {
				return 0, err
			}
		}
		return len(p), nil
	}
	return iw.writerWrapper.Write(p)
}

// FlushError holds flushes while bytes are held back.
func (iw *initWriter) FlushError() error {
	if iw.mode == initJSON || iw.mode == initSSE {
		return nil
	}
	return http.NewResponseController(iw.writerWrapper.ResponseWriter).Flush()
}

// learn registers the session, once, with the negotiated version.
func (iw *initWriter) learn(version string) {
	iw.mode = initPass
	sid := iw.Header().Get(hdrSessionID)
	origin := policy.Initialized
	if !resumable(version) {
		origin = policy.Untapped
		iw.h.logger.Debug("session passes through: protocol version without resumption",
			zap.String("session", sid), zap.String("protocol_version", version))
	}
	meta := iw.meta
	meta.Version, meta.Origin = version, origin
	_, err := iw.h.rt.store.CreateSession(sid, meta)
	if err != nil {
		if origin == policy.Initialized {
			iw.h.logger.Warn("session not registered", zap.String("session", sid), zap.Error(err))
		}
		return
	}
	if origin == policy.Initialized {
		iw.h.logger.Info("session registered", zap.String("session", sid), zap.String("protocol_version", version))
	}
}

// giveUp stops inspecting and releases what was held.
func (iw *initWriter) giveUp() {
	iw.h.logger.Warn("initialize response too large or malformed to inspect; session passes through",
		zap.String("session", iw.Header().Get(hdrSessionID)))
	if iw.mode == initJSON {
		iw.writerWrapper.WriteHeader(iw.status)
	}
	iw.mode = initPass
	held := iw.held
	iw.held = nil
	iw.writerWrapper.Write(held)
}

// finish completes a held JSON response once the upstream is done.
func (iw *initWriter) finish() {
	switch iw.mode {
	case initJSON:
		if v := jsonrpc.ProtocolVersionOf(bytes.TrimSpace(iw.held)); v != "" {
			iw.learn(v)
		}
		iw.mode = initPass
		iw.writerWrapper.WriteHeader(iw.status)
		iw.writerWrapper.Write(iw.held)
	case initSSE:
		iw.mode = initPass
		iw.writerWrapper.Write(iw.held)
	}
}
