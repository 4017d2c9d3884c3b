package rls

import "github.com/prometheus/client_golang/prometheus"

// Metrics are this door's own collectors; its requests and decisions are
// counted with every door's, in engine.Metrics (door "rls").
type Metrics struct {
	// UnknownDomains counts requests for a domain no file defines, which
	// are answered OK without limits (as envoyproxy/ratelimit answers):
	// a domain misspelled in Envoy's filter shows here.
	UnknownDomains prometheus.Counter
	// Undecodable counts requests that did not decode (a string that is
	// not valid UTF-8, a malformed message), by the answer they got
	// (rls.on_undecodable): "over_limit" or "ok".
	Undecodable *prometheus.CounterVec
}

// NewMetrics creates the collectors and registers them with reg (none
// when reg is nil).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{UnknownDomains: prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: "extauthz", Name: "rls_unknown_domain_requests_total",
		Help: "Rate limit service requests for a domain no descriptor file defines (answered OK, without limits).",
	}), Undecodable: prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "extauthz", Name: "rls_undecodable_requests_total",
		Help: "Rate limit service requests that did not decode, by the answer rls.on_undecodable gave them (over_limit, ok).",
	}, []string{"answer"})}
	// Both series exist from the start, so a rate over them reads 0.
	m.Undecodable.WithLabelValues("over_limit")
	m.Undecodable.WithLabelValues("ok")
	if reg != nil {
		reg.MustRegister(m.UnknownDomains, m.Undecodable)
	}
	return m
}
