package caddymodule

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/mcpresume/caddy-mcp-resume/policy"
)

// Metric names are caddy_mcp_resume_*. Counters kept by the store and by this
// package live as long as the process, so a config reload never resets them.
const namespace, subsystem = "caddy", "mcp_resume"

func newCounterVec(name, help string, labels ...string) *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: namespace, Subsystem: subsystem, Name: name, Help: help}, labels)
}

var (
	resumes = newCounterVec("resumes_total",
		"Resumes (GET with Last-Event-ID) by outcome: replayed, noop, gap, rejected, adopted, pass_through.", "outcome")
	gaps = newCounterVec("gaps_total",
		"Gap signals sent to clients, by reason.", "reason")
	limitsHit = newCounterVec("limit_rejections_total",
		"Requests refused or streams failed because a configured limit was reached, by limit.", "limit")
	credentialRejections = prometheus.NewCounter(prometheus.CounterOpts{Namespace: namespace, Subsystem: subsystem, Name: "credential_rejections_total",
		Help: "Requests refused with 403 because their bind_headers differ from the session's."})
	retriesServed = prometheus.NewCounter(prometheus.CounterOpts{Namespace: namespace, Subsystem: subsystem, Name: "repeated_requests_total",
		Help: "Repeated requests (same session, ids and body) answered from the retained stream instead of running again."})
	replayed = prometheus.NewCounter(prometheus.CounterOpts{Namespace: namespace, Subsystem: subsystem, Name: "replayed_events_total",
		Help: "Events written to resuming clients from the log (those the client had missed)."})

	metrics = struct{ stallSeconds prometheus.Histogram }{
		stallSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: namespace, Subsystem: subsystem, Name: "backpressure_stall_seconds",
			Help:    "How long appends waited for room in a full log (the upstream was not read meanwhile).",
			Buckets: prometheus.ExponentialBuckets(0.001, 4, 10),
		}),
	}
)

// storeCollector reads the live store's counters and gauges at scrape time.
type storeCollector struct{}

func desc(name, help string, labels ...string) *prometheus.Desc {
	return prometheus.NewDesc(prometheus.BuildFQName(namespace, subsystem, name), help, labels, nil)
}

var (
	descEnqueued       = desc("events_enqueued_total", "Events appended to retention logs.")
	descEvicted        = desc("events_evicted_total", "Events evicted after they were acknowledged or their resume window passed.")
	descEvictedEarly   = desc("events_evicted_before_ack_total", "Events evicted while a client could still ask for them. Must stay 0: alert on any increase.")
	descResumesEvicted = desc("resumes_from_evicted_total", "Resumes whose Last-Event-ID was below the retained floor (answered with a gap).")
	descStalls         = desc("backpressure_stalls_total", "Appends that found their log full and paused the upstream read.")
	descFailed         = desc("streams_failed_total", "Streams that failed, by reason.", "reason")
	descRetained       = desc("retained_bytes", "Bytes retained in logs (payload plus per-event overhead).")
	descSessions       = desc("sessions", "Sessions held.")
	descStreams        = desc("streams", "Streams held (live, or ended with metadata kept).")
	descConnected      = desc("connected_clients", "Client connections reading from logs.")
	descProducing      = desc("upstream_reads", "Upstream responses being read into logs.")
	descStalled        = desc("stalled_streams", "Streams whose upstream read is paused by backpressure now.")
	descDetached       = desc("detached_upstreams", "Upstream responses still being read into logs after their client left.")
)

func (storeCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descEnqueued, descEvicted, descEvictedEarly, descResumesEvicted, descStalls,
		descFailed, descRetained, descSessions, descStreams, descConnected, descProducing, descStalled, descDetached} {
		ch <- d
	}
}

func (storeCollector) Collect(ch chan<- prometheus.Metric) {
	st, ok := currentStore()
	if !ok {
		return
	}
	c := st.Counters()
	counter := func(d *prometheus.Desc, v uint64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	gauge := func(d *prometheus.Desc, v float64) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v)
	}
	counter(descEnqueued, c.EventsEnqueued.Load())
	counter(descEvicted, c.EventsEvicted.Load())
	counter(descEvictedEarly, c.EventsEvictedBeforeAck.Load())
	counter(descResumesEvicted, c.ResumesFromEvicted.Load())
	counter(descStalls, c.Stalls.Load())
	failed := c.FailedStreams()
	for _, r := range []policy.Reason{policy.ReasonStalled, policy.ReasonUpstreamFailed, policy.ReasonTooLarge, policy.ReasonDeleted, policy.ReasonExpired, policy.ReasonPurged} {
		counter(descFailed, failed[r], string(r))
	}
	s := st.Stats()
	gauge(descRetained, float64(s.RetainedBytes))
	gauge(descSessions, float64(s.Sessions))
	gauge(descStreams, float64(s.Streams))
	gauge(descConnected, float64(s.Connected))
	gauge(descProducing, float64(s.Producing))
	gauge(descStalled, float64(s.StalledStreams))
	gauge(descDetached, float64(s.Detached))
}

// registerMetrics adds the collectors to a config's registry. Each config
// gets a new registry; the collectors are the same process-wide ones.
func registerMetrics(reg *prometheus.Registry) error {
	if reg == nil {
		return nil
	}
	for _, c := range []prometheus.Collector{resumes, gaps, limitsHit, replayed, retriesServed, credentialRejections, metrics.stallSeconds, storeCollector{}} {
		if err := reg.Register(c); err != nil {
			var already prometheus.AlreadyRegisteredError
			if !errors.As(err, &already) {
				return err
			}
		}
	}
	return nil
}
