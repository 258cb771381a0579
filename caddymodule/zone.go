package caddymodule

import (
	"crypto/rand"
	"crypto/sha256"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/dgraph-io/ristretto/v2"
	"go.uber.org/zap"

	"github.com/mcpresume/caddy-mcp-resume/buffer"
	"github.com/mcpresume/caddy-mcp-resume/policy"
)

// zones holds the retention store across config reloads: a new config is
// provisioned before the old one is cleaned up, so the store (and every
// detached stream feeding it) carries on.
var zones = caddy.NewUsagePool()

// zoneKey names the one store of the process. Handlers in several sites or
// routes share it; the most recently provisioned limits apply.
const zoneKey = "mcp_resume"

type zone struct {
	store *buffer.MemoryStore
	key   []byte // HMAC key for credential fingerprints; lives with the sessions it binds
	// retries maps (session, request ids, body hash) to the stream that
	// answers it, so a client that re-sends the same request gets the
	// retained stream instead of running the tool twice. Losing an entry
	// only means the request runs again, so an evicting cache fits.
	retries *ristretto.Cache[string, uint32]
	logger  atomic.Pointer[zap.Logger] // the most recently provisioned handler's; store hooks log here
}

// Destruct implements caddy.Destructor.
func (z *zone) Destruct() error {
	z.store.Close()
	z.retries.Close()
	return nil
}

func retryKey(sid string, ids []string, body []byte) string {
	h := sha256.New()
	h.Write([]byte(sid))
	for _, id := range ids {
		h.Write([]byte{0})
		h.Write([]byte(id))
	}
	h.Write([]byte{1})
	h.Write(body)
	return string(h.Sum(nil))
}

func loadZone(l buffer.Limits, logger *zap.Logger) (*zone, error) {
	v, loaded, err := zones.LoadOrNew(zoneKey, func() (caddy.Destructor, error) {
		key := make([]byte, 32)
		rand.Read(key)
		retries, err := ristretto.NewCache(&ristretto.Config[string, uint32]{
			NumCounters: 1 << 17,
			MaxCost:     1 << 14, // entries
			BufferItems: 64,
		})
		if err != nil {
			return nil, err
		}
		z := &zone{key: key, retries: retries}
		z.logger.Store(logger)
		z.store = buffer.NewMemoryStore(buffer.Options{Limits: l, Hooks: storeHooks(z.logger.Load)})
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

func releaseZone() error {
	_, err := zones.Delete(zoneKey)
	return err
}

// currentStore returns the live store, if any handler is provisioned; the
// admin API and metrics read it.
func currentStore() (buffer.Store, bool) {
	var st buffer.Store
	zones.Range(func(_, v any) bool {
		st = v.(*zone).store
		return false
	})
	return st, st != nil
}

// storeHooks logs what the store decides on its own.
func storeHooks(log func() *zap.Logger) buffer.Hooks {
	return buffer.Hooks{
		StallStarted: func(session string, stream uint32) {
			log().Info("backpressure: log full, upstream reading paused",
				zap.String("session", session), zap.Uint32("stream", stream))
		},
		StallEnded: func(session string, stream uint32, waited time.Duration) {
			metrics.stallSeconds.Observe(waited.Seconds())
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
		EvictedBeforeAck: func(session string, stream uint32, seq uint64) {
			log().Error("BUG: event evicted while a client could still ask for it",
				zap.String("session", session), zap.Uint32("stream", stream), zap.Uint64("seq", seq))
		},
	}
}
