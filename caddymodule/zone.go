package caddymodule

import (
	"context"
	"crypto/rand"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/mcpresume/caddy-mcp-resume/buffer"
	"github.com/mcpresume/caddy-mcp-resume/resume"
)

// zones holds the retention stores across config reloads: a new config is
// provisioned before the old one is cleaned up, so a store (and every
// detached stream feeding it) carries on.
var zones = caddy.NewUsagePool()

// A zone is one retention store and the handlers that share it. Handlers
// name their zone with the zone subdirective (default "default"); handlers
// in one zone share sessions (a session may be resumed through any of them)
// and the zone's limits, which the most recently provisioned handler sets.
// A zone is keyed by its name and its store's configuration, so a reload
// that changes the store opens a new one. Its life is the state machine of
// lifecycle.go, under mu.
type zone struct {
	name    string
	backend StoreModule
	// rt is the engine's runtime the zone's handlers share: the store (set
	// once it opens) and the upstream reads feeding it.
	rt *resume.Runtime

	mu    sync.Mutex
	phase zonePhase
	// drainTimeout bounds a drain on exit (a reload may change it);
	// drainUntil is when the drain gives up on running calls (zero: when
	// they end).
	drainTimeout time.Duration
	drainUntil   time.Time
	// left are the zones earlier reloads moved away from to this zone's
	// name, still draining: this zone's exit bounds their drains and waits
	// for them, since no configuration holds them.
	left []*zone

	connecting     context.Context // the store's opening; ends when the zone closes
	stopConnecting context.CancelFunc
	closed         chan struct{} // closed once the zone is

	logger        atomic.Pointer[zap.Logger] // the most recently provisioned handler's; store hooks log here
	limits        atomic.Pointer[buffer.Limits]
	maxEventBytes atomic.Int64
}

// fire moves the zone on by ev and does what the transition says.
func (z *zone) fire(ev zoneEvent) {
	z.mu.Lock()
	act := z.advance(ev)
	z.mu.Unlock()
	z.perform(act)
}

// advance is fire's transition, under z.mu: it applies what is the zone's
// own state (the phase, the drain's bound) and returns the rest to perform.
func (z *zone) advance(ev zoneEvent) zoneAction {
	next, act, ok := step(z.phase, ev, z.backend.Shared())
	if !ok {
		z.logger.Load().Error("BUG: zone lifecycle: event ignored in this state",
			zap.String("zone", z.name), zap.Stringer("state", z.phase.state), zap.Bool("released", z.phase.released),
			zap.Stringer("event", ev))
		return 0
	}
	if c := z.logger.Load().Check(zap.DebugLevel, "zone lifecycle"); c != nil && next != z.phase {
		c.Write(zap.String("zone", z.name), zap.Stringer("from", z.phase.state), zap.Stringer("event", ev),
			zap.Stringer("to", next.state), zap.Bool("released", next.released), zap.Stringer("actions", act))
	}
	z.phase = next
	if act&actBound != 0 && z.drainUntil.IsZero() {
		z.drainUntil = time.Now().Add(z.drainTimeout)
	}
	return act
}

// perform does a transition's actions that are not the zone's own state.
func (z *zone) perform(act zoneAction) {
	if act&actConnect != 0 {
		if z.backend.Shared() {
			go z.connect()
		} else {
			z.connect() // in memory: nothing to connect to, nothing to fail
		}
	}
	if act&actDrain != 0 {
		z.drain()
	}
	if act&actStop != 0 {
		z.rt.Stop()
	}
	if act&actClose != 0 {
		z.close()
	}
}

// Destruct implements caddy.Destructor. It comes when no configuration
// holds the zone any more: the process exits, Caddy stops, a reload moved
// the zone's handlers to another store, or a reload left no handler in the
// zone (it renamed the zone, or took mcp_resume off). A shared store drains
// then, and after a reload that left the zone any store does (see
// lifecycle.go); a reload's drain runs in the background, handed to the
// zone that replaced this one (or to any other zone), while the new
// configuration serves.
func (z *zone) Destruct() error {
	switch successor := z.successor(); {
	case caddy.Exiting():
		z.fire(zoneReleasedOnExit)
		// Caddy's shutdown waits for the requests it tracks only: a call
		// whose client was cut is read on after its connection was taken
		// from the server, so the drain is waited for here, and the drains
		// of the zones earlier reloads left.
		<-z.closed
		for _, l := range z.takeLeft() {
			l.fire(zoneExit)
			<-l.closed
		}
	case successor != nil:
		z.fire(zoneReplaced)
		successor.inherit(append(z.takeLeft(), z))
	default:
		z.fire(zoneReleased) // its running calls end within drain_timeout
		z.leaveDrains()
	}
	return nil
}

// successor is the zone of the same name another configuration holds:
// the one that replaces this zone's.
func (z *zone) successor() *zone {
	var found *zone
	zones.Range(func(_, v any) bool {
		if o := v.(*zone); o != z && o.name == z.name {
			found = o
		}
		return found == nil
	})
	return found
}

// inherit takes on zones still draining after reloads moved away from them.
func (z *zone) inherit(left []*zone) {
	z.mu.Lock()
	defer z.mu.Unlock()
	z.left = slices.DeleteFunc(z.left, isClosed)
	z.left = append(z.left, slices.DeleteFunc(left, isClosed)...)
}

func (z *zone) takeLeft() []*zone {
	z.mu.Lock()
	defer z.mu.Unlock()
	left := z.left
	z.left = nil
	return left
}

func isClosed(z *zone) bool {
	select {
	case <-z.closed:
		return true
	default:
		return false
	}
}

// leaveDrains hands the drains this zone inherited, and its own, to
// another zone when a reload removed this one's name: an exit then bounds
// and waits for them. With no zone left to wait for them, their drains are
// bounded now, and the process's exit waits for them.
func (z *zone) leaveDrains() {
	left := z.takeLeft()
	if !isClosed(z) {
		left = append(left, z) // draining (draining_release), bounded
	}
	if len(left) == 0 {
		return
	}
	var heir *zone
	zones.Range(func(_, v any) bool {
		if o := v.(*zone); o != z {
			heir = o
		}
		return heir == nil
	})
	if heir != nil {
		heir.inherit(left)
		return
	}
	for _, l := range left {
		l.fire(zoneExit)
	}
	orphans.add(left)
}

// orphans are the zones still draining that no configuration's zone
// waits for (a reload left no zone at all): the process's exit waits for
// them (their drains are bounded), as it waits for the drains a zone
// inherited.
var orphans orphanDrains

type orphanDrains struct {
	mu    sync.Mutex
	zones []*zone
	hook  sync.Once
}

func (o *orphanDrains) add(zs []*zone) {
	o.hook.Do(func() { caddy.OnExit(func(context.Context) { o.wait() }) })
	o.mu.Lock()
	defer o.mu.Unlock()
	o.zones = slices.DeleteFunc(o.zones, isClosed)
	o.zones = append(o.zones, zs...)
}

// wait waits for every orphan drain to end and its zone to close.
func (o *orphanDrains) wait() {
	o.mu.Lock()
	zs := o.zones
	o.zones = nil
	o.mu.Unlock()
	for _, z := range zs {
		z.fire(zoneExit)
		<-z.closed
	}
}

// exit is told that the process is stopping (Caddy's "stopping" event):
// the zone's drain starts, and the drains of the zones it inherited get
// their bound.
func (z *zone) exit() {
	z.fire(zoneExit)
	z.mu.Lock()
	left := slices.Clone(z.left)
	z.mu.Unlock()
	for _, l := range left {
		l.fire(zoneExit)
	}
}

// close ends the zone: its reads (cut already), then its store.
func (z *zone) close() {
	z.stopConnecting()
	// The taps end at once now, but they still write what they owe the store
	// as they close (a standalone stream's upstream cursor, the last batch).
	if !z.rt.WaitTaps(10 * time.Second) {
		z.logger.Load().Warn("upstream taps still closing after 10s; closing the store anyway", zap.String("zone", z.name))
	}
	// Closed now, the zone takes no store that connects later (connected
	// discards it), so this reads the store it will ever have.
	if st, ok := z.rt.Store(); ok {
		st.Close()
	}
	close(z.closed)
}

func zoneKey(name, storeKey string) string { return "mcp_resume/" + name + "/" + storeKey }

// loadZone returns the zone of that name and store, creating it if no
// config holds it. storeKey identifies the store's configuration.
func loadZone(name, storeKey string, backend StoreModule, drain time.Duration, l buffer.Limits, maxEvent int64,
	logger *zap.Logger) (*zone, error) {
	v, loaded, err := zones.LoadOrNew(zoneKey(name, storeKey), func() (caddy.Destructor, error) {
		z := newZone(name, backend, drain, l, maxEvent, logger)
		if !backend.Shared() {
			z.fire(zoneOpen) // a shared store opens once Caddy runs the configuration (never for caddy validate)
		}
		return z, nil
	})
	if err != nil {
		return nil, err
	}
	z := v.(*zone)
	if loaded {
		z.logger.Store(logger)
		z.limits.Store(&l)
		z.maxEventBytes.Store(maxEvent)
		z.mu.Lock()
		z.drainTimeout = drain
		z.mu.Unlock()
		if st, ok := z.rt.Store(); ok {
			st.SetLimits(l)
		} // else applied when it opens
	}
	return z, nil
}

// newZone makes a zone whose store is not open yet.
func newZone(name string, backend StoreModule, drain time.Duration, l buffer.Limits, maxEvent int64, logger *zap.Logger) *zone {
	z := &zone{name: name, backend: backend, rt: resume.NewRuntime(nil), drainTimeout: drain, closed: make(chan struct{})}
	z.connecting, z.stopConnecting = context.WithCancel(context.Background())
	z.logger.Store(logger)
	z.limits.Store(&l)
	z.maxEventBytes.Store(maxEvent)
	return z
}

func releaseZone(name, storeKey string) error {
	_, err := zones.Delete(zoneKey(name, storeKey))
	return err
}

// connect opens the zone's store, trying again until it opens or the zone
// closes.
func (z *zone) connect() {
	for wait := time.Second; ; wait = min(2*wait, 30*time.Second) {
		ctx, cancel := context.WithTimeout(z.connecting, 30*time.Second)
		st, err := z.backend.OpenStore(ctx, z.name, z.storeOptions())
		cancel()
		if err == nil {
			z.connected(st)
			return
		}
		if z.connecting.Err() != nil {
			return
		}
		z.logger.Load().Error("shared store unavailable: requests that need it get 503; retrying",
			zap.String("zone", z.name), zap.Duration("retry_in", wait), zap.Error(err))
		select {
		case <-time.After(wait):
		case <-z.connecting.Done():
			return
		}
	}
}

// connected gives the zone the store that opened; under z.mu, so a zone
// closing meanwhile either closes this store or never takes it.
func (z *zone) connected(st buffer.Backend) {
	z.mu.Lock()
	act := z.advance(zoneConnected)
	if act&actKeepStore != 0 {
		st.SetLimits(*z.limits.Load()) // a reload may have come meanwhile
		z.rt.SetStore(st)
	}
	z.mu.Unlock()
	if act&actDiscardStore != 0 {
		st.Close()
		return
	}
	if z.backend.Shared() {
		z.logger.Load().Info("shared store connected", zap.String("zone", z.name))
	}
}

func (z *zone) storeOptions() StoreOptions {
	return StoreOptions{
		Limits:        *z.limits.Load(),
		Hooks:         resume.StoreHooks(z.logger.Load),
		Logger:        z.logger.Load(),
		MaxEventBytes: z.maxEventBytes.Load(),
		OnPublish: func(took time.Duration, events int) {
			resume.ObserveStorePublish(z.name, took)
		},
		OnDataLost: func(l DataLoss) {
			resume.CountStoreDataLost(z.name)
			z.logger.Load().Error("shared store lost its data: recreated what was missing; the sessions it held ended",
				zap.String("zone", z.name), zap.Strings("missing", l.Missing), zap.Int("sessions_lost", l.Sessions),
				zap.Uint64("events_lost", l.Events), zap.Bool("secret_changed", l.SecretChanged))
		},
		OnError: func(op string, err error) {
			resume.CountStoreError(z.name, op)
			level := zap.DebugLevel
			if op == "session_read" { // natsstore's opSessionRead
				level = zap.WarnLevel // the request is answered as for a session never seen here
			}
			if c := z.logger.Load().Check(level, "shared store operation failed"); c != nil {
				c.Write(zap.String("zone", z.name), zap.String("op", op), zap.Error(err))
			}
		},
	}
}

// drain starts a zone's drain: new calls get 503, the next GET of a
// standalone stream goes to another replica, and the running calls read on
// into the store until they end or the drain's bound passes (drainUntil: a
// reload's drain to another store has none until the process exits). A
// memory store drains only when a reload left no handler in its zone: its
// running calls go on to their clients.
func (z *zone) drain() {
	z.rt.StartDrain()
	z.mu.Lock()
	why, bounded := "a reload moved the zone to another store", !z.drainUntil.IsZero()
	switch z.phase.state {
	case zoneDrainingExit:
		why = "the process is stopping"
	case zoneDrainingRelease:
		why = "a reload left no handler in the zone"
	}
	released := z.phase.state == zoneDrainingRelease
	timeout := z.drainTimeout
	z.mu.Unlock()
	logger := z.logger.Load()
	msg := "draining: running upstream reads go on into the shared store; new calls get 503"
	if !z.backend.Shared() {
		msg = "draining: running upstream reads go on to their end; new calls get 503"
	}
	logger.Info(msg,
		zap.String("zone", z.name), zap.String("why", why), zap.Int64("upstream_reads", z.rt.Reads()),
		zap.Duration("drain_timeout", timeout), zap.Bool("bounded", bounded))
	if released {
		// A reload that left no handler: the standalone reads end at once
		// (StartDrain), so with no call running the zone closes before
		// Destruct returns and its store is not left open behind the
		// configuration that dropped it. Waited for a second at most.
		for deadline := time.Now().Add(time.Second); z.rt.Reads() > 0 && time.Now().Before(deadline); {
			time.Sleep(10 * time.Millisecond)
		}
		if z.rt.Reads() == 0 {
			logger.Info("drained", zap.String("zone", z.name))
			z.fire(zoneDrained)
			return
		}
	}
	go func() {
		for z.rt.Reads() > 0 && !z.drainTimedOut() {
			time.Sleep(50 * time.Millisecond)
		}
		if n := z.rt.Reads(); n > 0 {
			logger.Warn("drain timed out: the remaining upstream reads are cut and their streams fail",
				zap.String("zone", z.name), zap.Int64("upstream_reads", n))
		} else {
			logger.Info("drained", zap.String("zone", z.name))
		}
		z.fire(zoneDrained)
	}()
}

func (z *zone) drainTimedOut() bool {
	z.mu.Lock()
	defer z.mu.Unlock()
	return !z.drainUntil.IsZero() && !time.Now().Before(z.drainUntil)
}

// eachStore calls fn with every open store; the admin API and metrics read them.
func eachStore(fn func(name string, st buffer.Backend)) {
	zones.Range(func(_, v any) bool {
		z := v.(*zone)
		if st, ok := z.rt.Store(); ok {
			fn(z.name, st)
		}
		return true
	})
}

// zoneSecret returns the key a zone's credential fingerprints and epochs
// are keyed with. It is kept in Caddy's data directory, so after a restart
// the proxy still recognises the event IDs it minted (and can take their
// sessions over with a gap instead of passing the cursor to an upstream
// that never saw it). Without a writable data directory it lives only as
// long as the process.
func zoneSecret(name string, logger *zap.Logger) []byte {
	path := filepath.Join(caddy.AppDataDir(), "mcp_resume", "secret-"+name)
	if b, err := os.ReadFile(path); err == nil && len(b) == 32 {
		return b
	}
	key := make([]byte, 32)
	rand.Read(key)
	err := os.MkdirAll(filepath.Dir(path), 0o700)
	if err == nil {
		err = os.WriteFile(path, key, 0o600)
	}
	if err != nil && !errors.Is(err, fs.ErrExist) {
		logger.Warn("zone secret not saved: after a restart, earlier event IDs are not recognised",
			zap.String("path", path), zap.Error(err))
	}
	return key
}

// storeViews lists every zone's store for the metrics collectors.
func storeViews() []resume.StoreView {
	var out []resume.StoreView
	zones.Range(func(_, v any) bool {
		z := v.(*zone)
		var view resume.StoreView
		if st, ok := z.rt.Store(); ok {
			view.Store = st
		}
		view.Zone, view.Shared, view.Up = z.name, z.backend.Shared(), z.rt.Unavailable() == nil
		out = append(out, view)
		return true
	})
	return out
}
