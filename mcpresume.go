// Package mcpresume makes MCP servers' SSE streams resumable behind Caddy.
//
// Importing it registers the http.handlers.mcp_resume module, its Caddyfile
// directive mcp_resume and the admin.api.mcp_resume admin routes, so that
//
//	xcaddy build --with github.com/mcpresume/caddy-mcp-resume
//
// builds a Caddy with them.
package mcpresume

import (
	// Register the Caddy modules.
	_ "github.com/mcpresume/caddy-mcp-resume/caddymodule"
)
