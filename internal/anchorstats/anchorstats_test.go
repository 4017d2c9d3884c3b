package anchorstats

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// The anchor's limiter splits a request's hits so: within the limit,
// within_limit, and near_limit past floor(limit × ratio); over it,
// over_limit, with the hits between the threshold and the limit
// near_limit; shadow_mode as over_limit for a shadow-mode descriptor.
func TestClassify(t *testing.T) {
	for _, c := range []struct {
		name string
		d    Decision
		want counts
	}{
		{"well under", Decision{Limit: 10, Before: 3, Hits: 1}, counts{within: 1}},
		{"at the threshold", Decision{Limit: 10, Before: 7, Hits: 1}, counts{within: 1}},
		{"past the threshold", Decision{Limit: 10, Before: 8, Hits: 1}, counts{within: 1, near: 1}},
		{"crossing the threshold", Decision{Limit: 10, Before: 6, Hits: 4}, counts{within: 4, near: 2}},
		{"the last within", Decision{Limit: 10, Before: 9, Hits: 1}, counts{within: 1, near: 1}},
		{"over", Decision{Limit: 10, Before: 10, Hits: 1}, counts{over: 1}},
		{"crossing the limit", Decision{Limit: 10, Before: 7, Hits: 5}, counts{over: 2, near: 2}},
		{"crossing both from below the threshold", Decision{Limit: 10, Before: 2, Hits: 10}, counts{over: 2, near: 2}},
		{"shadow over", Decision{Limit: 10, Before: 10, Hits: 3, Shadow: true}, counts{over: 3, shadow: 3}},
		{"shadow crossing", Decision{Limit: 10, Before: 9, Hits: 3, Shadow: true}, counts{over: 2, shadow: 2, near: 1}},
		{"no hits", Decision{Limit: 10, Before: 10, Hits: 0}, counts{}},
	} {
		if got := classify(c.d, DefaultNearLimitRatio); got != c.want {
			t.Errorf("%s: %+v gives %+v, want %+v", c.name, c.d, got, c.want)
		}
	}
	// A limit of 1: the threshold is 0, so the one hit within is near.
	if got := classify(Decision{Limit: 1, Before: 0, Hits: 1}, DefaultNearLimitRatio); got != (counts{within: 1, near: 1}) {
		t.Errorf("limit 1, first hit: %+v, want within 1 near 1", got)
	}
	// The threshold in single precision, floored: 3 × 0.8 is 2.4, so 2.
	if got := classify(Decision{Limit: 3, Before: 2, Hits: 1}, DefaultNearLimitRatio); got != (counts{within: 1, near: 1}) {
		t.Errorf("limit 3, third hit: %+v, want within 1 near 1", got)
	}
}

// Without a mapping file the anchor's default names: a key of one part
// has domain and key1, a nested key domain, key1 and key2; loads count
// by their own names; an undecided descriptor counts total_hits only.
func TestBuiltinNames(t *testing.T) {
	s, err := New("", DefaultNearLimitRatio)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 4; i++ {
		s.Count("default/eg/http.route_a.rule-0_rule-0", Decision{Limit: 3, Before: uint64(i), Hits: 1, Decided: true})
	}
	s.Count("shop.user", Decision{Limit: 1, Hits: 1, Decided: true})
	s.Count("shop.user", Decision{Hits: 1})
	s.Count("shop.remote_address_10.0.0.1", Decision{Limit: 5, Hits: 1, Decided: true})
	s.ConfigLoad(true)
	s.ConfigLoad(false)
	s.ConfigLoad(true)
	want := `
# HELP ratelimit_service_config_load_error envoyproxy/ratelimit's stat, named by the statsd mapping (PROMETHEUS_MAPPER_YAML).
# TYPE ratelimit_service_config_load_error counter
ratelimit_service_config_load_error 1
# HELP ratelimit_service_config_load_success envoyproxy/ratelimit's stat, named by the statsd mapping (PROMETHEUS_MAPPER_YAML).
# TYPE ratelimit_service_config_load_success counter
ratelimit_service_config_load_success 2
# HELP ratelimit_service_rate_limit_near_limit envoyproxy/ratelimit's stat, named by the statsd mapping (PROMETHEUS_MAPPER_YAML).
# TYPE ratelimit_service_rate_limit_near_limit counter
ratelimit_service_rate_limit_near_limit{domain="default/eg/http",key1="route_a",key2="rule-0_rule-0"} 1
ratelimit_service_rate_limit_near_limit{domain="shop",key1="user"} 1
# HELP ratelimit_service_rate_limit_over_limit envoyproxy/ratelimit's stat, named by the statsd mapping (PROMETHEUS_MAPPER_YAML).
# TYPE ratelimit_service_rate_limit_over_limit counter
ratelimit_service_rate_limit_over_limit{domain="default/eg/http",key1="route_a",key2="rule-0_rule-0"} 1
# HELP ratelimit_service_rate_limit_total_hits envoyproxy/ratelimit's stat, named by the statsd mapping (PROMETHEUS_MAPPER_YAML).
# TYPE ratelimit_service_rate_limit_total_hits counter
ratelimit_service_rate_limit_total_hits{domain="default/eg/http",key1="route_a",key2="rule-0_rule-0"} 4
ratelimit_service_rate_limit_total_hits{domain="shop",key1="remote_address_10_0_0_1"} 1
ratelimit_service_rate_limit_total_hits{domain="shop",key1="user"} 2
# HELP ratelimit_service_rate_limit_within_limit envoyproxy/ratelimit's stat, named by the statsd mapping (PROMETHEUS_MAPPER_YAML).
# TYPE ratelimit_service_rate_limit_within_limit counter
ratelimit_service_rate_limit_within_limit{domain="default/eg/http",key1="route_a",key2="rule-0_rule-0"} 3
ratelimit_service_rate_limit_within_limit{domain="shop",key1="remote_address_10_0_0_1"} 1
ratelimit_service_rate_limit_within_limit{domain="shop",key1="user"} 1
`
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(s)
	names := []string{"ratelimit_service_config_load_error", "ratelimit_service_config_load_success",
		"ratelimit_service_rate_limit_near_limit", "ratelimit_service_rate_limit_over_limit",
		"ratelimit_service_rate_limit_total_hits", "ratelimit_service_rate_limit_within_limit", "ratelimit_service_rate_limit_shadow_mode"}
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), names...); err != nil {
		t.Fatal(err)
	}
}

// A mapping file written for the anchor's exporter (deprecated fields
// included, as Envoy Gateway's carries timer_type) names the series; a
// name it maps nowhere is served escaped; a file that does not load is
// an error naming it; the ratio must be a share.
func TestMappingFile(t *testing.T) {
	file := filepath.Join(t.TempDir(), "conf.yaml")
	if err := os.WriteFile(file, []byte(`mappings:
  - match: "ratelimit.service.rate_limit.*.*.total_hits"
    name: "rl_hits"
    timer_type: "histogram"
    labels: {tenant: "$1", rule: "$2"}
`), 0o600); err != nil {
		t.Fatal(err)
	}
	s, err := New(file, 0.5)
	if err != nil {
		t.Fatal(err)
	}
	s.Count("acme.login", Decision{Limit: 4, Before: 2, Hits: 1, Decided: true})
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(s)
	want := `
# HELP rl_hits envoyproxy/ratelimit's stat, named by the statsd mapping (PROMETHEUS_MAPPER_YAML).
# TYPE rl_hits counter
rl_hits{rule="login",tenant="acme"} 1
# HELP ratelimit_service_rate_limit_acme_login_near_limit envoyproxy/ratelimit's stat, named by the statsd mapping (PROMETHEUS_MAPPER_YAML).
# TYPE ratelimit_service_rate_limit_acme_login_near_limit counter
ratelimit_service_rate_limit_acme_login_near_limit 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "rl_hits", "ratelimit_service_rate_limit_acme_login_near_limit"); err != nil {
		t.Fatal(err)
	}

	bad := filepath.Join(t.TempDir(), "bad.yaml")
	if err := os.WriteFile(bad, []byte("mappings:\n  - match: a.b\n    nmae: x\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := New(bad, 0.8); err == nil || !strings.Contains(err.Error(), bad) {
		t.Fatalf("a mapping with an unknown field: %v, want an error naming %s", err, bad)
	}
	if _, err := New("", 1.5); err == nil {
		t.Fatal("a near-limit ratio of 1.5 was accepted")
	}
}

// The names kept are bounded; what would have been added under a name
// past the bound is counted as dropped (here total_hits 2, over_limit 1
// and near_limit 1: the threshold of a limit of 1 is 0).
func TestNamesBounded(t *testing.T) {
	s, err := New("", DefaultNearLimitRatio)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; len(s.names) < MaxNames; i++ {
		s.add("n."+string(rune('a'+i%26))+strings.Repeat("x", i/26), 0)
	}
	s.Count("shop.late", Decision{Limit: 1, Hits: 2, Decided: true})
	if len(s.names) != MaxNames || s.dropped.Load() != 4 {
		t.Fatalf("names %d, dropped %d; want %d and 4", len(s.names), s.dropped.Load(), MaxNames)
	}
}
