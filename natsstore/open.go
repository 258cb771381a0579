package natsstore

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/mcpresume/caddy-mcp-resume/buffer"
)

// Store is the JetStream-backed buffer.Store. Open starts one; Close stops
// what it started. Sessions outlive a Store: they belong to the zone.
type Store struct {
	opts       Options
	srv        *server.Server // the embedded server, if any
	nc         *nats.Conn
	js         jetstream.JetStream
	events     jetstream.Stream
	names      names
	key        atomic.Pointer[[]byte] // the zone secret (the stored one: see recover.go)
	counters   buffer.Counters
	maxPayload int64 // the largest message the servers take
	batchMax   int   // the largest batch of events stored as one message
	partRoom   int   // the largest payload of a message: an event larger is stored in parts

	sessions *mirror[sessionRecord]
	streams  *mirror[streamRecord]
	tombs    *mirror[tombRecord]
	leases   *mirror[leaseRecord]
	meta     jetstream.KeyValue
	interest interest // the sessions whose stream records and leases this replica holds

	lost lossCheck
	mark atomic.Pointer[string] // the zone's mark as this replica knows it (see recover.go)

	ctx       context.Context // ends when the store closes
	cancel    context.CancelFunc
	wg        sync.WaitGroup
	closeOnce sync.Once
	closing   atomic.Bool

	limMu  sync.RWMutex
	limits buffer.Limits

	mu      sync.Mutex
	handles map[string]*session // this replica's session handles, by session token
	byKey   sync.Map            // stream key -> *stream: where mirror changes are told
	local   localProducers      // this replica's producer roles (producer.go)

	freed    signal // a floor moved or limits changed: blocked appends decide again
	conn     connLife
	total    totalBytes
	unstored atomic.Int64 // bytes appended here and not yet stored

	held      heldLeases
	sweeper   sweeperLease
	scans     atomic.Int64         // scans this replica finished (sweep.go)
	scanSoon  atomic.Bool          // the zone changed wholesale: the sweeper scans at its next tick
	orphans   map[string]time.Time // the sweeper's: when it first found each orphan with an upstream cursor
	idle      idleEnded            // the sweeper's: ended streams with nothing to do for a while (sweep.go)
	admitting admissions
	reading   sync.Map              // *reader -> its iterator, while its consumer runs
	kvStreams sync.Map              // bucket -> the stream under it (tidy purges markers there)
	incs      incIndex              // per session incarnation, what calls ask of its streams
	tally     sessionTally          // the sessions in the mirror, by origin (admission)
	zone      zoneTally             // the sweeper's published tally, on the others (tally.go)
	probeErr  atomic.Pointer[error] // why the last health probe failed; nil while it answers
	bg        struct {
		mu     sync.Mutex
		closed bool
	}
}

var (
	_ buffer.Backend       = (*Store)(nil)
	_ buffer.Availability  = (*Store)(nil)
	_ buffer.BatchAppender = (*stream)(nil)
)

// names are the zone's JetStream names.
type names struct {
	events, evPrefix                       string // stream <P>_EVENTS, subjects <P>.ev.<key>
	sessions, streams, tombs, leases, meta string // KV buckets
}

func newNames(p string) names {
	return names{
		events: p + "_EVENTS", evPrefix: p + ".ev.",
		sessions: p + "_SESSIONS", streams: p + "_STREAMS", tombs: p + "_TOMBS",
		leases: p + "_LEASES", meta: p + "_META",
	}
}

func (n names) subject(streamKey string) string { return n.evPrefix + streamKey }

// Open connects to NATS (or starts the embedded server), provisions the
// zone's stream and buckets, loads the zone's records and starts the
// background work: the mirrors' watches, lease renewal and the sweeper.
func Open(ctx context.Context, opts Options) (*Store, error) {
	if err := opts.setDefaults(); err != nil {
		return nil, err
	}
	st := &Store{opts: opts, names: newNames(opts.Prefix), limits: opts.Limits,
		handles: make(map[string]*session)}
	st.interest.subs, st.interest.notes = make(map[string]*interestSub), make(chan *nats.Msg, noteCap)
	st.ctx, st.cancel = context.WithCancel(context.Background())
	st.held.m = make(map[string]*heldLease)
	st.held.unsure = make(map[string]*heldLease)
	ok := false
	defer func() {
		if !ok {
			st.shutdown()
		}
	}()
	if err := st.connect(); err != nil {
		return nil, err
	}
	if err := st.provision(ctx); err != nil {
		return nil, err
	}
	// An event of any size is stored, in parts if it exceeds one message;
	// only a message too small for a batch's headers and a useful part is
	// refused.
	st.maxPayload = st.nc.MaxPayload()
	if m := st.events.CachedInfo().Config.MaxMsgSize; m > 0 {
		st.maxPayload = min(st.maxPayload, int64(m))
	}
	if st.maxPayload < headerRoom+minPartRoom {
		return nil, fmt.Errorf("natsstore: the NATS servers take messages of at most %d bytes (max_payload, or the stream's max_msg_size); the store needs at least %d",
			st.maxPayload, headerRoom+minPartRoom)
	}
	st.partRoom = int(st.maxPayload - headerRoom)
	st.batchMax = min(opts.BatchBytes, st.partRoom)
	if err := st.loadKey(ctx, nil); err != nil {
		return nil, err
	}
	if err := st.loadMark(ctx); err != nil {
		return nil, fmt.Errorf("natsstore: zone mark: %w", err)
	}
	if st.srv == nil {
		// Another replica that reconnected asks for every interest to be
		// loaded again (interest.go).
		if _, err := st.nc.Subscribe(st.resyncSubject(), func(*nats.Msg) {
			st.spawn(func() { st.reloadInterests(true) })
		}); err != nil {
			return nil, fmt.Errorf("natsstore: subscribe: %w", err)
		}
		// Other replicas' session creations and deletions (tally.go).
		if _, err := st.nc.Subscribe(st.tallySubject(), st.tallyNoted); err != nil {
			return nil, fmt.Errorf("natsstore: subscribe: %w", err)
		}
	}
	// A replica counts the zone's sessions before it admits any: one that
	// finds no sweeper sweeps, and counts them itself; the others read the
	// sweeper's last count.
	// An embedded server of the store's own has no other replica: a
	// sweeper lease found there is its own previous process's, which died.
	if st.holdSweeper() || st.srv != nil {
		if err := st.awaitFullWatch(ctx); err != nil {
			return nil, err
		}
		st.publishTally()
		st.fullWatch(false)
	} else {
		st.readTally() // the sweeper's last count (review 28: admission began at nothing)
	}
	st.wg.Add(5)
	go st.renewLoop()
	go st.sweepLoop()
	go st.healthLoop()
	go st.applyNotes()
	go st.interestLoop()
	ok = true
	return st, nil
}

// connect starts the embedded server if asked, and connects.
func (st *Store) connect() error {
	o := st.opts
	copts := []nats.Option{
		nats.Name("mcp-resume " + o.ReplicaID),
		nats.MaxReconnects(-1), // forever, in the background
		nats.ReconnectWait(250 * time.Millisecond),
		nats.RetryOnFailedConnect(false),
		// Asynchronous errors (a watch's consumer gone while NATS lacks the
		// zone's buckets, a permission refused) are failed operations like
		// any other, not lines on stderr.
		nats.ErrorHandler(func(_ *nats.Conn, sub *nats.Subscription, err error) {
			st.lostNotes(sub, err) // loaded again by the interest loop
			st.fault("async", err)
		}),
		// A replica never needs its own notifications (interest.go).
		nats.NoEcho(),
		// Notifications sent while the connection was down are lost:
		// every interest is loaded again.
		nats.ReconnectHandler(func(*nats.Conn) { st.reconnected() }),
		nats.DisconnectErrHandler(func(*nats.Conn, error) { st.disconnected() }),
	}
	switch {
	case o.Server != nil:
		copts = append(copts, nats.InProcessServer(o.Server))
	case o.Embedded:
		srv, err := StartEmbedded(o.Dir, o.ServerLogs)
		if err != nil {
			return err
		}
		st.srv = srv
		copts = append(copts, nats.InProcessServer(srv))
	}
	switch {
	case o.CredentialsFile != "":
		copts = append(copts, nats.UserCredentials(o.CredentialsFile))
	case o.Token != "":
		copts = append(copts, nats.Token(o.Token))
	case o.User != "":
		copts = append(copts, nats.UserInfo(o.User, o.Password))
	}
	if o.TLSCAFile != "" {
		copts = append(copts, nats.RootCAs(o.TLSCAFile))
	}
	if o.TLSCertFile != "" || o.TLSKeyFile != "" {
		copts = append(copts, nats.ClientCert(o.TLSCertFile, o.TLSKeyFile))
	}
	url := ""
	for i, u := range o.URLs {
		if i > 0 {
			url += ","
		}
		url += u
	}
	nc, err := nats.Connect(url, copts...)
	if err != nil {
		return fmt.Errorf("natsstore: connect: %w", err)
	}
	st.nc = nc
	js, err := jetstream.New(nc)
	if err != nil {
		return fmt.Errorf("natsstore: jetstream: %w", err)
	}
	st.js = js
	return nil
}

// provision creates (or updates) the zone's stream and buckets, and the
// mirrors of the buckets.
func (st *Store) provision(ctx context.Context) error {
	kvs, err := st.ensure(ctx)
	if err != nil {
		return err
	}
	st.meta = kvs[4]
	st.sessions = newMirror(kvs[0], nil, st.sessionChanged)
	st.sessions.index = st.tally.changed
	st.streams = newMirror(kvs[1], incarnationOf, st.streamChanged)
	st.streams.index = st.incs.changed
	st.tombs = newMirror[tombRecord](kvs[2], nil, nil)
	st.leases = newMirror(kvs[3], incarnationOf, st.leaseChanged)
	st.leases.markerTTL = leaseMarkerTTL
	// Stream records and leases: each replica holds those of the sessions
	// it serves (interest.go), told of the others' writes by them.
	if st.srv == nil {
		// An embedded server of its own (Options.Embedded) listens on no
		// port: no other replica can write the zone, or hear of it.
		st.sessions.notify, st.streams.notify, st.leases.notify = st.notifier(noteSessions), st.notifier(noteStreams), st.notifier(noteLeases)
		st.sessions.unsure = st.renotifier(st.names.sessions, st.sessions.notify)
		st.streams.unsure = st.renotifier(st.names.streams, st.streams.notify)
		st.leases.unsure = st.renotifier(st.names.leases, st.leases.notify)
	}
	// A deleted record's marker goes by itself once every mirror may have
	// forgotten the deletion (tidyAge): no purge request per deletion.
	st.sessions.markerTTL, st.streams.markerTTL, st.tombs.markerTTL = recordMarkerTTL(), recordMarkerTTL(), recordMarkerTTL()
	// Record writes read their acknowledgements without encoding/json, and
	// so do a lease's take and release, and a record's removal.
	st.leases.createTTL = func(ctx context.Context, key string, value []byte, ttl time.Duration) (uint64, error) {
		return st.kvCreateTTL(ctx, st.names.leases, key, value, ttl)
	}
	for _, m := range []struct {
		set    *func(context.Context, string, uint64, time.Duration) (uint64, error)
		bucket string
	}{{&st.leases.purge, st.names.leases}, {&st.sessions.purge, st.names.sessions}, {&st.streams.purge, st.names.streams}, {&st.tombs.purge, st.names.tombs}} {
		bucket := m.bucket
		*m.set = func(ctx context.Context, key string, rev uint64, ttl time.Duration) (uint64, error) {
			return st.kvPurge(ctx, bucket, key, rev, ttl)
		}
	}
	for _, w := range []struct {
		set    *func(context.Context, string, []byte, uint64, string) (uint64, error)
		bucket string
	}{{&st.sessions.write, st.names.sessions}, {&st.streams.write, st.names.streams}, {&st.tombs.write, st.names.tombs}} {
		bucket := w.bucket
		*w.set = func(ctx context.Context, key string, value []byte, rev uint64, tag string) (uint64, error) {
			return st.kvUpdate(ctx, bucket, key, value, rev, tag)
		}
	}
	if st.srv != nil {
		// In-process (an embedded server): no connection is lost, and no
		// acknowledgement with one; the writes keep their plain path.
		return nil
	}
	st.sessions.conn, st.streams.conn, st.tombs.conn, st.leases.conn = st.conn.ctx, st.conn.ctx, st.conn.ctx, st.conn.ctx
	for _, l := range []struct {
		set    *func(context.Context, string) (string, uint64, error)
		bucket string
	}{{&st.sessions.lastTag, st.names.sessions}, {&st.streams.lastTag, st.names.streams}, {&st.tombs.lastTag, st.names.tombs}} {
		bucket := l.bucket
		*l.set = func(ctx context.Context, key string) (string, uint64, error) {
			return st.kvLastTag(ctx, bucket, key)
		}
	}
	return nil
}

// ensure creates the zone's stream and buckets where they are missing (and
// updates them where not): the same configuration on every replica, so
// replicas doing it at once converge. It returns the buckets: sessions,
// streams, tombstones, leases, meta.
func (st *Store) ensure(ctx context.Context) ([]jetstream.KeyValue, error) {
	n, r := st.names, st.opts.Replicas
	maxBytes := int64(-1)
	if l := st.Limits(); l.MaxTotalBytes > 0 {
		maxBytes = hardLimit(l.MaxTotalBytes)
	}
	var ev jetstream.Stream
	err := provisioning(ctx, func(ctx context.Context) (err error) {
		ev, err = st.js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
			Name:     n.events,
			Subjects: []string{n.evPrefix + ">"},
			Storage:  jetstream.FileStorage,
			Replicas: r,
			// A full stream refuses the publish (backpressure); nothing leaves
			// it but by an explicit purge. No MaxAge, no MaxMsgsPerSubject:
			// both would evict silently.
			Discard:     jetstream.DiscardNew,
			MaxBytes:    maxBytes,
			AllowDirect: true,
			Duplicates:  2 * time.Minute,
		})
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("natsstore: stream %s: %w", n.events, err)
	}
	if st.events == nil {
		st.events = ev
	}
	buckets := []struct {
		name string
		ttl  bool // per-key TTLs: leases' expiries, and markers that expire
	}{
		{n.sessions, true}, {n.streams, true}, {n.tombs, true}, {n.leases, true}, {n.meta, true},
	}
	kvs := make([]jetstream.KeyValue, len(buckets))
	for i, b := range buckets {
		cfg := jetstream.KeyValueConfig{Bucket: b.name, History: 1, Storage: jetstream.FileStorage, Replicas: r}
		if b.ttl {
			cfg.LimitMarkerTTL = leaseMarkerTTL // expiries reach the watches
		}
		var kv jetstream.KeyValue
		err := provisioning(ctx, func(ctx context.Context) (err error) {
			kv, err = st.js.CreateOrUpdateKeyValue(ctx, cfg)
			return err
		})
		if err != nil {
			return nil, fmt.Errorf("natsstore: bucket %s: %w", b.name, err)
		}
		kvs[i] = kv
	}
	return kvs, nil
}

// leaseMarkerTTL is how long JetStream keeps the marker of a lease that
// expired or was released (the lease buckets' LimitMarkerTTL): long enough
// for every watch to see it, and then it goes by itself.
const leaseMarkerTTL = 5 * time.Second

// recordMarkerTTL is how long the marker of a deleted session, stream or
// tombstone record stays in its bucket: as long as the mirrors remember
// the deletion (tidyAge), so a late delivery of an older revision never
// brings the key back; at least a second, JetStream's least message TTL.
func recordMarkerTTL() time.Duration { return max(tidyAge, time.Second) }

// provisioning retries fn while the cluster is still forming (no leader,
// peers not yet known to it) until ctx ends.
func provisioning(ctx context.Context, fn func(context.Context) error) error {
	var why error // the last refusal other than running out of time
	for round := 0; ; round++ {
		// Each attempt has its own deadline: a request whose reply was
		// lost to a leader change is retried, not waited on for good.
		actx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err := fn(actx)
		cancel()
		var api *jetstream.APIError
		if err == nil || !transient(err) && !(errors.As(err, &api) && api.ErrorCode == errCodeNoPeers) {
			return err
		}
		if ctx.Err() == nil {
			why = err
		}
		if !sleepCtx(ctx, backoff(round)) {
			if why != nil {
				return fmt.Errorf("%w (last: %v)", ctx.Err(), why)
			}
			return err
		}
	}
}

// loadKey reads the zone secret, creating it if this is the zone's first
// replica (as key, or a new one if nil): every replica keys fingerprints
// and epochs with the same. The first writer wins.
func (st *Store) loadKey(ctx context.Context, key []byte) error {
	if key == nil {
		key = make([]byte, 32)
		rand.Read(key)
	}
	err := provisioning(ctx, func(ctx context.Context) error {
		_, err := st.meta.Create(ctx, "secret", key)
		if err == nil {
			st.key.Store(&key)
			return nil
		}
		if !errors.Is(err, jetstream.ErrKeyExists) {
			return err
		}
		e, err := st.meta.Get(ctx, "secret")
		if err != nil {
			return err
		}
		v := e.Value()
		st.key.Store(&v)
		return nil
	})
	if err != nil {
		return fmt.Errorf("natsstore: zone secret: %w", err)
	}
	if len(st.Key()) != 32 {
		return errors.New("natsstore: the zone secret is malformed")
	}
	return nil
}

// stopMirrors stops the whole-bucket watches, if this replica runs them,
// and waits until they have; the sweep starts them again.
func (st *Store) stopMirrors() {
	st.interest.fullMu.Lock()
	st.stopFull()
	st.interest.fullMu.Unlock()
}

// MaxPayload is the most event bytes one message takes: a larger event is
// stored in several (see DESIGN.md, "Event size").
func (st *Store) MaxPayload() int64 { return int64(st.partRoom) }

// fault reports a failed NATS operation.
func (st *Store) fault(op string, err error) {
	if err != nil && st.opts.OnError != nil {
		st.opts.OnError(op, err)
	}
}

// Close implements buffer.Store: this replica stops, the zone goes on.
// Streams this replica produces are drained for DrainTimeout, then what is
// left of them is flushed and failed (their clients learn it on any
// replica); readers end; leases and consumers are released; the embedded
// server, if any, shuts down. It may be called more than once.
func (st *Store) Close() { st.closeOnce.Do(st.close) }

func (st *Store) close() {
	st.drain()
	st.closing.Store(true)
	for _, s := range st.handleList() {
		s.leave()
	}
	st.held.releaseAll(st)
	st.sweeper.release(st)
	st.shutdown()
}

// spawn runs fn in the background, counted in wg, unless shutdown has begun
// waiting for the background work (a WaitGroup must not grow while waited
// on); it reports whether fn runs.
func (st *Store) spawn(fn func()) bool {
	st.bg.mu.Lock()
	defer st.bg.mu.Unlock()
	if st.bg.closed {
		return false
	}
	st.wg.Add(1)
	go func() {
		defer st.wg.Done()
		fn()
	}()
	return true
}

// shutdown stops the background work and the connection without releasing
// anything: what a crash leaves behind (tests use it alone).
func (st *Store) shutdown() {
	st.closing.Store(true)
	st.cancel()
	st.reading.Range(func(_, it any) bool { // readers whose relay has yet to close them
		it.(jetstream.MessagesContext).Stop()
		return true
	})
	st.bg.mu.Lock()
	st.bg.closed = true // no background work starts after this
	st.bg.mu.Unlock()
	st.wg.Wait()
	if st.nc != nil {
		st.nc.Close()
	}
	if st.srv != nil {
		st.srv.Shutdown()
		st.srv.WaitForShutdown()
	}
}

// drain waits up to DrainTimeout for the streams this replica produces to
// end by themselves.
func (st *Store) drain() {
	deadline := time.Now().Add(st.opts.DrainTimeout)
	for time.Now().Before(deadline) {
		busy := false
		for _, s := range st.handleList() {
			if s.producing() {
				busy = true
			}
		}
		if !busy {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// handleList returns the session handles made here.
func (st *Store) handleList() []*session {
	st.mu.Lock()
	defer st.mu.Unlock()
	return slices.Collect(maps.Values(st.handles))
}

// Counters implements buffer.Inspector: this replica's counts.
func (st *Store) Counters() *buffer.Counters { return &st.counters }

// Key implements buffer.Store: the zone secret, the same on every replica.
func (st *Store) Key() []byte {
	if k := st.key.Load(); k != nil {
		return *k
	}
	return nil
}

// Limits returns the current limits.
func (st *Store) Limits() buffer.Limits {
	st.limMu.RLock()
	defer st.limMu.RUnlock()
	return st.limits
}

// hardLimit is the events stream's MaxBytes for max_total_bytes: an eighth
// above it. The budget decides on max_total_bytes (with its reserve for
// connected clients); across replicas its figures are approximate, and
// JetStream's own limit is the backstop that never lets the store grow
// without bound, not the bound clients meet first.
func hardLimit(total int64) int64 { return total + total/8 }

// SetLimits implements buffer.Store. A new max_total_bytes moves the
// events stream's MaxBytes.
func (st *Store) SetLimits(l buffer.Limits) {
	st.limMu.Lock()
	old := st.limits
	st.limits = l
	st.limMu.Unlock()
	if l.MaxTotalBytes != old.MaxTotalBytes && l.MaxTotalBytes > 0 {
		ctx, cancel := context.WithTimeout(st.ctx, 10*time.Second)
		defer cancel()
		info, err := st.events.Info(ctx)
		if err == nil {
			cfg := info.Config
			cfg.MaxBytes = hardLimit(l.MaxTotalBytes)
			_, err = st.js.UpdateStream(ctx, cfg)
		}
		st.fault("update_stream", err)
	}
	st.freed.fire()
}

// deliveryQuantum is how finely delivery times are kept: about 64 records
// per window, so a stream record stays small; an event may stay up to a
// quantum longer than its window.
func (st *Store) deliveryQuantum() time.Duration {
	return max(st.Limits().ResumeWindow/64, time.Millisecond)
}
