package resume

import (
	"context"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/mcpresume/caddy-mcp-resume/buffer"
	"github.com/mcpresume/caddy-mcp-resume/policy"
)

// Runtime is the state the engines of one store share: the store (which may
// open late: a shared store connects in the background), and the lifecycle
// of the upstream reads feeding it. Stop ends every detached read and
// relay; a drain (StartDrain) first refuses new calls and ends the
// standalone reads, so that the running calls can end into the store
// (Reads counts them) before Stop.
type Runtime struct {
	// store is set once, before ready closes; meanwhile requests that need
	// it wait a few seconds, then get 503.
	store   buffer.Backend
	ready   chan struct{}
	setOnce sync.Once

	// stopCtx ends when this process stops serving the store: detached
	// upstream reads and relays end with it.
	stopCtx  context.Context
	stop     context.CancelFunc
	draining atomic.Bool     // no new calls: the process is stopping
	drainCtx context.Context // ends when the drain starts: standalone reads, which never end by themselves, end with it
	drained  context.CancelFunc
	reads    atomic.Int64   // calls whose upstream response is being read
	taps     sync.WaitGroup // every upstream tap, until it has closed
	// adoptions serialise the adoptions of each session; closedGETs
	// remember the standalone GETs this runtime closed (standalone.go).
	adoptions  adoptions
	closedGETs closedGETs
	// macs keeps keyed hashers for the bindings' hashes (credentials.go);
	// freshest, the sessions' latest credentials let through.
	macs     sync.Pool
	freshest freshest
}

// NewRuntime returns a runtime on st, or, with st nil, one whose store
// comes later (SetStore).
func NewRuntime(st buffer.Backend) *Runtime {
	rt := &Runtime{ready: make(chan struct{})}
	rt.stopCtx, rt.stop = context.WithCancel(context.Background())
	rt.drainCtx, rt.drained = context.WithCancel(rt.stopCtx)
	if st != nil {
		rt.SetStore(st)
	}
	return rt
}

// SetStore gives the runtime its store, once; later calls are ignored.
func (rt *Runtime) SetStore(st buffer.Backend) {
	rt.setOnce.Do(func() {
		rt.store = st
		close(rt.ready)
	})
}

// Store returns the store, and false while it is not set.
func (rt *Runtime) Store() (buffer.Backend, bool) {
	select {
	case <-rt.ready:
		return rt.store, true
	default:
		return nil, false
	}
}

// Wait returns the store once it is set, or false if it is not within a
// few seconds (a shared store that cannot connect) or ctx ends.
func (rt *Runtime) Wait(ctx context.Context) (buffer.Backend, bool) {
	if st, ok := rt.Store(); ok {
		return st, true
	}
	t := time.NewTimer(storeWait)
	defer t.Stop()
	select {
	case <-rt.ready:
		return rt.store, true
	case <-t.C:
	case <-ctx.Done():
	}
	return nil, false
}

// storeWait is how long a request waits for a shared store to connect.
const storeWait = 5 * time.Second

// Unavailable says why the store cannot take new sessions or streams now
// (a shared store that lost its connection, or one not set yet), or nil.
func (rt *Runtime) Unavailable() error {
	st, ok := rt.Store()
	if !ok {
		return errNotConnected
	}
	return buffer.Available(st)
}

type runtimeError string

func (e runtimeError) Error() string { return string(e) }

const errNotConnected = runtimeError("the retention store is not connected")

// StartDrain refuses new calls from now on and ends the standalone reads
// (the next GET of a standalone stream goes to another replica); running
// calls go on until Stop.
func (rt *Runtime) StartDrain() {
	rt.draining.Store(true)
	rt.drained()
}

// Draining reports whether StartDrain was called.
func (rt *Runtime) Draining() bool { return rt.draining.Load() }

// Reads is the number of calls whose upstream response is being read.
func (rt *Runtime) Reads() int64 { return rt.reads.Load() }

// Stop ends every upstream read and relay of the runtime's engines: their
// clients are cut, so they resume (on another replica, with a shared store).
func (rt *Runtime) Stop() { rt.stop() }

// Done is closed once Stop was called.
func (rt *Runtime) Done() <-chan struct{} { return rt.stopCtx.Done() }

// WaitTaps waits, at most d, for every upstream tap to have closed (they
// still write what they owe the store as they close); false if some had not.
func (rt *Runtime) WaitTaps(d time.Duration) bool {
	closed := make(chan struct{})
	go func() { rt.taps.Wait(); close(closed) }()
	select {
	case <-closed:
		return true
	case <-time.After(d):
		return false
	}
}

// Close stops the runtime, waits (up to 10s) for its taps to close, and
// closes its store.
func (rt *Runtime) Close() {
	rt.Stop()
	rt.WaitTaps(10 * time.Second)
	if st, ok := rt.Store(); ok {
		st.Close()
	}
}

// StoreHooks log what a store decides on its own (and time its stalls).
func StoreHooks(log func() *zap.Logger) buffer.Hooks {
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

// refuseNew is the runtime's admission of new work: it answers 503 to a
// request that would open a session or an upstream read the runtime cannot
// take now: a call while the process is stopping (the client retries, on
// another replica), or anything while the shared store is unreachable. It is asked before the request goes
// upstream: once the upstream has run a call, its answer reaches the client
// whatever the store says. It reports whether it answered.
func (h *Engine) refuseNew(w http.ResponseWriter, id string, call bool) bool {
	if call && h.rt.Draining() {
		h.refuse(w, refuseDraining, to{id: id})
		return true
	}
	if err := h.rt.Unavailable(); err != nil {
		h.logger.Warn("request refused: the shared store is unavailable", zap.Error(err))
		h.refuse(w, refuseUnavailable, to{id: id})
		return true
	}
	return false
}
