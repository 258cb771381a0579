package buffer_test

import (
	"testing"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/buffer"
	"github.com/mcpresume/caddy-mcp-resume/buffer/storetest"
)

// The memory store keeps the contract every store keeps.
func TestStoreContract(t *testing.T) {
	storetest.Run(t, func(t *testing.T, lim buffer.Limits) buffer.Backend {
		return buffer.NewMemoryStore(buffer.Options{Limits: lim, SweepInterval: 20 * time.Millisecond})
	})
}
