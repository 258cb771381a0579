package caddymodule

import (
	"crypto/rand"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/mcpresume/caddy-mcp-resume/buffer"
	"github.com/mcpresume/caddy-mcp-resume/policy"
)

// zones holds the retention stores across config reloads: a new config is
// provisioned before the old one is cleaned up, so a store (and every
// detached stream feeding it) carries on.
var zones = caddy.NewUsagePool()

// A zone is one retention store and the handlers that share it. Handlers
// name their zone with the zone subdirective (default "default"); handlers
// in one zone share sessions (a session may be resumed through any of them)
// and the zone's limits, which the most recently provisioned handler sets.
type zone struct {
	name   string
	store  buffer.Store
	logger atomic.Pointer[zap.Logger] // the most recently provisioned handler's; store hooks log here
}

// Destruct implements caddy.Destructor.
func (z *zone) Destruct() error {
	z.store.Close()
	return nil
}

func zoneKey(name string) string { return "mcp_resume/" + name }

func loadZone(name string, l buffer.Limits, logger *zap.Logger) (*zone, error) {
	v, loaded, err := zones.LoadOrNew(zoneKey(name), func() (caddy.Destructor, error) {
		z := &zone{name: name}
		z.logger.Store(logger)
		z.store = buffer.NewMemoryStore(buffer.Options{
			Limits: l,
			Hooks:  storeHooks(z.logger.Load),
			Key:    zoneSecret(name, logger),
		})
		return z, nil
	})
	if err != nil {
		return nil, err
	}
	z := v.(*zone)
	if loaded {
		z.store.SetLimits(l)
		z.logger.Store(logger)
	}
	return z, nil
}

func releaseZone(name string) error {
	_, err := zones.Delete(zoneKey(name))
	return err
}

// eachStore calls fn with every live store; the admin API and metrics read them.
func eachStore(fn func(name string, st buffer.Store)) {
	zones.Range(func(_, v any) bool {
		z := v.(*zone)
		fn(z.name, z.store)
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

// storeHooks logs what the store decides on its own.
func storeHooks(log func() *zap.Logger) buffer.Hooks {
	return buffer.Hooks{
		StallStarted: func(session string, stream uint32) {
			log().Info("backpressure: log full, upstream reading paused",
				zap.String("session", session), zap.Uint32("stream", stream))
		},
		StallEnded: func(session string, stream uint32, waited time.Duration) {
			stallSeconds.Observe(waited.Seconds())
			log().Info("backpressure: upstream reading resumed",
				zap.String("session", session), zap.Uint32("stream", stream), zap.Duration("waited", waited))
		},
		StreamFailed: func(session string, stream uint32, reason policy.Reason) {
			log().Warn("stream failed",
				zap.String("session", session), zap.Uint32("stream", stream), zap.String("reason", string(reason)))
		},
		SessionEnded: func(session string, reason policy.Reason) {
			log().Info("session ended",
				zap.String("session", session), zap.String("reason", string(reason)))
		},
		EvictedBeforeAck: func(session string, stream uint32, seq, n uint64) {
			log().Error("BUG: event evicted while a client could still ask for it",
				zap.String("session", session), zap.Uint32("stream", stream), zap.Uint64("seq", seq), zap.Uint64("events", n))
		},
		TombstoneDropped: func(session string) {
			log().Warn("ended session forgotten early: too many ended sessions remembered",
				zap.String("session", session))
		},
	}
}
