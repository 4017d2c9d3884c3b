// Package anchorstats counts the rate limit service's decisions as
// envoyproxy/ratelimit (the anchor) counts them in its stats, and serves
// them for Prometheus under the names its statsd-to-Prometheus mapping
// gives (PROMETHEUS_MAPPER_YAML), so that the dashboards and alerts
// written for the anchor, Envoy Gateway's among them, read the same
// series from extauthz.
//
// The anchor names a stat by a dotted statsd name: for each rate limit,
// ratelimit.service.rate_limit.<domain>.<descriptor key>.<what>, where the
// key is the descriptor path (key_value, dot-joined) and what is
// total_hits, within_limit, near_limit, over_limit or shadow_mode; for
// the service, ratelimit.service.config_load_success and
// config_load_error. Its Prometheus sink feeds those names through
// prometheus/statsd_exporter's mapper; this package uses the same
// mapper library on the same names, so a mapping file means here what it
// means there. Without a file, a built-in mapping gives the names the
// anchor's own default gives (ratelimit_service_rate_limit_<what> with
// domain, key1 and, for nested keys, key2 labels).
//
// Counting follows the anchor's limiter: total_hits counts every hit of
// a limited descriptor; a hit that leaves the count at or under the limit
// is within_limit, and also near_limit when it passes the near-limit
// threshold (floor(limit × NEAR_LIMIT_RATIO)); a hit over the limit is
// over_limit (and the hits of it between the threshold and the limit
// near_limit), and shadow_mode too when the descriptor is in shadow mode.
package anchorstats

import (
	"fmt"
	"math"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/statsd_exporter/pkg/mapper"
)

// Stat name parts, as the anchor writes them.
const (
	rateLimitScope = "ratelimit.service.rate_limit."
	serviceScope   = "ratelimit.service."
)

// What the anchor counts for each rate limit.
const (
	TotalHits   = "total_hits"
	WithinLimit = "within_limit"
	NearLimit   = "near_limit"
	OverLimit   = "over_limit"
	ShadowMode  = "shadow_mode"
)

// DefaultNearLimitRatio is the anchor's NEAR_LIMIT_RATIO default.
const DefaultNearLimitRatio = 0.8

// MaxNames bounds the stat names kept: a name made from request values
// (detailed_metric, a limit Envoy sends) is a series kept for the life of
// the process, as the anchor keeps it. Past the bound, new names are not
// counted, and extauthz_anchor_stats_names_dropped_total sums what they
// would have added.
const MaxNames = 10000

// Stats holds the anchor's counters. Safe for concurrent use.
type Stats struct {
	mapper    *mapper.MetricMapper
	nearRatio float32

	mu    sync.RWMutex
	names map[string]*series // by statsd name
	order []*series          // in creation order, for a stable exposition

	dropped atomic.Uint64
}

// series is one statsd counter and the Prometheus series it maps to.
type series struct {
	value  atomic.Uint64
	name   string // the Prometheus name; "" when the mapping drops it
	labels []string
	values []string
}

// New loads the mapping (mapperFile, or the built-in one when "") and
// counts near-limit hits past nearLimitRatio of each limit. An unreadable
// or invalid mapping is an error (the anchor would start with no
// mapping and serve every name escaped).
func New(mapperFile string, nearLimitRatio float64) (*Stats, error) {
	if nearLimitRatio < 0 || nearLimitRatio > 1 || math.IsNaN(nearLimitRatio) {
		return nil, fmt.Errorf("anchorstats: near-limit ratio %v is not between 0 and 1", nearLimitRatio)
	}
	m := &mapper.MetricMapper{}
	var err error
	if mapperFile != "" {
		err = m.InitFromFile(mapperFile)
	} else {
		err = m.InitFromYAMLString(builtinMapping())
	}
	if err != nil {
		return nil, fmt.Errorf("anchorstats: the statsd mapping %s: %w", orBuiltin(mapperFile), err)
	}
	return &Stats{mapper: m, nearRatio: float32(nearLimitRatio), names: map[string]*series{}}, nil
}

func orBuiltin(file string) string {
	if file == "" {
		return "(built in)"
	}
	return file
}

// builtinMapping is the mapping used without a file: for each rate limit
// counter, a glob for a key of one part (labels domain and key1) and a
// regular expression for a nested key (domain, key1 and key2, the rest
// of the path dropped); the service's configuration loads by their own
// names.
func builtinMapping() string {
	var b strings.Builder
	b.WriteString("mappings:\n")
	counters := []string{NearLimit, OverLimit, TotalHits, WithinLimit, ShadowMode}
	for _, what := range counters {
		fmt.Fprintf(&b, "- match: %q\n  name: %q\n  labels: {domain: \"$1\", key1: \"$2\"}\n",
			rateLimitScope+"*.*."+what, promName(what))
	}
	part := `([^\.]*)`
	for _, what := range counters {
		re := regexp.QuoteMeta(rateLimitScope) + part + `\.` + part + `\.` + part + `(\..*)?\.` + what
		fmt.Fprintf(&b, "- match: %q\n  match_type: regex\n  name: %q\n  labels: {domain: \"$1\", key1: \"$2\", key2: \"$3\"}\n",
			re, promName(what))
	}
	for _, what := range []string{"config_load_success", "config_load_error"} {
		fmt.Fprintf(&b, "- match: %q\n  name: %q\n  match_metric_type: counter\n", serviceScope+what, "ratelimit_service_"+what)
	}
	return b.String()
}

func promName(what string) string { return "ratelimit_service_rate_limit_" + what }

// statName is the anchor's name for a stat of a descriptor key, with the
// characters it replaces replaced: ':' and '|', and the dots of an IPv4
// address (a dotted name's dots are its structure).
func statName(key, what string) string {
	return rateLimitScope + sanitize(key) + "." + what
}

var (
	separators = strings.NewReplacer(":", "_", "|", "_")
	ipv4       = regexp.MustCompile(`\d{1,3}\.\d{1,3}\.\d{1,3}\.\d{1,3}`)
)

func sanitize(s string) string {
	s = separators.Replace(s)
	if !strings.ContainsRune(s, '.') {
		return s
	}
	return ipv4.ReplaceAllStringFunc(s, func(ip string) string { return strings.ReplaceAll(ip, ".", "_") })
}

// Decision is one descriptor's decision against one rate limit, in the
// anchor's terms: the limit per unit, the count before the request, the
// hits it asked for, whether it was decided (a descriptor after one that
// denied the request is not: extauthz takes a request's descriptors all
// or none, and stops at the denial) and whether the descriptor is in
// shadow mode.
type Decision struct {
	Limit, Before, Hits uint64
	Decided, Shadow     bool
}

// Count records d against the rate limit whose stat key is key
// (domain.key_value.key_value...).
func (s *Stats) Count(key string, d Decision) {
	s.add(statName(key, TotalHits), d.Hits)
	if !d.Decided {
		return
	}
	c := classify(d, s.nearRatio)
	s.add(statName(key, WithinLimit), c.within)
	s.add(statName(key, NearLimit), c.near)
	s.add(statName(key, OverLimit), c.over)
	s.add(statName(key, ShadowMode), c.shadow)
}

// ConfigLoad records a configuration load, as the anchor counts each
// configuration it is given (at start, at each change).
func (s *Stats) ConfigLoad(ok bool) {
	name := serviceScope + "config_load_success"
	if !ok {
		name = serviceScope + "config_load_error"
	}
	s.add(name, 1)
}

// counts is one decision's hits by category.
type counts struct{ within, near, over, shadow uint64 }

// classify splits a decision's hits as the anchor's limiter does: the
// threshold is floor(limit × ratio) in single precision, as the anchor
// computes it; the count after the request is the count before plus the
// hits, whether or not they were admitted.
func classify(d Decision, ratio float32) counts {
	var c counts
	limit, before := d.Limit, d.Before
	after := before + d.Hits
	near := uint64(math.Floor(float64(float32(limit) * ratio)))
	if after > limit {
		if before >= limit {
			c.over = d.Hits
		} else {
			c.over = after - limit
			c.near = limit - max(near, before)
		}
		if d.Shadow {
			if before >= limit {
				c.shadow = d.Hits
			} else {
				c.shadow = after - limit
			}
		}
		return c
	}
	c.within = d.Hits
	if after > near {
		if before >= near {
			c.near = d.Hits
		} else {
			c.near = after - near
		}
	}
	return c
}

// add adds n to the counter of a statsd name, creating it (and mapping
// its name) on first use, even when n is 0: the anchor creates its
// counters when it meets a limit, and its sink sends a counter only once
// it moved, which Collect follows.
func (s *Stats) add(name string, n uint64) {
	s.mu.RLock()
	c := s.names[name]
	s.mu.RUnlock()
	if c == nil {
		if c = s.create(name); c == nil {
			s.dropped.Add(n)
			return
		}
	}
	c.value.Add(n)
}

func (s *Stats) create(name string) *series {
	s.mu.Lock()
	defer s.mu.Unlock()
	if c := s.names[name]; c != nil {
		return c
	}
	if len(s.names) >= MaxNames {
		return nil
	}
	c := &series{name: mapper.EscapeMetricName(name)}
	if m, labels, ok := s.mapper.GetMapping(name, mapper.MetricTypeCounter); ok {
		c.name = ""
		if m.Action != mapper.ActionTypeDrop {
			c.name = mapper.EscapeMetricName(m.Name)
			for k := range labels {
				c.labels = append(c.labels, k)
			}
			slices.Sort(c.labels)
			for _, k := range c.labels {
				c.values = append(c.values, labels[k])
			}
		}
	}
	s.names[name] = c
	s.order = append(s.order, c)
	return c
}

// help is every mapped counter's help text (one per name, as a
// Prometheus family has one).
const help = "envoyproxy/ratelimit's stat, named by the statsd mapping (PROMETHEUS_MAPPER_YAML)."

var droppedDesc = prometheus.NewDesc("extauthz_anchor_stats_names_dropped_total",
	fmt.Sprintf("What was not added to envoyproxy/ratelimit's stats (the sum of the lost increments) because %d stat names were made already.", MaxNames), nil, nil)

// Describe sends nothing: the series are known only as they are made
// (an unchecked collector).
func (s *Stats) Describe(chan<- *prometheus.Desc) {}

// Collect sends every counter that moved, under its mapped name. Two
// stat names a mapping gives one name and the same labels (a nested key
// whose parts past key2 differ) are one series, their sum, as the
// anchor's exporter adds them into one counter.
func (s *Stats) Collect(ch chan<- prometheus.Metric) {
	s.mu.RLock()
	all := slices.Clone(s.order)
	s.mu.RUnlock()
	type sum struct {
		c *series
		v uint64
	}
	var sums []*sum
	index := map[string]*sum{}
	for _, c := range all {
		v := c.value.Load()
		if v == 0 || c.name == "" {
			continue
		}
		id := c.name + "\xff" + strings.Join(c.labels, "\xff") + "\xff" + strings.Join(c.values, "\xff")
		if x := index[id]; x != nil {
			x.v += v
			continue
		}
		x := &sum{c: c, v: v}
		index[id] = x
		sums = append(sums, x)
	}
	for _, x := range sums {
		m, err := prometheus.NewConstMetric(prometheus.NewDesc(x.c.name, help, x.c.labels, nil), prometheus.CounterValue, float64(x.v), x.c.values...)
		if err != nil {
			continue // a label value a request made that is not UTF-8
		}
		ch <- m
	}
	ch <- prometheus.MustNewConstMetric(droppedDesc, prometheus.CounterValue, float64(s.dropped.Load()))
}
