package natsstore

import (
	"context"
	"testing"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/buffer"
	"github.com/mcpresume/caddy-mcp-resume/buffer/storetest"
)

// openEmbedded opens a store on its own embedded server in a temporary
// directory, closed when the test ends.
func openEmbedded(t testing.TB, lim buffer.Limits, mod ...func(*Options)) *Store {
	t.Helper()
	opts := Options{Embedded: true, Dir: t.TempDir(), Limits: lim, SweepInterval: 20 * time.Millisecond}
	for _, m := range mod {
		m(&opts)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st, err := Open(ctx, opts)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(st.Close)
	return st
}

// The JetStream store keeps the contract the memory store keeps.
func TestStoreContract(t *testing.T) {
	storetest.Run(t, func(t *testing.T, lim buffer.Limits) buffer.Store { return openEmbedded(t, lim) })
}
