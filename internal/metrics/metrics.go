// Package metrics holds the process's Prometheus registry: build
// information, the Go runtime and process collectors, the per-key tables'
// gauges, and the /metrics handler. Each layer declares its own collectors
// beside the code that uses them (engine.NewMetrics, redisstore.NewMetrics)
// and registers them here, on a registry of the process's own so tests
// and reloads never collide with the global one.
package metrics

import (
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Namespace prefixes every metric name.
const Namespace = "extauthz"

// New returns a registry holding build information for version and the Go
// runtime and process collectors.
func New(version string) *prometheus.Registry {
	reg := prometheus.NewRegistry()
	buildInfo := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: Namespace, Name: "build_info",
		Help: "Always 1; the version label names the running build.",
	}, []string{"version"})
	buildInfo.WithLabelValues(version).Set(1)
	reg.MustRegister(buildInfo, collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg
}

// TableStats is what the per-key table gauges read.
type TableStats interface {
	Len() int
	Bound() int
	Evictions() uint64
}

// Tables exposes the size, bound and evictions of the per-key tables, by
// table: "counts" (local mode and fallback buckets) and "redis" (the
// levels Redis reported and hybrid slices).
func Tables(reg prometheus.Registerer, tables map[string]TableStats) {
	desc := func(name, help string) *prometheus.Desc {
		return prometheus.NewDesc(prometheus.BuildFQName(Namespace, "", name), help, []string{"table"}, nil)
	}
	reg.MustRegister(tableCollector{
		tables:    tables,
		entries:   desc("cache_entries", "Per-key entries held in each local table."),
		capacity:  desc("cache_capacity", "The most entries each local table will hold (local.max_keys)."),
		evictions: desc("cache_evictions_total", "Entries pushed out of each local table to make room."),
	})
}

type tableCollector struct {
	tables                       map[string]TableStats
	entries, capacity, evictions *prometheus.Desc
}

func (c tableCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.entries
	ch <- c.capacity
	ch <- c.evictions
}

func (c tableCollector) Collect(ch chan<- prometheus.Metric) {
	for name, t := range c.tables {
		ch <- prometheus.MustNewConstMetric(c.entries, prometheus.GaugeValue, float64(t.Len()), name)
		ch <- prometheus.MustNewConstMetric(c.capacity, prometheus.GaugeValue, float64(t.Bound()), name)
		ch <- prometheus.MustNewConstMetric(c.evictions, prometheus.CounterValue, float64(t.Evictions()), name)
	}
}

// Handler serves reg in the Prometheus text format.
func Handler(reg *prometheus.Registry) http.Handler {
	return promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg})
}
