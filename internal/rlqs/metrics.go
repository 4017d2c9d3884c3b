package rlqs

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/extauthz/extauthz/internal/metrics"
)

// Metrics are this door's own collectors; its takes count in the
// engine's decision metrics under their policies, as every door's do.
type Metrics struct {
	streams     prometheus.Gauge
	reports     prometheus.Counter
	refused     *prometheus.CounterVec
	assignments *prometheus.CounterVec
	tokens      prometheus.Counter
	returned    prometheus.Counter
}

// The reasons a report or a stream is refused, as counted.
const (
	reasonNoDomain      = "no_domain"
	reasonUnknownDomain = "unknown_domain"
	reasonDomainChanged = "domain_changed"
	reasonTooManyUsages = "too_many_usages"
	reasonBadBucketID   = "bad_bucket_id"
	reasonBadElapsed    = "bad_time_elapsed"
	reasonBadCount      = "bad_count"
	reasonTooManyBucket = "too_many_buckets"
	reasonTooManyStream = "too_many_streams"
)

// NewMetrics registers the door's collectors with reg (nil: registered
// nowhere, for tests).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		streams: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: metrics.Namespace, Name: "rlqs_streams",
			Help: "Envoy rate limit quota streams open.",
		}),
		reports: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: metrics.Namespace, Name: "rlqs_reports_total",
			Help: "Usage reports received from Envoy's rate_limit_quota filter and acted on.",
		}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: metrics.Namespace, Name: "rlqs_refused_total",
			Help: "Reports, streams and buckets refused, by reason; nothing is charged for them.",
		}, []string{"reason"}),
		assignments: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: metrics.Namespace, Name: "rlqs_assignments_total",
			Help: "Bucket actions sent to Envoy, by action (token_bucket, renew, deny_all, allow_all, abandon).",
		}, []string{"action"}),
		tokens: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: metrics.Namespace, Name: "rlqs_tokens_taken_total",
			Help: "Tokens taken from policies' counts for Envoy's assignments.",
		}),
		returned: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: metrics.Namespace, Name: "rlqs_tokens_returned_total",
			Help: "Tokens given back to policies' counts: refill paid ahead for an assignment a new one replaced.",
		}),
	}
	for _, r := range []string{reasonNoDomain, reasonUnknownDomain, reasonDomainChanged, reasonTooManyUsages, reasonBadBucketID, reasonBadElapsed, reasonBadCount, reasonTooManyBucket, reasonTooManyStream} {
		m.refused.WithLabelValues(r)
	}
	if reg != nil {
		reg.MustRegister(m.streams, m.reports, m.refused, m.assignments, m.tokens, m.returned)
	}
	return m
}
