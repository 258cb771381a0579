package resume

import (
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/mcpresume/caddy-mcp-resume/buffer"
	"github.com/mcpresume/caddy-mcp-resume/policy"
)

// Metric names are caddy_mcp_resume_* (the engine's metrics are the Caddy
// module's, under the same names embedded or not). Counters kept by the
// stores and by this package live as long as the process, so a config
// reload never resets them. Store figures are summed over stores.
const namespace, subsystem = "caddy", "mcp_resume"

func newCounterVec(name, help string, labels ...string) *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: namespace, Subsystem: subsystem, Name: name, Help: help}, labels)
}

func newCounter(name, help string) prometheus.Counter {
	return prometheus.NewCounter(prometheus.CounterOpts{Namespace: namespace, Subsystem: subsystem, Name: name, Help: help})
}

var (
	resumes = newCounterVec("resumes_total",
		"Resumes (GET with Last-Event-ID) by outcome: replayed, noop, gap, rejected, adopted, ended, pass_through.", "outcome")
	gaps = newCounterVec("gaps_total",
		"Gap signals, by reason: resumes that met a gap, and streams that failed (their signal is in the log).", "reason")
	limitsHit = newCounterVec("limit_rejections_total",
		"Requests refused, passed through or streams failed because a configured limit was reached, by limit.", "limit")
	upstreamReconnects = newCounterVec("upstream_reconnects_total",
		"GETs with the upstream's Last-Event-ID (or, on the standalone stream, without one) that resumed an upstream stream that ended early, by outcome: resumed, failed, refused, exhausted; own_conflict (a standalone GET taken over from a lapsed lease met a 409: asked again), own_conflict_exhausted (it did not open within the bound).", "outcome")
	takeovers = newCounterVec("takeovers_total",
		"Request streams whose producer replica died, taken over by this replica for a client that reads them: resumed (the upstream answered the resume from the stored upstream event ID), refused (it refused it: the call failed explicitly), credential_refused (it refused, 401, the credential the client came back with: the call waits for the client to refresh), failed (it could not be reached: the call failed explicitly), complete (every answer was stored already: the stream ended here).", "outcome")
	relays = newCounterVec("relays_total",
		"Relays of a tapped response to its client, by writer: tap (the goroutine reading the upstream wrote the start itself: an HTTP/1 client whose connection's send queue was empty) or goroutine (a goroutine of its own from the start: HTTP/2 and 3, a send queue not empty, a shared store's stream).", "writer")
	// Looked up once: every tapped response counts in one.
	relaysByTap, relaysByGoroutine = relays.WithLabelValues("tap"), relays.WithLabelValues("goroutine")
	untapped                       = newCounterVec("untapped_total",
		"SSE responses passed through without retention (not resumable), by reason: compressed, stream_refused, attach_failed, not_authorized.", "reason")
	storeRefusals = newCounterVec("store_refusals_total",
		"Requests refused with 503 because the zone's store could not take them, by reason: connecting (a shared store not connected yet), unavailable (it lost its connection), draining (this process is stopping).", "reason")
	storeErrors = newCounterVec("store_errors_total",
		"Failed operations of a shared store (NATS JetStream), by zone and operation. Publishes into a full JetStream stream count here too (op publish): that is backpressure, retried.", "zone", "op")
	storeDataLost = newCounterVec("store_data_lost_total",
		"Times a shared store found NATS without the zone's data (a server back with an empty store directory) and recreated it, by zone: what it retained is lost; resumes of its streams get gaps.", "zone")
	storePublish = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: namespace, Subsystem: subsystem, Name: "store_publish_seconds",
		Help:    "How long a shared store (JetStream) took to acknowledge a batch of events, retries included: the latency the store adds before events reach clients.",
		Buckets: prometheus.ExponentialBuckets(0.0001, 4, 10),
	}, []string{"zone"})
	credentialRejections = newCounter("credential_rejections_total",
		"Requests refused with 403 because their credentials are not the session's: another identity, another principal, or a changed credential the proxy cannot tell is the same principal's.")
	credentialChecks = newCounterVec("credential_checks_total",
		"Requests whose credential the upstream was asked to vouch for (a changed bearer token, or any on a request answered from a log), by outcome: accepted (the bound credential, accepted again), rebound, refused_upstream, refused_principal, refused_unverifiable, session_lost, unverified.", "outcome")
	retriesServed = newCounter("repeated_requests_total",
		"Repeated requests (same session, ids and body) answered from the retained stream instead of running again.")
	replayed = newCounter("replayed_events_total",
		"Events written to resuming clients from the log (those the client had missed).")
	stallSeconds = prometheus.NewHistogram(prometheus.HistogramOpts{
		Namespace: namespace, Subsystem: subsystem, Name: "backpressure_stall_seconds",
		Help:    "How long appends waited for room in a full log (the upstream was not read meanwhile).",
		Buckets: prometheus.ExponentialBuckets(0.001, 4, 10),
	})
)

// StoreView is one store as the collectors see it at scrape time: its
// zone's name, the store's operator reads (nil while it is not open),
// whether it is shared (only a shared store has store_up) and whether it
// takes new work now (Runtime.Unavailable).
type StoreView struct {
	Zone   string
	Store  buffer.Inspector
	Shared bool
	Up     bool
}

// storeCollector reads the live stores' counters and gauges at scrape time.
type storeCollector struct{ stores func() []StoreView }

func desc(name, help string, labels ...string) *prometheus.Desc {
	return prometheus.NewDesc(prometheus.BuildFQName(namespace, subsystem, name), help, labels, nil)
}

var (
	descEnqueued       = desc("events_enqueued_total", "Events appended to retention logs.")
	descEvicted        = desc("events_evicted_total", "Events evicted after they were acknowledged or their resume window passed.")
	descEvictedEarly   = desc("events_evicted_before_ack_total", "Events evicted while a client could still ask for them, or found gone by a reader. Must stay 0: alert on any increase.")
	descResumesEvicted = desc("resumes_from_evicted_total", "Resumes whose Last-Event-ID was below the retained floor (answered with a gap).")
	descStalls         = desc("backpressure_stalls_total", "Appends that found their log full and paused the upstream read.")
	descFailed         = desc("streams_failed_total", "Streams that failed, by reason.", "reason")
	descTombsDropped   = desc("tombstones_dropped_total", "Ended sessions forgotten before their hour because too many were remembered.")
	descRetained       = desc("retained_bytes", "Bytes retained in logs: the memory their chunks hold.")
	descSessions       = desc("sessions", "Sessions held.")
	descStreams        = desc("streams", "Streams held (live, or ended with metadata kept).")
	descConnected      = desc("connected_clients", "Client connections reading from logs.")
	descProducing      = desc("upstream_reads", "Upstream responses being read into logs.")
	descStalled        = desc("stalled_streams", "Streams whose upstream read is paused by backpressure now.")
	descDetached       = desc("detached_upstreams", "Upstream responses still being read into logs after their client left.")
	descTombstones     = desc("tombstones", "Ended sessions remembered (for credential checks and precise late answers).")
	descStoreUp        = desc("store_up", "1 while the zone's shared store is connected, 0 while it is not (requests that need it get 503).", "zone")
)

func (storeCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descEnqueued, descEvicted, descEvictedEarly, descResumesEvicted, descStalls,
		descFailed, descTombsDropped, descRetained, descSessions, descStreams, descConnected, descProducing, descStalled,
		descDetached, descTombstones, descStoreUp} {
		ch <- d
	}
}

func (c storeCollector) Collect(ch chan<- prometheus.Metric) {
	views := c.stores()
	for _, v := range views {
		if v.Shared {
			up := 0.0
			if v.Store != nil && v.Up {
				up = 1
			}
			ch <- prometheus.MustNewConstMetric(descStoreUp, prometheus.GaugeValue, up, v.Zone)
		}
	}
	var n int
	var enq, ev, early, fromEv, stalls, tombsDropped uint64
	failed := make(map[policy.Reason]uint64)
	var s buffer.Stats
	for _, v := range views {
		st := v.Store
		if st == nil {
			continue
		}
		n++
		c := st.Counters()
		enq += c.EventsEnqueued.Load()
		ev += c.EventsEvicted.Load()
		early += c.EventsEvictedBeforeAck.Load()
		fromEv += c.ResumesFromEvicted.Load()
		stalls += c.Stalls.Load()
		tombsDropped += c.TombstonesDropped.Load()
		for r, v := range c.FailedStreams() {
			failed[r] += v
		}
		z := st.Stats()
		s.RetainedBytes += z.RetainedBytes
		s.Sessions += z.Sessions
		s.Streams += z.Streams
		s.Connected += z.Connected
		s.Producing += z.Producing
		s.StalledStreams += z.StalledStreams
		s.Detached += z.Detached
		s.Tombstones += z.Tombstones
	}
	if n == 0 {
		return
	}
	counter := func(d *prometheus.Desc, v uint64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	gauge := func(d *prometheus.Desc, v float64) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v)
	}
	counter(descEnqueued, enq)
	counter(descEvicted, ev)
	counter(descEvictedEarly, early)
	counter(descResumesEvicted, fromEv)
	counter(descStalls, stalls)
	counter(descTombsDropped, tombsDropped)
	for _, r := range []policy.Reason{policy.ReasonStalled, policy.ReasonUpstreamFailed, policy.ReasonUpstreamClosed,
		policy.ReasonTooLarge, policy.ReasonDeleted, policy.ReasonExpired, policy.ReasonPurged} {
		counter(descFailed, failed[r], string(r))
	}
	gauge(descRetained, float64(s.RetainedBytes))
	gauge(descSessions, float64(s.Sessions))
	gauge(descStreams, float64(s.Streams))
	gauge(descConnected, float64(s.Connected))
	gauge(descProducing, float64(s.Producing))
	gauge(descStalled, float64(s.StalledStreams))
	gauge(descDetached, float64(s.Detached))
	gauge(descTombstones, float64(s.Tombstones))
}

// Collectors are the engine's metrics: the process-wide counters, and a
// collector reading the stores stores lists at scrape time.
func Collectors(stores func() []StoreView) []prometheus.Collector {
	return []prometheus.Collector{resumes, gaps, limitsHit, upstreamReconnects, takeovers, untapped, relays, replayed,
		retriesServed, credentialRejections, credentialChecks, storeRefusals, storeErrors, storeDataLost,
		storePublish, stallSeconds, storeCollector{stores}}
}

// Register adds Collectors(stores) to reg; collectors reg has already (a
// config reload registers them again) are no error.
func Register(reg prometheus.Registerer, stores func() []StoreView) error {
	if reg == nil {
		return nil
	}
	for _, c := range Collectors(stores) {
		if err := reg.Register(c); err != nil {
			var already prometheus.AlreadyRegisteredError
			if !errors.As(err, &already) {
				return err
			}
		}
	}
	return nil
}

// ObserveStorePublish records how long a shared store took to store a batch.
func ObserveStorePublish(zone string, took time.Duration) {
	storePublish.WithLabelValues(zone).Observe(took.Seconds())
}

// CountStoreError counts a failed operation of a shared store.
func CountStoreError(zone, op string) { storeErrors.WithLabelValues(zone, op).Inc() }

// CountStoreDataLost counts a shared store that found its data gone.
func CountStoreDataLost(zone string) { storeDataLost.WithLabelValues(zone).Inc() }
