// Command caddy is Caddy with the mcp_resume module, for `go run ./cmd/caddy`.
package main

import (
	caddycmd "github.com/caddyserver/caddy/v2/cmd"

	_ "github.com/caddyserver/caddy/v2/modules/standard"

	_ "github.com/mcpresume/caddy-mcp-resume"
)

func main() { caddycmd.Main() }
