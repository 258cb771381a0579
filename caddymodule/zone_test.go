package caddymodule

import (
	"context"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/mcpresume/caddy-mcp-resume/buffer"
	"github.com/mcpresume/caddy-mcp-resume/internal/testnet"
	"github.com/mcpresume/caddy-mcp-resume/natsstore"
)

// The zone's lifecycle run on real stores: the memory store, and the
// JetStream store on an in-process NATS server (through a store module of
// this test's, as package storenats's is not importable here).

type natsBackend struct{ url string }

func (b natsBackend) OpenStore(ctx context.Context, zone string, o StoreOptions) (buffer.Backend, error) {
	return natsstore.Open(ctx, natsstore.Options{URLs: []string{b.url}, Limits: o.Limits, Prefix: "z" + zone})
}
func (natsBackend) Shared() bool                  { return true }
func (b natsBackend) Identity(zone string) string { return b.url }

func testZoneLimits() buffer.Limits {
	return buffer.Limits{MaxStreamBytes: 1 << 20, MaxSessionBytes: 4 << 20, MaxTotalBytes: 16 << 20,
		MaxSessions: 100, MaxStreamsPerSession: 10, ResumeWindow: time.Minute, StallTimeout: time.Minute}
}

func phaseOf(z *zone) zonePhase {
	z.mu.Lock()
	defer z.mu.Unlock()
	return z.phase
}

func waitStore(t *testing.T, z *zone) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, ok := z.rt.Wait(ctx); !ok {
		t.Fatal("the shared store did not connect")
	}
}

func waitClosed(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(20 * time.Second):
		t.Fatalf("%s: not after 20s", what)
	}
}

// A memory zone serves from its creation; a reload keeps it (the pool
// holds it twice), and the last release drains it (its running calls go
// on to their clients), then closes it and its store.
func TestZoneMemoryServesAtOnceAndClosesOnRelease(t *testing.T) {
	z, err := loadZone("zt-memory", "memory", MemoryStore{}, time.Second, testZoneLimits(), 1<<20, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	if p := phaseOf(z); p.state != zoneServing {
		t.Fatalf("a new memory zone is %s", p.state)
	}
	st, ok := z.rt.Store()
	if !ok {
		t.Fatal("a serving memory zone has no store")
	}
	if again, _ := loadZone("zt-memory", "memory", MemoryStore{}, time.Second, testZoneLimits(), 1<<20, zap.NewNop()); again != z {
		t.Fatal("a reload made another zone")
	}
	s, err := st.CreateSession("s", buffer.SessionMeta{})
	if err != nil {
		t.Fatal(err)
	}
	releaseZone("zt-memory", "memory")
	if p := phaseOf(z); p.state != zoneServing {
		t.Fatalf("a zone another configuration holds is %s", p.state)
	}
	releaseZone("zt-memory", "memory") // a reload left no handler in the zone: it drains (no call runs: at once)
	if !z.rt.Draining() {
		t.Fatal("the released zone does not drain")
	}
	waitClosed(t, z.closed, "the released zone to close")
	if p := phaseOf(z); p != (zonePhase{state: zoneClosed, released: true}) {
		t.Fatalf("released zone: %+v", p)
	}
	select {
	case <-z.rt.Done():
	default:
		t.Fatal("the closed zone's reads were not cut")
	}
	if s.Context().Err() == nil {
		t.Fatal("the closed store's sessions live on")
	}
}

// A shared zone connects once it is opened (Caddy started the
// configuration), not before; a reload to another store of the same name
// drains it (no call runs: at once). An exit then drains the new zone,
// bounds the drains reloads left to it, and the zone's store stays open
// until the configuration releases it.
func TestZoneSharedConnectsWhenOpenedAndDrainsWhenReplaced(t *testing.T) {
	url := testnet.NATS(t).ClientURL()
	core, logs := observer.New(zap.DebugLevel)
	logger := zap.New(core)
	a, err := loadZone("zt-shared", "a", natsBackend{url}, 5*time.Second, testZoneLimits(), 1<<20, logger)
	if err != nil {
		t.Fatal(err)
	}
	if p := phaseOf(a); p.state != zoneUnopened {
		t.Fatalf("a shared zone before Caddy started it is %s", p.state)
	}
	if _, ok := a.rt.Store(); ok {
		t.Fatal("the shared store opened before the zone did")
	}
	a.fire(zoneOpen)
	waitStore(t, a)
	if p := phaseOf(a); p.state != zoneServing {
		t.Fatalf("connected zone: %s", p.state)
	}
	a.fire(zoneOpen) // the next configuration's start: nothing happens
	if p := phaseOf(a); p.state != zoneServing {
		t.Fatalf("a second open: %s", p.state)
	}

	b, err := loadZone("zt-shared", "b", natsBackend{url}, 5*time.Second, testZoneLimits(), 1<<20, logger)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if !isClosed(b) {
			releaseZone("zt-shared", "b")
		}
	})
	b.fire(zoneOpen)
	waitStore(t, b)
	if err := releaseZone("zt-shared", "a"); err != nil { // a's configuration is cleaned up: Destruct
		t.Fatal(err)
	}
	if !a.rt.Draining() {
		t.Fatal("the replaced zone does not drain")
	}
	waitClosed(t, a.closed, "the replaced zone's drain to end")
	if p := phaseOf(a); p.state != zoneClosed {
		t.Fatalf("drained zone: %s", p.state)
	}
	if logs.FilterMessage("draining: running upstream reads go on into the shared store; new calls get 503").
		FilterField(zap.String("why", "a reload moved the zone to another store")).Len() != 1 {
		t.Fatalf("the reload's drain is not logged as one: %v", logs.All())
	}

	// A zone an earlier reload left still draining (its calls run on: set
	// here as the drain would leave it) gets its bound from the exit.
	c := newZone("zt-shared", natsBackend{url}, 5*time.Second, testZoneLimits(), 1<<20, logger)
	c.phase = zonePhase{state: zoneDrainingReload, released: true}
	b.inherit([]*zone{c})
	b.exit()
	c.mu.Lock()
	cPhase, cBounded := c.phase, !c.drainUntil.IsZero()
	c.mu.Unlock()
	if cPhase.state != zoneDrainingExit || !cBounded {
		t.Fatalf("the exit left the earlier drain %s, bounded %v", cPhase.state, cBounded)
	}
	c.fire(zoneDrained)
	waitClosed(t, c.closed, "the earlier drain's zone to close")
	waitClosed(t, b.rt.Done(), "the exit's drain to end")
	if p := phaseOf(b); p.state != zoneStopped {
		t.Fatalf("drained on exit, not released: %s", p.state)
	}
	b.mu.Lock()
	bounded := !b.drainUntil.IsZero()
	b.mu.Unlock()
	if !bounded {
		t.Fatal("the exit's drain has no bound")
	}
	if st, ok := b.rt.Store(); !ok || st.(interface{ Available() error }).Available() != nil {
		t.Fatal("the store closed before its zone was released")
	}
	releaseZone("zt-shared", "b") // Caddy unloads the configuration
	waitClosed(t, b.closed, "the stopped zone to close on release")
	if logs.FilterMessage("BUG: zone lifecycle: event ignored in this state").Len() != 0 {
		t.Fatalf("impossible events: %v", logs.FilterMessage("BUG: zone lifecycle: event ignored in this state").All())
	}
}

// A store that opens after its zone closed is closed, never left open.
func TestZoneStoreOpenedAfterTheZoneClosedIsClosed(t *testing.T) {
	url := testnet.NATS(t).ClientURL()
	z := newZone("zt-late", natsBackend{url}, time.Second, testZoneLimits(), 1<<20, zap.NewNop())
	z.fire(zoneReleased)
	waitClosed(t, z.closed, "the zone to close")
	st, err := natsBackend{url}.OpenStore(context.Background(), "zt-late", StoreOptions{Limits: testZoneLimits()})
	if err != nil {
		t.Fatal(err)
	}
	z.connected(st)
	if _, ok := z.rt.Store(); ok {
		t.Fatal("the closed zone took the late store")
	}
	if err := st.(interface{ Available() error }).Available(); err == nil {
		t.Fatal("the late store is still open")
	}
}
