package caddymodule

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"sort"
	"strings"

	"github.com/caddyserver/caddy/v2"

	"github.com/mcpresume/caddy-mcp-resume/buffer"
	"github.com/mcpresume/caddy-mcp-resume/policy"
)

func init() {
	caddy.RegisterModule(adminAPI{})
}

// adminAPI serves mcp-resume's view on Caddy's admin endpoint:
//
//	GET    /mcp_resume/sessions       all sessions with their streams
//	GET    /mcp_resume/sessions/<id>  one session (the id path-escaped: / as %2F)
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

// sessionView is one session as the admin API shows it: with its zone.
type sessionView struct {
	Zone string `json:"zone"`
	buffer.SessionInfo
}

func (adminAPI) handleList(w http.ResponseWriter, r *http.Request) error {
	if r.Method != http.MethodGet {
		return caddy.APIError{HTTPStatus: http.StatusMethodNotAllowed, Err: fmt.Errorf("method not allowed")}
	}
	out := []sessionView{}
	eachStore(func(name string, st buffer.Backend) {
		for _, s := range st.Sessions() {
			out = append(out, sessionView{Zone: name, SessionInfo: s})
		}
	})
	sort.SliceStable(out, func(i, j int) bool { return out[i].Created.Before(out[j].Created) })
	return writeJSON(w, out)
}

func (adminAPI) handleSession(w http.ResponseWriter, r *http.Request) error {
	// Session IDs are any visible ASCII, "/" included: the path carries them
	// escaped.
	id, err := url.PathUnescape(strings.TrimPrefix(r.URL.EscapedPath(), adminPrefix+"/"))
	if id == "" || err != nil {
		return caddy.APIError{HTTPStatus: http.StatusBadRequest, Err: fmt.Errorf("expected %s/<session id, path-escaped>", adminPrefix)}
	}
	found := false
	var view sessionView
	var store buffer.Store
	eachStore(func(name string, st buffer.Backend) {
		if info, ok := st.SessionInfo(id); ok && !found {
			found, store = true, st
			view = sessionView{Zone: name, SessionInfo: info}
		}
	})
	switch {
	case !found:
		return caddy.APIError{HTTPStatus: http.StatusNotFound, Err: fmt.Errorf("no session %q", id)}
	case r.Method == http.MethodGet:
		return writeJSON(w, view)
	case r.Method == http.MethodDelete:
		store.Delete(id, policy.ReasonPurged)
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
