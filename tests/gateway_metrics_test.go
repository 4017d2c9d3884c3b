package tests

import (
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/extauthz/extauthz/tests/internal/testcerts"
)

// scrapeProm reads the metrics PROMETHEUS_ADDR serves.
func scrapeProm(t *testing.T, addr string) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	must(t, err)
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := parser.TextToMetricFamilies(resp.Body)
	must(t, err)
	return mfs
}

// The stat keys of listenerDomain's rules, split as the anchor's default
// mapping splits them: a route rule's chain is key1 and key2; the masked
// remote address chain's third part is dropped, and the dots of its
// 0.0.0.0 are underscores, as the anchor writes an IPv4 address in a stat
// name.
const (
	backendKey1  = "httproute/default/backend/rule/0/match/-1_httproute/default/backend/rule/0/match/-1"
	shadowedKey1 = "httproute/default/shadowed/rule/0/match/-1_httproute/default/shadowed/rule/0/match/-1"
	ruleKey2     = "rule-0-match--1_rule-0-match--1"
	byIPKey1     = "httproute/default/byip/rule/0/match/0_httproute/default/byip/rule/0/match/0"
	byIPKey2     = "masked_remote_address_0_0_0_0/0"
)

// anchorSeries is one expected value of the anchor's series.
type anchorSeries struct {
	name   string
	labels []string
	want   float64
}

// Run as Envoy Gateway runs the anchor, with USE_PROMETHEUS, the binary
// serves the anchor's stats on PROMETHEUS_ADDR under the names and labels
// its default mapping gives, which Envoy Gateway's rate limit dashboard
// reads: after known traffic, each rule's total_hits, within_limit,
// near_limit (NEAR_LIMIT_RATIO at its default, 0.8), over_limit and
// shadow_mode hold what the anchor's limiter would count; configuration
// loads count as config_load_success and config_load_error; extauthz's
// own series and the process's are served beside them.
func TestRatelimitAnchorMetrics(t *testing.T) {
	parallel(t)
	certs := testcerts.Write(t, "xds")
	x := newXDSServer(t, certs, "127.0.0.1:0")
	x.push("1", listenerDomain(), sharedDomain())
	p := startRatelimit(t, ratelimitBinary(t), nil, append(xdsEnv(certs, x.addr), "USE_PROMETHEUS=true", "PROMETHEUS_ADDR=127.0.0.1:0")...)
	const dom = "default/eg/http"
	// Known traffic: the route rule (3 an hour) asked 5 times, the
	// shadow-mode rule (1 an hour) 4 times, two remote addresses (2 an
	// hour each, one stat: the rule has no value) 4 times each.
	admittedOf(p, 5, dom, chainRequest("backend"))
	admittedOf(p, 4, dom, chainRequest("shadowed"))
	admittedOf(p, 4, dom, byIP("10.0.0.1"))
	admittedOf(p, 4, dom, byIP("10.0.0.2"))

	mfs := scrapeProm(t, p.Prometheus)
	rule := func(key1, key2 string) []string { return []string{"domain", dom, "key1", key1, "key2", key2} }
	for _, c := range []anchorSeries{
		// 3 an hour: the threshold is floor(3 × 0.8) = 2, so the third
		// hit is near; the fourth and fifth over.
		{"ratelimit_service_rate_limit_total_hits", rule(backendKey1, ruleKey2), 5},
		{"ratelimit_service_rate_limit_within_limit", rule(backendKey1, ruleKey2), 3},
		{"ratelimit_service_rate_limit_near_limit", rule(backendKey1, ruleKey2), 1},
		{"ratelimit_service_rate_limit_over_limit", rule(backendKey1, ruleKey2), 2},
		// 1 an hour in shadow mode: the threshold is 0, so the first hit
		// is near; three over, each also shadow_mode (all admitted).
		{"ratelimit_service_rate_limit_total_hits", rule(shadowedKey1, ruleKey2), 4},
		{"ratelimit_service_rate_limit_within_limit", rule(shadowedKey1, ruleKey2), 1},
		{"ratelimit_service_rate_limit_near_limit", rule(shadowedKey1, ruleKey2), 1},
		{"ratelimit_service_rate_limit_over_limit", rule(shadowedKey1, ruleKey2), 3},
		{"ratelimit_service_rate_limit_shadow_mode", rule(shadowedKey1, ruleKey2), 3},
		// 2 an hour per address, both under one stat: per address the
		// second hit is near (threshold 1), the third and fourth over.
		{"ratelimit_service_rate_limit_total_hits", rule(byIPKey1, byIPKey2), 8},
		{"ratelimit_service_rate_limit_within_limit", rule(byIPKey1, byIPKey2), 4},
		{"ratelimit_service_rate_limit_near_limit", rule(byIPKey1, byIPKey2), 2},
		{"ratelimit_service_rate_limit_over_limit", rule(byIPKey1, byIPKey2), 4},
		{"ratelimit_service_config_load_success", nil, 1},
	} {
		if got := sumMetric(mfs, c.name, c.labels...); got != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.labels, got, c.want)
		}
	}
	// A shape the anchor serves with labels domain and key1 only is
	// distinct from the nested one: the route rule's series has key2.
	if mf := mfs["ratelimit_service_rate_limit_total_hits"]; mf == nil || len(mf.GetMetric()) != 3 {
		t.Errorf("ratelimit_service_rate_limit_total_hits: %v, want the 3 rules' series", mf)
	}
	if _, ok := mfs["ratelimit_service_config_load_error"]; ok {
		t.Error("config_load_error served before any load failed (the anchor sends a counter once it moved)")
	}
	for _, own := range []string{"extauthz_decisions_total", "process_resident_memory_bytes"} {
		if _, ok := mfs[own]; !ok {
			t.Errorf("%s is not served beside the anchor's series", own)
		}
	}

	// Each refused update is a config_load_error (the server sends the
	// refused version again after each NACK, and each is refused); the
	// next good one a success.
	x.push("2", listenerDomain(routeChain("backend", 0, hourLimit(9), false)), sharedDomain())
	if !within(5*time.Second, func() bool { return len(x.nacked()) > 0 }) {
		t.Fatal("no NACK for an update with a duplicate descriptor")
	}
	x.push("3", listenerDomain(), sharedDomain())
	if !within(5*time.Second, func() bool { return x.acked("3") }) {
		t.Fatal("version 3 not acknowledged within 5s")
	}
	mfs = scrapeProm(t, p.Prometheus)
	nacks := float64(len(x.nacked()))
	if e, s := sumMetric(mfs, "ratelimit_service_config_load_error"), sumMetric(mfs, "ratelimit_service_config_load_success"); e != nacks || s != 2 {
		t.Errorf("after a refused and a good update: config_load_error %v, config_load_success %v; want %v (the NACKs) and 2", e, s, nacks)
	}
}

// Envoy Gateway names a mapping file (PROMETHEUS_MAPPER_YAML, its
// statsd-exporter ConfigMap, written for the anchor's exporter with its
// deprecated timer_type): the series take the names it gives. And
// NEAR_LIMIT_RATIO is honoured: at 0.5 (set to a value other than the
// default to see it applied) a rule of 4 an hour is near from its third
// hit.
func TestRatelimitAnchorMetricsMappingFile(t *testing.T) {
	parallel(t)
	certs := testcerts.Write(t, "xds")
	x := newXDSServer(t, certs, "127.0.0.1:0")
	x.push("1", listenerDomain(routeChain("four", 0, hourLimit(4), false)))
	conf := filepath.Join(t.TempDir(), "conf.yaml")
	must(t, os.WriteFile(conf, []byte(`mappings:
  - match: "ratelimit\\.service\\.rate_limit\\.([^\\.]*)\\.([^\\.]*)\\.([^\\.]*)(\\..*)?\\.near_limit"
    match_type: regex
    name: "eg_near"
    timer_type: "histogram"
    labels: {domain: "$1", route: "$2", rule: "$3"}
  - match: "ratelimit\\.service\\.rate_limit\\.([^\\.]*)\\.([^\\.]*)\\.([^\\.]*)(\\..*)?\\.total_hits"
    match_type: regex
    name: "eg_hits"
    timer_type: "histogram"
    labels: {domain: "$1", route: "$2", rule: "$3"}
`), 0o600))
	p := startRatelimit(t, ratelimitBinary(t), nil, append(xdsEnv(certs, x.addr), "USE_PROMETHEUS=true", "PROMETHEUS_ADDR=127.0.0.1:0",
		"PROMETHEUS_MAPPER_YAML="+conf, "NEAR_LIMIT_RATIO=0.5")...)
	const dom = "default/eg/http"
	four := "httproute/default/four/rule/0/match/-1_httproute/default/four/rule/0/match/-1"
	admittedOf(p, 4, dom, chainRequest("four"))
	mfs := scrapeProm(t, p.Prometheus)
	labels := []string{"domain", dom, "route", four, "rule", ruleKey2}
	// Threshold floor(4 × 0.5) = 2: the third and fourth hits are near.
	if hits, near := sumMetric(mfs, "eg_hits", labels...), sumMetric(mfs, "eg_near", labels...); hits != 4 || near != 2 {
		t.Errorf("eg_hits %v, eg_near %v; want 4 and 2", hits, near)
	}
	if _, ok := mfs["ratelimit_service_rate_limit_total_hits"]; ok {
		t.Error("the default name is served though the mapping file names the series")
	}
	// A name the file does not map is served escaped, as the anchor's
	// exporter serves it.
	if got := sumMetric(mfs, "ratelimit_service_config_load_success"); got != 1 {
		t.Errorf("ratelimit_service_config_load_success (unmapped, escaped) = %v, want 1", got)
	}

	// A mapping that does not load stops the start-up, naming the variable.
	bad := filepath.Join(t.TempDir(), "bad.yaml")
	must(t, os.WriteFile(bad, []byte("mappings: [{match: a.b, nmae: x}]\n"), 0o600))
	code, _, stderr := runRatelimit(t, ratelimitBinary(t), append(xdsEnv(certs, x.addr), "USE_PROMETHEUS=true", "PROMETHEUS_ADDR=127.0.0.1:0", "PROMETHEUS_MAPPER_YAML="+bad))
	if want := "PROMETHEUS_MAPPER_YAML: anchorstats: the statsd mapping " + bad; code != 1 || !strings.Contains(stderr, want) {
		t.Fatalf("exit %d, stderr:\n%s\nwant exit 1 and %q", code, stderr, want)
	}
}
