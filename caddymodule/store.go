package caddymodule

import (
	"context"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"go.uber.org/zap"

	"github.com/mcpresume/caddy-mcp-resume/buffer"
)

func init() {
	caddy.RegisterModule(MemoryStore{})
}

// StoreModule is a retention store backend, a module in the
// mcp_resume.stores namespace: memory (the default, here) or nats
// (package caddymodule/storenats). Optional: Drainer.
type StoreModule interface {
	// OpenStore opens the store of a zone. It may block (connecting), until
	// ctx ends.
	OpenStore(ctx context.Context, zone string, o StoreOptions) (buffer.Backend, error)
	// Shared reports a store other processes see: on exit, a replica drains
	// its upstream reads into it instead of cancelling them.
	Shared() bool
	// Identity names the store this configuration opens for zone: a reload
	// to a configuration of the same identity keeps the zone, its retention
	// and its running calls. Defaults spelled out are not another identity,
	// nor are options a reload applies in place.
	Identity(zone string) string
}

// Drainer is a StoreModule with a drain of its own length (a shared one):
// how long a stopping process drains its upstream reads into the store.
// Without it, DefaultDrainTimeout.
type Drainer interface {
	DrainFor() time.Duration
}

// drainFor is how long a stopping process drains into backend.
func drainFor(backend StoreModule) time.Duration {
	if d, ok := backend.(Drainer); ok {
		return d.DrainFor()
	}
	return DefaultDrainTimeout
}

// StoreOptions is what every store gets from the handler.
type StoreOptions struct {
	Limits buffer.Limits
	Hooks  buffer.Hooks
	Logger *zap.Logger
	// OnError is told of every failed operation of a store that can fail
	// (a shared store), by operation.
	OnError func(op string, err error)
	// OnDataLost is told when a shared store found its backend without the
	// zone's data and recreated it.
	OnDataLost func(DataLoss)
	// OnPublish is told how long a shared store took to store a batch of
	// events.
	OnPublish func(took time.Duration, events int)
	// MaxEventBytes is the handler's max_event_bytes: the largest event a
	// store must take (a shared store takes one larger than a message in
	// parts).
	MaxEventBytes int64
}

// DataLoss is what a shared store lost: what was missing (the events
// stream, buckets, "secret"), the sessions it held and their events, and
// whether the zone secret changed (event IDs signed before are no longer
// recognised).
type DataLoss struct {
	Missing       []string
	Sessions      int
	Events        uint64
	SecretChanged bool
}

// DefaultDrainTimeout is under Kubernetes' default termination grace (30s),
// so a replica ends its streams itself before it is killed.
const DefaultDrainTimeout = 20 * time.Second

// MemoryStore keeps retention in this process's memory: the default. A
// reload keeps it; a restart does not.
type MemoryStore struct{}

// CaddyModule returns the Caddy module information.
func (MemoryStore) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "mcp_resume.stores.memory",
		New: func() caddy.Module { return new(MemoryStore) },
	}
}

// OpenStore implements StoreModule.
func (MemoryStore) OpenStore(_ context.Context, zone string, o StoreOptions) (buffer.Backend, error) {
	return buffer.NewMemoryStore(buffer.Options{Limits: o.Limits, Hooks: o.Hooks, Key: zoneSecret(zone, o.Logger)}), nil
}

// Shared implements StoreModule.
func (MemoryStore) Shared() bool { return false }

// Identity implements StoreModule: `store memory` spelled out is the
// default, not another store.
func (MemoryStore) Identity(string) string { return "memory" }

// UnmarshalCaddyfile implements caddyfile.Unmarshaler: `store memory`.
func (MemoryStore) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next()
	if d.NextArg() || d.NextBlock(d.Nesting()) {
		return d.Err("store memory: takes no options")
	}
	return nil
}

// Interface guards
var (
	_ StoreModule           = MemoryStore{}
	_ caddyfile.Unmarshaler = (*MemoryStore)(nil)
)
