// Package mcpresume makes MCP servers' SSE streams resumable behind Caddy.
//
// Importing it registers the http.handlers.mcp_resume module, its Caddyfile
// directive mcp_resume, the admin.api.mcp_resume admin routes and the
// mcp_resume.stores.memory and .nats store modules, so that
//
//	xcaddy build --with github.com/mcpresume/caddy-mcp-resume
//
// builds a Caddy with them.
package mcpresume

import (
	// Register the Caddy modules: the handler, its admin API and the memory
	// store; the nats store.
	_ "github.com/mcpresume/caddy-mcp-resume/caddymodule"
	_ "github.com/mcpresume/caddy-mcp-resume/caddymodule/storenats"
)
