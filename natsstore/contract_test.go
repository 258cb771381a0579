package natsstore

import (
	"context"
	"testing"
	"time"

	"github.com/mcpresume/caddy-mcp-resume/buffer"
	"github.com/mcpresume/caddy-mcp-resume/buffer/storetest"
	"github.com/mcpresume/caddy-mcp-resume/internal/testnet"
)

// openStore opens a store with opts, its sweeper running every 20ms, as
// changed by mod; it is closed when the test ends.
func openStore(t testing.TB, opts Options, mod ...func(*Options)) *Store {
	t.Helper()
	opts.SweepInterval = 20 * time.Millisecond
	for _, m := range mod {
		m(&opts)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	st, err := Open(ctx, opts)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(st.Close)
	return st
}

// openEmbedded opens a store on its own embedded server in a temporary
// directory.
func openEmbedded(t testing.TB, lim buffer.Limits, mod ...func(*Options)) *Store {
	t.Helper()
	return openStore(t, Options{Embedded: true, Dir: t.TempDir(), Limits: lim}, mod...)
}

// The JetStream store keeps the contract the memory store keeps.
//
// Not parallel with the other tests (its own cases run in parallel): a
// busier machine widens the window in which a reader's Close has dropped
// the reader but not yet touched the session, and the sweeper expires the
// session early (IdleExpiry).
func TestStoreContract(t *testing.T) {
	storetest.Run(t, func(t *testing.T, lim buffer.Limits) buffer.Backend { return openEmbedded(t, lim) })
}

// The contract holds on a NATS server with its default options
// (max_payload 1 MiB), events of several MiB (LargeEvents) included: an
// event larger than a message is stored in parts.
//
// Not parallel with the other tests: see TestStoreContract.
func TestStoreContractStockServer(t *testing.T) {
	storetest.Run(t, func(t *testing.T, lim buffer.Limits) buffer.Backend {
		ns := testnet.StockNATS(t)
		st := openStore(t, Options{URLs: []string{ns.ClientURL()}, Limits: lim})
		if mp := st.maxPayload; mp != 1<<20 {
			t.Fatalf("the stock server's max_payload is %d, not NATS's default", mp)
		}
		return st
	})
}
