package deploy

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql/parser"
)

const dashboardFile = chartDir + "/dashboards/extauthz.json"

// envoyMetrics are the Envoy counters the dashboard and the alerts read,
// by the names Envoy's /stats/prometheus gives them (docs/alerts.md says
// where each comes from). No Envoy runs here, so this list is the contract
// instead of a scrape; envoy_test.go checks the bootstraps keep the names
// stable (no ext_authz stat_prefix, the extauthz cluster's name).
var envoyMetrics = map[string][]string{
	"envoy_http_ext_authz_ok":                             {"envoy_http_conn_manager_prefix"},
	"envoy_http_ext_authz_denied":                         {"envoy_http_conn_manager_prefix"},
	"envoy_http_ext_authz_error":                          {"envoy_http_conn_manager_prefix"},
	"envoy_http_ext_authz_failure_mode_allowed":           {"envoy_http_conn_manager_prefix"},
	"envoy_cluster_upstream_rq_pending_overflow":          {"envoy_cluster_name"},
	"envoy_cluster_circuit_breakers_default_remaining_rq": {"envoy_cluster_name"},
}

// targetLabels are added by Prometheus to every scraped series (the
// PodMonitor's pod and namespace, the job the chart sets, the address).
var targetLabels = map[string]bool{"namespace": true, "pod": true, "job": true, "instance": true, "container": true, "endpoint": true}

// grafanaVars replaces Grafana's variables with values PromQL accepts, so
// each query can be parsed as Prometheus will receive it.
var grafanaVars = regexp.MustCompile(`\$\{?(__rate_interval|__interval|__range)\}?|\$\{?[A-Za-z_][A-Za-z0-9_]*\}?`)

func substituteVars(expr string) string {
	return grafanaVars.ReplaceAllStringFunc(expr, func(v string) string {
		if strings.Contains(v, "__") {
			return "5m"
		}
		return ".*"
	})
}

// labelValuesQuery is a Grafana variable query: label_values(selector, label).
var labelValuesQuery = regexp.MustCompile(`^label_values\((.*),\s*([A-Za-z_][A-Za-z0-9_]*)\)$`)

// metricUse is what a query asks of one metric: its name and the labels it
// matches or groups by.
type metricUse struct {
	where  string
	labels map[string]bool
}

// dashboardQueries returns every PromQL query in the dashboard (panel
// targets and variable queries), by where it is.
func dashboardQueries(t *testing.T, data []byte) map[string]string {
	t.Helper()
	var d struct {
		Panels     []json.RawMessage `json:"panels"`
		Templating struct {
			List []struct {
				Name  string          `json:"name"`
				Type  string          `json:"type"`
				Query json.RawMessage `json:"query"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(data, &d); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	out := map[string]string{}
	var walk func(raw []json.RawMessage)
	walk = func(raw []json.RawMessage) {
		for _, r := range raw {
			var p struct {
				Title      string            `json:"title"`
				Type       string            `json:"type"`
				Datasource map[string]string `json:"datasource"`
				Panels     []json.RawMessage `json:"panels"`
				Targets    []struct {
					RefID string `json:"refId"`
					Expr  string `json:"expr"`
				} `json:"targets"`
			}
			if err := json.Unmarshal(r, &p); err != nil {
				t.Fatalf("%s: panel: %v", dashboardFile, err)
			}
			walk(p.Panels)
			if p.Type == "row" {
				continue
			}
			if p.Datasource["uid"] != "${datasource}" {
				t.Errorf("%s: panel %q: datasource %v, want the ${datasource} variable", dashboardFile, p.Title, p.Datasource)
			}
			if len(p.Targets) == 0 {
				t.Errorf("%s: panel %q has no query", dashboardFile, p.Title)
			}
			for _, tg := range p.Targets {
				out[fmt.Sprintf("panel %q %s", p.Title, tg.RefID)] = tg.Expr
			}
		}
	}
	walk(d.Panels)
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		var q struct {
			Query string `json:"query"`
		}
		if err := json.Unmarshal(v.Query, &q); err != nil {
			t.Fatalf("%s: variable %s: %v", dashboardFile, v.Name, err)
		}
		m := labelValuesQuery.FindStringSubmatch(q.Query)
		if m == nil {
			t.Errorf("%s: variable %s: %q is not label_values(selector, label)", dashboardFile, v.Name, q.Query)
			continue
		}
		out["variable "+v.Name] = m[1]
	}
	return out
}

// metricsUsed parses each query and returns the metrics they select, with
// the labels each is matched or grouped by.
func metricsUsed(t *testing.T, queries map[string]string) map[string][]metricUse {
	t.Helper()
	used := map[string][]metricUse{}
	for where, q := range queries {
		expr, err := promQL.ParseExpr(substituteVars(q))
		if err != nil {
			t.Errorf("%s: %q does not parse: %v", where, q, err)
			continue
		}
		// Labels grouped by (by (...)) apply to the metrics below them.
		var grouping []string
		parser.Inspect(expr, func(node parser.Node, _ []parser.Node) error {
			if a, ok := node.(*parser.AggregateExpr); ok && !a.Without {
				grouping = append(grouping, a.Grouping...)
			}
			return nil
		})
		parser.Inspect(expr, func(node parser.Node, _ []parser.Node) error {
			vs, ok := node.(*parser.VectorSelector)
			if !ok {
				return nil
			}
			name := vs.Name
			ls := map[string]bool{}
			for _, m := range vs.LabelMatchers {
				if m.Name == labels.MetricName {
					if m.Type == labels.MatchEqual {
						name = m.Value
					}
					continue
				}
				ls[m.Name] = true
			}
			for _, g := range grouping {
				ls[g] = true
			}
			if name == "" {
				t.Errorf("%s: a selector without a metric name: %s", where, vs)
				return nil
			}
			used[name] = append(used[name], metricUse{where: where, labels: ls})
			return nil
		})
	}
	return used
}

// TestDashboardQueries checks every query of the Grafana dashboard parses
// as PromQL and names only metrics the real binary exports (scraped from
// its /metrics after it has made decisions, in Redis mode with Redis
// unreachable so the Redis and fallback series exist) or the Envoy
// counters listed above, with labels those metrics have. The alerts'
// expressions are held to the same rule.
func TestDashboardQueries(t *testing.T) {
	data := readFile(t, repoPath(t, dashboardFile))
	queries := dashboardQueries(t, data)
	_, pr := renderedRules(t, readFile(t, repoPath(t, chartDir+"/ci/sidecar-values.yaml")))
	for _, g := range pr.Spec.Groups {
		for _, r := range g.Rules {
			queries["alert "+r.Alert] = r.Expr.String()
		}
	}
	exported := scrapeExtauthz(t)
	used := metricsUsed(t, queries)
	if len(used) < 10 {
		t.Fatalf("only %d metrics found in the dashboard and alerts: the parsing is broken", len(used))
	}
	names := make([]string, 0, len(used))
	for n := range used {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, name := range names {
		var have map[string]bool
		switch {
		case name == "up":
			continue // Prometheus's own, per target
		case envoyMetrics[name] != nil:
			have = map[string]bool{}
			for _, l := range envoyMetrics[name] {
				have[l] = true
			}
		default:
			var ok bool
			have, ok = exported[name]
			if !ok {
				t.Errorf("%s (in %s) is not a metric extauthz exports", name, used[name][0].where)
				continue
			}
		}
		for _, u := range used[name] {
			for l := range u.labels {
				if !have[l] && !targetLabels[l] && !(l == "le" && strings.HasSuffix(name, "_bucket")) {
					t.Errorf("%s: %s has no label %q (it has %v)", u.where, name, l, keys(have))
				}
			}
		}
	}
}

func keys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// scrapeExtauthz runs the binary (built as the Dockerfile builds it) in
// hybrid mode against a Redis address nothing listens on, sends it Checks
// with `extauthz check` so every series exists (decisions, fallback,
// Redis calls), and returns each exported name with its labels. Histograms
// are returned under their _bucket, _sum and _count names.
func scrapeExtauthz(t *testing.T) map[string]map[string]bool {
	t.Helper()
	bin := extauthzBinary(t)
	grpcAddr, adminAddr, redisAddr := freePort(t), freePort(t), freePort(t)
	cfg := filepath.Join(t.TempDir(), "extauthz.yaml")
	text := fmt.Sprintf(`listen: {grpc: %q, admin: %q}
redis: {addrs: [%q]}
default_mode: hybrid
local: {max_keys: 2}
clients:
  keys:
    - {id: demo, sha256: 38766b8a3313eafa0fb9b9a4eab7c596728c4498eff928b167a2980705ae2ed2}
policies:
  - {name: per-client, key: [client], limit: 100, window: 1m}
  - {name: per-ip, key: [ip], limit: 100, window: 1m, mode: local}
`, grpcAddr, adminAddr, redisAddr)
	if err := os.WriteFile(cfg, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	srv := exec.Command(bin, "serve", "-config", cfg)
	srv.Stdout, srv.Stderr = &logs, &logs
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		srv.Process.Signal(syscall.SIGTERM)
		done := make(chan error, 1)
		go func() { done <- srv.Wait() }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			srv.Process.Kill()
			<-done
		}
		if t.Failed() {
			t.Logf("extauthz output:\n%s", logs.String())
		}
	}()
	waitReady(t, "http://"+adminAddr+"/readyz")
	// Three client addresses through a table of two: an eviction.
	for _, src := range []string{"192.0.2.1", "192.0.2.2", "192.0.2.3"} {
		out, err := exec.Command(bin, "check", "-addr", grpcAddr, "-source", src, "-H", "x-api-key: key-demo-123", "GET", "/").CombinedOutput()
		if err != nil && !strings.HasPrefix(string(out), "ALLOWED") && !strings.HasPrefix(string(out), "DENIED") {
			t.Fatalf("extauthz check: %v\n%s", err, out)
		}
	}
	resp, err := http.Get("http://" + adminAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	p := expfmt.NewTextParser(model.UTF8Validation)
	families, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]map[string]bool{}
	for name, mf := range families {
		ls := map[string]bool{}
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				ls[lp.GetName()] = true
			}
		}
		out[name] = ls
		if mf.GetType() == dto.MetricType_HISTOGRAM {
			for _, suffix := range []string{"_bucket", "_sum", "_count"} {
				out[name+suffix] = ls
			}
		}
	}
	for _, want := range []string{"extauthz_degraded_decisions_total", "extauthz_redis_calls_total", "extauthz_cache_evictions_total"} {
		if _, ok := out[want]; !ok {
			t.Fatalf("the scrape lacks %s, which the test drives the binary to export", want)
		}
	}
	return out
}

// TestDashboardShipped checks the chart's dashboard ConfigMap carries the
// dashboard file as it is.
func TestDashboardShipped(t *testing.T) {
	out, err := renderChart(t, readFile(t, repoPath(t, chartDir+"/ci/shared-istio-values.yaml")))
	if err != nil {
		t.Fatal(err)
	}
	objs, errs := decodeFiles(renderedFiles(out))
	for _, err := range errs {
		t.Fatal(err)
	}
	want := readFile(t, repoPath(t, dashboardFile))
	found := false
	for _, o := range objs {
		if o.kind == "ConfigMap" && strings.HasSuffix(o.meta.Name, "-dashboard") {
			found = true
			if got := o.raw["data"].(map[string]any)["extauthz.json"]; strings.TrimSpace(got.(string)) != strings.TrimSpace(string(want)) {
				t.Errorf("%s: the dashboard differs from %s", o, dashboardFile)
			}
		}
	}
	if !found {
		t.Error("grafanaDashboard.enabled rendered no dashboard ConfigMap")
	}
}
