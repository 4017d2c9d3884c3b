package rls

import "github.com/prometheus/client_golang/prometheus"

// Metrics are this door's own collectors; its requests and decisions are
// counted with every door's, in engine.Metrics (door "rls").
type Metrics struct {
	// UnknownDomains counts requests for a domain no file defines, which
	// are answered OK without limits (as envoyproxy/ratelimit answers):
	// a domain misspelled in Envoy's filter shows here.
	UnknownDomains prometheus.Counter
}

// NewMetrics creates the collectors and registers them with reg (none
// when reg is nil).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{UnknownDomains: prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: "extauthz", Name: "rls_unknown_domain_requests_total",
		Help: "Rate limit service requests for a domain no descriptor file defines (answered OK, without limits).",
	})}
	if reg != nil {
		reg.MustRegister(m.UnknownDomains)
	}
	return m
}
