package caddymodule

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"

	"github.com/caddyserver/caddy/v2"

	"github.com/mcpresume/caddy-mcp-resume/policy"
)

func init() {
	caddy.RegisterModule(adminAPI{})
}

// adminAPI serves mcp-resume's view on Caddy's admin endpoint:
//
//	GET    /mcp_resume/sessions       all sessions with their streams
//	GET    /mcp_resume/sessions/<id>  one session
//	DELETE /mcp_resume/sessions/<id>  purge one session's logs
//
// It shows positions and sizes, never event payloads.
type adminAPI struct{}

// CaddyModule returns the Caddy module information.
func (adminAPI) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "admin.api.mcp_resume",
		New: func() caddy.Module { return new(adminAPI) },
	}
}

const adminPrefix = "/mcp_resume/sessions"

// Routes implements caddy.AdminRouter.
func (a adminAPI) Routes() []caddy.AdminRoute {
	return []caddy.AdminRoute{
		{Pattern: adminPrefix, Handler: caddy.AdminHandlerFunc(a.handleList)},
		{Pattern: adminPrefix + "/", Handler: caddy.AdminHandlerFunc(a.handleSession)},
	}
}

func (adminAPI) handleList(w http.ResponseWriter, r *http.Request) error {
	if r.Method != http.MethodGet {
		return caddy.APIError{HTTPStatus: http.StatusMethodNotAllowed, Err: fmt.Errorf("method not allowed")}
	}
	st, ok := currentStore()
	if !ok {
		return writeJSON(w, []any{})
	}
	return writeJSON(w, st.Sessions())
}

func (adminAPI) handleSession(w http.ResponseWriter, r *http.Request) error {
	id := strings.TrimPrefix(r.URL.Path, adminPrefix+"/")
	if id == "" || strings.Contains(id, "/") {
		return caddy.APIError{HTTPStatus: http.StatusBadRequest, Err: fmt.Errorf("expected %s/<session id>", adminPrefix)}
	}
	st, ok := currentStore()
	if !ok {
		return caddy.APIError{HTTPStatus: http.StatusNotFound, Err: fmt.Errorf("mcp_resume is not configured")}
	}
	sess, ok := st.Session(id)
	switch {
	case !ok:
		return caddy.APIError{HTTPStatus: http.StatusNotFound, Err: fmt.Errorf("no session %q", id)}
	case r.Method == http.MethodGet:
		return writeJSON(w, sess.Info())
	case r.Method == http.MethodDelete:
		st.Delete(id, policy.ReasonPurged)
		w.WriteHeader(http.StatusNoContent)
		return nil
	}
	return caddy.APIError{HTTPStatus: http.StatusMethodNotAllowed, Err: fmt.Errorf("method not allowed")}
}

func writeJSON(w http.ResponseWriter, v any) error {
	w.Header().Set("Content-Type", "application/json")
	return json.NewEncoder(w).Encode(v)
}

// Interface guards
var _ caddy.AdminRouter = adminAPI{}
