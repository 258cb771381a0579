package caddymodule

import (
	"context"
	"crypto/rand"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
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
// that changes the store opens a new one.
type zone struct {
	name    string
	backend StoreModule
	drain   atomic.Int64 // how long a stopping process drains into a shared store (a reload may change it)

	// rt is the engine's runtime the zone's handlers share: the store and
	// the upstream reads feeding it. Its store is set once. A shared store
	// is opened when Caddy has started (never by `caddy validate`) and
	// retried until it connects; meanwhile requests that need it get 503.
	// rt stops when this process stops serving the zone: at once on exit
	// for the memory store, after the drain for a shared one.
	rt       *resume.Runtime
	openOnce sync.Once
	openMu   sync.Mutex      // a store that opens as the zone closes is closed, not leaked
	ctx      context.Context // ends when the zone is destructed
	cancel   context.CancelFunc

	exitOnce   sync.Once
	drainUntil atomic.Int64 // when the drain gives up on running calls (unix ns); 0: when they end

	logger        atomic.Pointer[zap.Logger] // the most recently provisioned handler's; store hooks log here
	limits        atomic.Pointer[buffer.Limits]
	maxEventBytes atomic.Int64
}

// Destruct implements caddy.Destructor. It comes when no configuration
// holds the zone any more: the process exits, Caddy stops, or a reload
// moved the zone's handlers to another store. A shared store drains on exit
// and on such a reload (in the background then: the new configuration
// serves meanwhile, and what the old zone's calls read lands in the same
// shared store).
func (z *zone) Destruct() error {
	if z.backend.Shared() {
		switch {
		case caddy.Exiting():
			z.exiting()
			// Caddy's shutdown waits for the requests it tracks only: a call
			// whose client was cut is read on after its connection was
			// taken from the server, so the drain is waited for here.
			<-z.rt.Done()
		case z.succeeded():
			z.drainAfterReload()
			return nil
		}
	}
	z.close()
	return nil
}

// leftByReload are the zones draining after a reload moved their handlers
// to another store. No configuration holds them, so an exit waits for them
// here, each bounded by its drain_timeout from the exit on.
var leftByReload struct {
	sync.Mutex
	zones  map[*zone]struct{}
	closed sync.WaitGroup
	hook   sync.Once
}

// drainAfterReload drains the zone in the background, with no bound while
// the process runs (every call ends by itself: its upstream answers, stalls
// or its session goes), then closes it.
func (z *zone) drainAfterReload() {
	leftByReload.Lock()
	if leftByReload.zones == nil {
		leftByReload.zones = map[*zone]struct{}{}
	}
	leftByReload.zones[z] = struct{}{}
	leftByReload.closed.Add(1)
	leftByReload.Unlock()
	leftByReload.hook.Do(func() {
		caddy.OnExit(func(context.Context) {
			boundDrainsLeftByReload()
			leftByReload.closed.Wait()
		})
	})
	z.startDrain("a reload moved the zone to another store", false)
	go func() {
		defer leftByReload.closed.Done()
		<-z.rt.Done()
		z.close()
		leftByReload.Lock()
		delete(leftByReload.zones, z)
		leftByReload.Unlock()
	}()
}

// boundDrainsLeftByReload gives the zones a reload left drain_timeout from
// now: the process is exiting.
func boundDrainsLeftByReload() {
	leftByReload.Lock()
	defer leftByReload.Unlock()
	for z := range leftByReload.zones {
		z.drainUntil.CompareAndSwap(0, time.Now().Add(time.Duration(z.drain.Load())).UnixNano())
	}
}

// succeeded reports whether another zone of the same name is loaded: the
// configuration that replaces this zone's.
func (z *zone) succeeded() bool {
	found := false
	zones.Range(func(_, v any) bool {
		if o := v.(*zone); o != z && o.name == z.name {
			found = true
		}
		return !found
	})
	return found
}

// close ends the zone: its reads, then its store.
func (z *zone) close() {
	z.rt.Stop()
	z.cancel()
	// The taps end at once now, but they still write what they owe the store
	// as they close (a standalone stream's upstream cursor, the last batch).
	if !z.rt.WaitTaps(10 * time.Second) {
		z.logger.Load().Warn("upstream taps still closing after 10s; closing the store anyway", zap.String("zone", z.name))
	}
	z.openMu.Lock()
	defer z.openMu.Unlock()
	if st, ok := z.rt.Store(); ok {
		st.Close()
	} // else connect sees the zone's context end, and closes what it opened
}

func zoneKey(name, storeKey string) string { return "mcp_resume/" + name + "/" + storeKey }

// loadZone returns the zone of that name and store, creating it if no
// config holds it. storeKey identifies the store's configuration.
func loadZone(name, storeKey string, backend StoreModule, drain time.Duration, l buffer.Limits, maxEvent int64,
	logger *zap.Logger) (*zone, error) {
	v, loaded, err := zones.LoadOrNew(zoneKey(name, storeKey), func() (caddy.Destructor, error) {
		z := newZone(name, backend, drain, l, maxEvent, logger)
		if !backend.Shared() {
			z.open() // in memory: nothing to connect to, nothing to fail
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
		z.drain.Store(int64(drain))
		if st, ok := z.rt.Store(); ok {
			st.SetLimits(l)
		} // else applied when it opens
	}
	return z, nil
}

// newZone makes a zone whose store is not open yet.
func newZone(name string, backend StoreModule, drain time.Duration, l buffer.Limits, maxEvent int64, logger *zap.Logger) *zone {
	z := &zone{name: name, backend: backend, rt: resume.NewRuntime(nil)}
	z.drain.Store(int64(drain))
	z.ctx, z.cancel = context.WithCancel(context.Background())
	z.logger.Store(logger)
	z.limits.Store(&l)
	z.maxEventBytes.Store(maxEvent)
	return z
}

func releaseZone(name, storeKey string) error {
	_, err := zones.Delete(zoneKey(name, storeKey))
	return err
}

// open opens the zone's store once; a shared store is retried in the
// background until it connects or the zone goes.
func (z *zone) open() {
	z.openOnce.Do(func() {
		if !z.backend.Shared() {
			st, _ := z.backend.OpenStore(z.ctx, z.name, z.storeOptions())
			z.rt.SetStore(st)
			return
		}
		go z.connect()
	})
}

func (z *zone) connect() {
	for wait := time.Second; ; wait = min(2*wait, 30*time.Second) {
		ctx, cancel := context.WithTimeout(z.ctx, 30*time.Second)
		st, err := z.backend.OpenStore(ctx, z.name, z.storeOptions())
		cancel()
		if err == nil {
			z.openMu.Lock()
			if z.ctx.Err() != nil { // the zone closed while the store opened
				z.openMu.Unlock()
				st.Close()
				return
			}
			st.SetLimits(*z.limits.Load()) // a reload may have come meanwhile
			z.rt.SetStore(st)
			z.openMu.Unlock()
			z.logger.Load().Info("shared store connected", zap.String("zone", z.name))
			return
		}
		if z.ctx.Err() != nil {
			return
		}
		z.logger.Load().Error("shared store unavailable: requests that need it get 503; retrying",
			zap.String("zone", z.name), zap.Duration("retry_in", wait), zap.Error(err))
		select {
		case <-time.After(wait):
		case <-z.ctx.Done():
			return
		}
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
			if c := z.logger.Load().Check(zap.DebugLevel, "shared store operation failed"); c != nil {
				c.Write(zap.String("zone", z.name), zap.String("op", op), zap.Error(err))
			}
		},
	}
}

// exiting is told that the process is stopping. The memory store's reads
// end at once (nothing would outlive the process); a shared store's drain:
// new calls are refused, running upstream reads go on into the store until
// they end or drain_timeout passes, so results that arrive during a deploy
// are there for the client on another replica.
func (z *zone) exiting() {
	if !z.backend.Shared() {
		z.exitOnce.Do(func() {
			z.rt.Stop()
			if st, ok := z.rt.Store(); ok {
				st.Close()
			}
		})
		return
	}
	z.startDrain("the process is stopping", true)
}

// startDrain starts the drain of a shared store's zone, once: stopCtx ends
// when it is over. A bounded drain gives up on running calls after
// drain_timeout.
func (z *zone) startDrain(why string, bounded bool) {
	if bounded {
		z.drainUntil.CompareAndSwap(0, time.Now().Add(time.Duration(z.drain.Load())).UnixNano())
	}
	z.exitOnce.Do(func() {
		z.rt.StartDrain() // new calls get 503; the next GET of a standalone stream goes to another replica
		logger := z.logger.Load()
		logger.Info("draining: running upstream reads go on into the shared store; new calls get 503",
			zap.String("zone", z.name), zap.String("why", why), zap.Int64("upstream_reads", z.rt.Reads()),
			zap.Duration("drain_timeout", time.Duration(z.drain.Load())), zap.Bool("bounded", bounded))
		go func() {
			for z.rt.Reads() > 0 {
				if until := z.drainUntil.Load(); until != 0 && time.Now().UnixNano() >= until {
					break
				}
				time.Sleep(50 * time.Millisecond)
			}
			if n := z.rt.Reads(); n > 0 {
				logger.Warn("drain timed out: the remaining upstream reads are cut and their streams fail",
					zap.String("zone", z.name), zap.Int64("upstream_reads", n))
			} else {
				logger.Info("drained", zap.String("zone", z.name))
			}
			z.rt.Stop()
		}()
	})
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
