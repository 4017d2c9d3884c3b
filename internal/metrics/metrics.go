// Package metrics declares the sidecar's Prometheus metrics, each beside its
// help text, on a registry of its own so tests and reloads never collide
// with the global one.
package metrics

import (
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Namespace prefixes every metric name.
const Namespace = "extauthz"

// Metrics holds the collectors. Create one per process with New.
type Metrics struct {
	Registry *prometheus.Registry

	// Decisions counts policy decisions by policy, mode and result
	// (allowed, denied, shadow_denied, refunded).
	Decisions *prometheus.CounterVec
	// Checks counts Check calls by outcome (ok, over_limit, unauthorized,
	// unavailable, error).
	Checks *prometheus.CounterVec
	// CheckDuration is the time Check takes, from arrival to answer.
	CheckDuration prometheus.Histogram
	// ConfigReloads counts configuration reloads by result (success, failure).
	ConfigReloads *prometheus.CounterVec
	// ConfigPolicies is the number of policies in the running configuration.
	ConfigPolicies prometheus.Gauge

	// RedisCalls counts calls to Redis by operation (lease, return, peers,
	// an algorithm's script, confirm, probe) and result (ok, error,
	// timeout, canceled, abandoned).
	RedisCalls *prometheus.CounterVec
	// RedisDuration is the time Redis calls take, by operation.
	RedisDuration *prometheus.HistogramVec
	// RedisUp is 1 while the store answers, 0 while it is marked down.
	RedisUp prometheus.Gauge
	// BreakerOpened counts the times the store was marked down.
	BreakerOpened prometheus.Counter
	// SlicesLeased counts hybrid lease calls that granted tokens;
	// TokensLeased the tokens they granted.
	SlicesLeased prometheus.Counter
	TokensLeased prometheus.Counter
	// TokensReturned counts unspent hybrid tokens given back to Redis, by
	// reason (idle, evicted, shutdown, refund).
	TokensReturned *prometheus.CounterVec
	// LeaseWaits counts hybrid decisions that waited for another request's
	// lease of the same key instead of calling Redis themselves.
	LeaseWaits prometheus.Counter
	// Peers is the replica count last observed through Redis heartbeats.
	Peers prometheus.Gauge
	// Degraded counts decisions made without Redis, by policy and the
	// on_redis_error action taken (fallback, allow, deny).
	Degraded *prometheus.CounterVec
}

// New registers the collectors, plus Go runtime and process metrics and
// build information for version.
func New(version string) *Metrics {
	reg := prometheus.NewRegistry()
	m := &Metrics{
		Registry: reg,
		Decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: Namespace, Name: "decisions_total",
			Help: "Policy decisions by policy, mode and result (allowed, denied, shadow_denied, refunded).",
		}, []string{"policy", "mode", "result"}),
		Checks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: Namespace, Name: "checks_total",
			Help: "Check calls by outcome (ok, over_limit, unauthorized, unavailable, canceled, error).",
		}, []string{"outcome"}),
		CheckDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: Namespace, Name: "check_duration_seconds",
			Help: "Time from Check's arrival to its answer.",
			// From 10µs: local decisions take tens of microseconds, Redis
			// round trips a few hundred, and Envoy's budget is 200ms.
			Buckets: []float64{10e-6, 25e-6, 50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 10e-3, 25e-3, 50e-3, 100e-3, 250e-3},
		}),
		ConfigReloads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: Namespace, Name: "config_reloads_total",
			Help: "Configuration reloads by result (success, failure).",
		}, []string{"result"}),
		ConfigPolicies: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: Namespace, Name: "config_policies",
			Help: "Policies in the running configuration.",
		}),
	}
	m.RedisCalls = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: Namespace, Name: "redis_calls_total",
		Help: "Redis calls by operation and result (ok, error, timeout, canceled by the caller, abandoned when Redis was marked down).",
	}, []string{"op", "result"})
	m.RedisDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: Namespace, Name: "redis_call_duration_seconds",
		Help:    "Time Redis calls take, by operation.",
		Buckets: []float64{50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 10e-3, 20e-3, 50e-3, 100e-3},
	}, []string{"op"})
	m.RedisUp = prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace: Namespace, Name: "redis_up",
		Help: "1 while Redis answers, 0 while the store is marked down.",
	})
	m.BreakerOpened = prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: Namespace, Name: "redis_breaker_opened_total",
		Help: "Times Redis was marked down (a failed or stalled call, confirmed by a failed probe on its own connection).",
	})
	m.SlicesLeased = prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: Namespace, Name: "hybrid_slices_leased_total",
		Help: "Hybrid lease calls that granted tokens.",
	})
	m.TokensLeased = prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: Namespace, Name: "hybrid_tokens_leased_total",
		Help: "Tokens granted to hybrid slices.",
	})
	m.TokensReturned = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: Namespace, Name: "hybrid_tokens_returned_total",
		Help: "Unspent hybrid tokens given back to Redis, by reason (idle, evicted, shutdown, refund).",
	}, []string{"reason"})
	m.LeaseWaits = prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: Namespace, Name: "hybrid_lease_waits_total",
		Help: "Hybrid decisions that waited for a lease already in flight for their key.",
	})
	m.Peers = prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace: Namespace, Name: "peers",
		Help: "Replicas observed through Redis heartbeats (the last count while Redis is down).",
	})
	m.Degraded = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: Namespace, Name: "degraded_decisions_total",
		Help: "Decisions made while Redis was unreachable, by policy and on_redis_error action (fallback, allow, deny).",
	}, []string{"policy", "action"})
	buildInfo := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: Namespace, Name: "build_info",
		Help: "Always 1; the version label names the running build.",
	}, []string{"version"})
	buildInfo.WithLabelValues(version).Set(1)
	// Series that exist from the start, so dashboards and alerts see 0
	// rather than nothing.
	m.ConfigReloads.WithLabelValues("success")
	m.ConfigReloads.WithLabelValues("failure")
	for _, reason := range []string{"idle", "evicted", "shutdown", "refund"} {
		m.TokensReturned.WithLabelValues(reason)
	}
	reg.MustRegister(m.Decisions, m.Checks, m.CheckDuration, m.ConfigReloads, m.ConfigPolicies, buildInfo,
		m.RedisCalls, m.RedisDuration, m.RedisUp, m.BreakerOpened, m.SlicesLeased, m.TokensLeased, m.TokensReturned, m.LeaseWaits, m.Peers, m.Degraded,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// CacheStats is what the cache gauges read.
type CacheStats interface {
	Len() int
	Bound() int
	Evictions() uint64
}

// RegisterCache exposes the size, bound and evictions of the per-key cache.
func (m *Metrics) RegisterCache(c CacheStats) {
	m.Registry.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Namespace: Namespace, Name: "cache_entries",
			Help: "Per-key entries held in the local cache.",
		}, func() float64 { return float64(c.Len()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Namespace: Namespace, Name: "cache_capacity",
			Help: "The most entries the local cache will hold (local.max_keys).",
		}, func() float64 { return float64(c.Bound()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Namespace: Namespace, Name: "cache_evictions_total",
			Help: "Entries pushed out of the local cache to make room.",
		}, func() float64 { return float64(c.Evictions()) }),
	)
}

// Handler serves the registry in the Prometheus text format.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.Registry, promhttp.HandlerOpts{Registry: m.Registry})
}
