package engine

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/extauthz/extauthz/internal/quota"
)

// Metrics are the decision's collectors, shared by every door. Create them
// once per process with NewMetrics; the zero value is not usable.
type Metrics struct {
	// Decisions counts policy decisions by policy, mode and result
	// (allowed, denied, shadow_denied, refunded; unlimited for the
	// decisions of unlimited policies and plans).
	Decisions *prometheus.CounterVec
	// Degraded counts decisions made while Redis was unreachable, by
	// policy and the on_redis_error action taken (fallback, allow, deny).
	Degraded *prometheus.CounterVec
	// Checks counts answered requests by door (grpc: Envoy's ext_authz
	// Check; http: the HTTP door) and outcome (see Outcome).
	Checks *prometheus.CounterVec
	// CheckDuration is the time from a request's arrival to its answer,
	// by door.
	CheckDuration *prometheus.HistogramVec
	// ConfigPolicies is the number of policies in the running configuration.
	ConfigPolicies prometheus.Gauge
	// CostDefaulted counts requests charged a policy's default cost because
	// the cost they carried was missing or malformed, by policy and reason.
	CostDefaulted *prometheus.CounterVec
	// LimitDefaulted counts requests given a policy's default limit because
	// the limit they carried was missing or malformed, by policy and
	// reason; LimitClamped those whose limit was above the policy's max
	// (they get max), by policy.
	LimitDefaulted *prometheus.CounterVec
	LimitClamped   *prometheus.CounterVec
	// UnknownPlans counts requests whose plan_from named no plan (they get
	// plans.default), by policy.
	UnknownPlans *prometheus.CounterVec
}

// NewMetrics creates the collectors and registers them with reg (none when
// reg is nil).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	const ns = "extauthz"
	m := &Metrics{
		Decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Name: "decisions_total",
			Help: "Policy decisions by policy, mode and result (allowed, denied, shadow_denied, refunded, unlimited).",
		}, []string{"policy", "mode", "result"}),
		Degraded: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Name: "degraded_decisions_total",
			Help: "Decisions made while Redis was unreachable, by policy and on_redis_error action (fallback, allow, deny).",
		}, []string{"policy", "action"}),
		Checks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Name: "checks_total",
			Help: "Answered requests by door (grpc: Envoy's ext_authz Check; http: the HTTP authorization endpoint) and outcome (ok, over_limit, unauthorized, unavailable, canceled, error).",
		}, []string{"door", "outcome"}),
		CheckDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: ns, Name: "check_duration_seconds",
			Help: "Time from a request's arrival to its answer, by door.",
			// From 10µs: local decisions take tens of microseconds, Redis
			// round trips a few hundred, and Envoy's budget is 200ms.
			Buckets: []float64{10e-6, 25e-6, 50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 10e-3, 25e-3, 50e-3, 100e-3, 250e-3},
		}, []string{"door"}),
		ConfigPolicies: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: ns, Name: "config_policies",
			Help: "Policies in the running configuration.",
		}),
		CostDefaulted: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Name: "cost_defaulted_total",
			Help: "Requests charged a policy's default cost because the cost they carried was missing or malformed, by policy and reason (missing, malformed).",
		}, []string{"policy", "reason"}),
		LimitDefaulted: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Name: "limit_defaulted_total",
			Help: "Requests given a policy's default limit because the limit they carried was missing or malformed, by policy and reason (missing, malformed).",
		}, []string{"policy", "reason"}),
		LimitClamped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Name: "limit_clamped_total",
			Help: "Requests whose limit was above the policy's max (they get max), by policy.",
		}, []string{"policy"}),
		UnknownPlans: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Name: "unknown_plans_total",
			Help: "Requests whose plan_from named no plan under plans (they get plans.default), by policy.",
		}, []string{"policy"}),
	}
	if reg != nil {
		reg.MustRegister(m.Decisions, m.Degraded, m.Checks, m.CheckDuration, m.ConfigPolicies, m.CostDefaulted, m.LimitDefaulted, m.LimitClamped, m.UnknownPlans)
	}
	return m
}

// DoorMetrics is one door's view of the metrics: its requests counted
// under its name, with the label lookups done once.
type DoorMetrics struct {
	outcomes [outcomeCount]prometheus.Counter
	duration prometheus.Observer
}

// Door returns the metrics of the door called name ("grpc" for Envoy's
// ext_authz Check, "http" for the HTTP door), creating its series.
func (m *Metrics) Door(name string) *DoorMetrics {
	d := &DoorMetrics{duration: m.CheckDuration.WithLabelValues(name)}
	for o := Outcome(0); o < outcomeCount; o++ {
		d.outcomes[o] = m.Checks.WithLabelValues(name, o.String())
	}
	return d
}

// Observe counts one answered request: its outcome and how long it took,
// in seconds.
func (d *DoorMetrics) Observe(o Outcome, seconds float64) {
	d.outcomes[o].Inc()
	d.duration.Observe(seconds)
}

// decisionMetrics are one policy's decision counts in Prometheus,
// resolved once per configuration so the hot path does no label lookups.
type decisionMetrics struct {
	allowed, denied, shadowDenied, refunded prometheus.Counter
	degraded                                [4]prometheus.Counter // by quota.Degraded
}

func (m *Metrics) forPolicy(name, mode string) decisionMetrics {
	c := decisionMetrics{
		allowed:      m.Decisions.WithLabelValues(name, mode, "allowed"),
		denied:       m.Decisions.WithLabelValues(name, mode, "denied"),
		shadowDenied: m.Decisions.WithLabelValues(name, mode, "shadow_denied"),
		refunded:     m.Decisions.WithLabelValues(name, mode, "refunded"),
	}
	for _, d := range []quota.Degraded{quota.DegradedFallback, quota.DegradedAllow, quota.DegradedDeny} {
		c.degraded[d] = m.Degraded.WithLabelValues(name, d.String())
	}
	return c
}
