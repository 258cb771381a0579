package caddymodule

import (
	"sync"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/mcpresume/caddy-mcp-resume/resume"
)

// The engine writes a call's short answer to an HTTP/1 client itself when
// nothing sent on the client's connection waits in the kernel
// (resume/sendqueue.go), which spares the relay a goroutine. To ask, it
// needs the connection, which Caddy gives a handler only through a
// ConnContext registered on its server before the server starts: the
// handler registers resume.ConnContext on the servers of the http app that
// provisions it, once per server. Without it every relay has its goroutine.

// connServers are the servers resume.ConnContext is registered on, each by
// the handler that did it, until that handler's Cleanup (its config's end).
var connServers sync.Map // *caddyhttp.Server → *Handler

func (h *Handler) registerConnContext(ctx caddy.Context) {
	for _, m := range ctx.Modules() {
		app, ok := m.(*caddyhttp.App)
		if !ok {
			continue
		}
		for _, srv := range app.Servers {
			if _, loaded := connServers.LoadOrStore(srv, h); !loaded {
				srv.RegisterConnContext(resume.ConnContext)
				h.connServers = append(h.connServers, srv)
			}
		}
	}
}

func (h *Handler) forgetConnServers() {
	for _, srv := range h.connServers {
		connServers.Delete(srv)
	}
	h.connServers = nil
}
