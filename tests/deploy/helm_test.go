package deploy

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	"github.com/prometheus/prometheus/promql/parser"
	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	"helm.sh/helm/v3/pkg/lint"
	"helm.sh/helm/v3/pkg/lint/support"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"
)

// The chart is rendered the way `helm template` renders it, in process:
// helm's own loader, values coalescing and template engine, with the
// release and cluster below. No network and no cluster are involved.
const (
	chartDir         = "charts/extauthz"
	releaseName      = "extauthz"
	releaseNamespace = "extauthz"
	// chartKubeVersion is the cluster the chart is rendered and linted for:
	// native sidecars need 1.29 or later (Chart.yaml kubeVersion).
	chartKubeVersion = "v1.31.0"
)

// chartCase is one documented values combination: the chart's defaults, or
// a file under charts/extauthz/ci/.
type chartCase struct {
	name   string
	values []byte // nil: the defaults
	// fixtures are files applied beside the release (a Redis and its
	// Secret, a ConfigMap the values name), so references resolve.
	fixtures []string
}

// chartCases returns the defaults and every ci/*-values.yaml, each with the
// Redis of k8s/redis/ and, when tests/deploy/testdata/helm/<name>.yaml
// exists, the objects in it.
func chartCases(t *testing.T) []chartCase {
	t.Helper()
	cases := []chartCase{{name: "defaults", fixtures: []string{"k8s/redis"}}}
	files, err := filepath.Glob(repoPath(t, chartDir+"/ci/*-values.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no values files under %s/ci: %v", chartDir, err)
	}
	sort.Strings(files)
	for _, f := range files {
		name := strings.TrimSuffix(filepath.Base(f), "-values.yaml")
		c := chartCase{name: name, values: readFile(t, f), fixtures: []string{"k8s/redis"}}
		if fx := filepath.Join("testdata", "helm", name+".yaml"); fileExists(fx) {
			c.fixtures = append(c.fixtures, "tests/deploy/"+filepath.ToSlash(fx))
		}
		cases = append(cases, c)
	}
	return cases
}

func fileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

var (
	chartOnce   sync.Once
	loadedChart *chart.Chart
	chartErr    error
)

// loadChart loads charts/extauthz once, as helm does.
func loadChart(t testing.TB) *chart.Chart {
	t.Helper()
	chartOnce.Do(func() { loadedChart, chartErr = loader.Load(repoPath(t, chartDir)) })
	if chartErr != nil {
		t.Fatalf("loading %s: %v", chartDir, chartErr)
	}
	return loadedChart
}

// renderChart renders the chart with values (YAML; nil: the defaults) as
// `helm template extauthz charts/extauthz -n extauthz -f values` does, and
// returns each template's output by name.
func renderChart(t testing.TB, values []byte) (map[string]string, error) {
	t.Helper()
	ch := loadChart(t)
	vals, err := chartutil.ReadValues(values)
	if err != nil {
		return nil, err
	}
	kv, err := chartutil.ParseKubeVersion(chartKubeVersion)
	if err != nil {
		return nil, err
	}
	caps := chartutil.DefaultCapabilities.Copy()
	caps.KubeVersion = *kv
	if ch.Metadata.KubeVersion != "" && !chartutil.IsCompatibleRange(ch.Metadata.KubeVersion, kv.String()) {
		return nil, fmt.Errorf("chart needs Kubernetes %s, rendering for %s", ch.Metadata.KubeVersion, kv)
	}
	opts := chartutil.ReleaseOptions{Name: releaseName, Namespace: releaseNamespace, Revision: 1, IsInstall: true}
	rv, err := chartutil.ToRenderValues(ch, vals, opts, caps)
	if err != nil {
		return nil, err
	}
	return engine.Render(ch, rv)
}

// renderedFiles returns the manifests of a rendering by file name
// (charts/extauthz/templates/x.yaml), without NOTES.txt and empty outputs.
func renderedFiles(out map[string]string) map[string][]byte {
	files := map[string][]byte{}
	for name, text := range out {
		if strings.HasSuffix(name, "NOTES.txt") || strings.TrimSpace(text) == "" {
			continue
		}
		files["charts/"+name] = []byte(text)
	}
	return files
}

// chartSet renders c and builds its apply set: the release's objects and
// the fixtures, every document decoded strictly.
func chartSet(t *testing.T, p *problems, c chartCase) *set {
	t.Helper()
	out, err := renderChart(t, c.values)
	if err != nil {
		t.Fatalf("helm template (%s): %v", c.name, err)
	}
	files := renderedFiles(out)
	for _, fx := range c.fixtures {
		if strings.HasSuffix(fx, ".yaml") {
			files[fx] = readFile(t, repoPath(t, fx))
			continue
		}
		for _, f := range globYAML(t, fx) {
			files[rel(t, f)] = readFile(t, f)
		}
	}
	objs, errs := decodeFiles(files)
	for _, err := range errs {
		p.add("%s: %v", c.name, err)
	}
	s := &set{name: "chart " + c.name}
	seen := map[string]string{}
	for _, o := range objs {
		key := o.kind + "/" + o.meta.Name
		if prev, dup := seen[key]; dup {
			p.add("%s: %s %s is defined in %s and %s", s.name, o.kind, o.meta.Name, prev, o.file)
		}
		seen[key] = o.file
		s.objs = append(s.objs, o)
	}
	return s
}

// TestChartLint runs helm lint, strictly (a warning fails), on every
// documented values combination.
func TestChartLint(t *testing.T) {
	kv, err := chartutil.ParseKubeVersion(chartKubeVersion)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range chartCases(t) {
		t.Run(c.name, func(t *testing.T) {
			vals, err := chartutil.ReadValues(c.values)
			if err != nil {
				t.Fatal(err)
			}
			l := lint.AllWithKubeVersion(repoPath(t, chartDir), vals, releaseNamespace, kv)
			for _, m := range l.Messages {
				if m.Severity >= support.WarningSev {
					t.Errorf("helm lint: %s", m)
				}
			}
		})
	}
}

// TestChartLintCatchesMistakes shows the lint above fails on a broken
// chart (a copy of ours with a template that cannot render), so its
// passing means something. (helm lint reports a template's own `fail` as
// INFO: the chart's refusals are checked by TestChartCatchesMistakes.)
func TestChartLintCatchesMistakes(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "extauthz")
	if err := os.CopyFS(dir, os.DirFS(repoPath(t, chartDir))); err != nil {
		t.Fatal(err)
	}
	broken := "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {{ .Values.nothing.here }}\n"
	if err := os.WriteFile(filepath.Join(dir, "templates", "broken.yaml"), []byte(broken), 0o644); err != nil {
		t.Fatal(err)
	}
	kv, _ := chartutil.ParseKubeVersion(chartKubeVersion)
	l := lint.AllWithKubeVersion(dir, nil, releaseNamespace, kv)
	if l.HighestSeverity < support.ErrorSev {
		t.Fatalf("helm lint passed a chart that cannot render: %v", l.Messages)
	}
}

// TestChartRenders renders every documented values combination and puts
// what comes out through the checks the raw manifests pass
// (manifests_test.go, pods_test.go, envoy_test.go, istio_test.go): strict
// decoding into the Kubernetes, Istio and Prometheus Operator types, the
// references between objects, the pods, every extauthz config through
// `extauthz validate`, every Envoy bootstrap through go-control-plane; then
// what is the chart's own: min_peers, the autoscaler, the PodMonitor, the
// PrometheusRule's expressions.
func TestChartRenders(t *testing.T) {
	mesh := loadMeshConfig(t)
	for _, c := range chartCases(t) {
		t.Run(c.name, func(t *testing.T) {
			var p problems
			s := chartSet(t, &p, c)
			checkSet(&p, s, mesh)
			checkChart(&p, s, c)
			p.report(t)
		})
	}
}

// chartValues returns c's values coalesced with the chart's defaults.
func chartValues(t *testing.T, c chartCase) chartutil.Values {
	t.Helper()
	vals, err := chartutil.ReadValues(c.values)
	if err != nil {
		t.Fatal(err)
	}
	v, err := chartutil.CoalesceValues(loadChart(t), vals)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// checkChart checks what the chart derives: fallback.min_peers from the
// replicas, the autoscaler's target, the PodMonitor's ports, the rules.
func checkChart(p *problems, s *set, c chartCase) {
	var deps []*appsv1.Deployment
	for _, d := range s.deployments() {
		if d.meta.Name == releaseName {
			deps = append(deps, d.k8s.(*appsv1.Deployment))
		}
	}
	if len(deps) != 1 {
		p.add("%s: want one Deployment %s, got %d", s.name, releaseName, len(deps))
		return
	}
	dep := deps[0]
	var hpa *autoscalingv2.HorizontalPodAutoscaler
	for _, o := range s.objs {
		switch obj := o.k8s.(type) {
		case *autoscalingv2.HorizontalPodAutoscaler:
			hpa = obj
			if obj.Spec.ScaleTargetRef.Kind != "Deployment" || obj.Spec.ScaleTargetRef.Name != dep.Name {
				p.add("%s: HorizontalPodAutoscaler targets %s %s, not the Deployment", o, obj.Spec.ScaleTargetRef.Kind, obj.Spec.ScaleTargetRef.Name)
			}
			if dep.Spec.Replicas != nil {
				p.add("%s: the Deployment sets replicas while an autoscaler owns them: every upgrade would reset the count", o)
			}
		case *monitoringv1.PodMonitor:
			checkPodMonitor(p, s, o, obj)
		case *monitoringv1.PrometheusRule:
			checkRuleExprs(p, o, obj)
		}
	}
	// fallback.min_peers: the pods that share a limit, unless set.
	want := int64(1)
	switch {
	case hpa != nil && hpa.Spec.MinReplicas != nil:
		want = int64(*hpa.Spec.MinReplicas)
	case dep.Spec.Replicas != nil:
		want = int64(*dep.Spec.Replicas)
	}
	for _, pod := range s.pods {
		if pod.deployment != dep.Name || pod.extauthz == nil {
			continue
		}
		got := pod.extauthz.Fallback.MinPeers
		if got == nil {
			if !strings.Contains(c.name, "existing") {
				p.add("%s: the chart's extauthz config sets no fallback.min_peers", s.name)
			}
			continue
		}
		if *got != want && !strings.Contains(string(c.values), "minPeers:") {
			p.add("%s: fallback.min_peers is %d, want %d (the replicas sharing a limit)", s.name, *got, want)
		}
	}
}

// checkPodMonitor checks a PodMonitor selects the release's pods and
// scrapes ports they declare.
func checkPodMonitor(p *problems, s *set, o *object, pm *monitoringv1.PodMonitor) {
	matched := false
	for _, pod := range s.pods {
		if !selects(pm.Spec.Selector.MatchLabels, pod.labels) {
			continue
		}
		matched = true
		for _, ep := range pm.Spec.PodMetricsEndpoints {
			if ep.Port == nil {
				p.add("%s: an endpoint without a port name", o)
				continue
			}
			port := corev1.ContainerPort{}
			found := false
			for _, cs := range [][]corev1.Container{pod.spec.Containers, pod.spec.InitContainers} {
				for _, c := range cs {
					for _, cp := range c.Ports {
						if cp.Name == *ep.Port {
							port, found = cp, true
						}
					}
				}
			}
			if !found {
				p.add("%s: scrapes port %q, which no container of %s declares", o, *ep.Port, pod.deployment)
			}
			_ = port
		}
	}
	if !matched {
		p.add("%s: selector %v matches no pods", o, pm.Spec.Selector.MatchLabels)
	}
}

// promQL parses as Prometheus does by default: no experimental syntax.
var promQL = parser.NewParser(parser.Options{})

// checkRuleExprs checks every rule's expression parses as PromQL.
func checkRuleExprs(p *problems, o *object, pr *monitoringv1.PrometheusRule) {
	for _, g := range pr.Spec.Groups {
		for _, r := range g.Rules {
			if _, err := promQL.ParseExpr(r.Expr.String()); err != nil {
				p.add("%s: rule %s: %v", o, r.Alert, err)
			}
		}
	}
}

// TestChartCatchesMistakes renders values a user could get wrong and
// checks the chart refuses them, or the checks catch what comes out.
func TestChartCatchesMistakes(t *testing.T) {
	for _, tc := range []struct {
		name, values string
		want         string // in the render error, or in a problem
	}{
		{"unknown layout", "layout: sidecars\n", `at '/layout': value must be one of 'shared', 'sidecar'`},
		{"shared, no Istio", "istio: {enabled: false}\n", "the shared layout needs Istio"},
		{"shared, any mesh identity", "istio: {callerPrincipals: [\"*\"]}\n", "admits any mesh identity"},
		{"autoscaling below two", "autoscaling: {enabled: true, minReplicas: 1}\n", "autoscaling.minReplicas: at least 2"},
		{"Envoy heap above its limit", "layout: sidecar\nenvoy: {maxHeapBytes: 536870912}\n", "is not below the container's memory limit"},
		{"Envoy timeout too long", "layout: sidecar\nenvoy: {timeout: 2s}\n", "grpc_service.timeout is 2s"},
		{"circuit breaker too small", "layout: sidecar\nenvoy: {maxChecksInFlight: 100}\n", "max_requests 100 is below"},
		{"invalid extauthz settings", "config: {settings: {policies: [{name: p, limit: 1, window: 1x}]}}\n", "extauthz validate"},
		{"no CPU limit", "resources: {limits: {cpu: null}}\n", "env GOMAXPROCS reads limits.cpu, but the container sets no such limit"},
		{"Check port open in the sidecar layout", "layout: sidecar\nextraEnv: [{name: EXTAUTHZ_LISTEN_GRPC, value: \"0.0.0.0:9001\"}]\n", "must listen on loopback"},
		{"latest image", "image: {tag: latest}\n", "pin a version"},
		{"misspelt value", "replica: 3\n", "additional properties 'replica' not allowed"},
		{"unknown log level", "logLevel: verbose\n", "at '/logLevel'"},
		// The default redis.addrs stays unless emptied: Sentinel beside it
		// is refused, not quietly preferred.
		{"Redis addrs and Sentinel both", "redis: {sentinel: {masterName: rl, addrs: [\"redis-sentinel:26379\"]}}\n", "redis.addrs [redis:6379] and redis.sentinel: give one, not both"},
		{"Sentinel without a master name", "redis: {addrs: [], sentinel: {addrs: [\"redis-sentinel:26379\"]}}\n", "redis.sentinel.masterName: required"},
		{"Sentinel without sentinels", "redis: {addrs: [], sentinel: {masterName: rl}}\n", "redis.sentinel.addrs: required"},
		{"one variable for both passwords", "redis: {addrs: [], sentinel: {masterName: rl, addrs: [\"redis-sentinel:26379\"], existingSecret: extauthz-redis, passwordEnv: REDIS_PASSWORD}}\n", "redis.sentinel.passwordEnv and redis.passwordEnv are both REDIS_PASSWORD"},
		{"misspelt Sentinel value", "redis: {addrs: [], sentinel: {master: rl}}\n", "additional properties 'master' not allowed"},
		{"addrs and Sentinel in settings", "config: {settings: {redis: {addrs: [\"redis:6379\"], sentinel: {master_name: rl, addrs: [\"redis-sentinel:26379\"]}}}}\n", "redis.sentinel: excludes redis.addrs"},
		{"Sentinel password from no Secret", "config: {settings: {redis: {sentinel: {master_name: rl, addrs: [\"redis-sentinel:26379\"], password_env: SENTINEL_PASSWORD}}}}\n", "redis.sentinel.password_env is SENTINEL_PASSWORD, which must come from a Secret"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var p problems
			c := chartCase{name: tc.name, values: []byte(tc.values), fixtures: []string{"k8s/redis"}}
			if _, err := renderChart(t, c.values); err != nil {
				if !strings.Contains(err.Error(), tc.want) {
					t.Fatalf("render error %v, want one mentioning %q", err, tc.want)
				}
				return
			}
			s := chartSet(t, &p, c)
			checkSet(&p, s, loadMeshConfig(t))
			checkChart(&p, s, c)
			if !p.has(tc.want) {
				t.Errorf("no problem mentions %q; got %q", tc.want, p.list)
			}
		})
	}
}

// TestChartSentinel renders ci/sentinel-values.yaml and checks the chart
// wrote the redis section the loader reads as Sentinel: the real loader
// (extauthz validate) names the master and the sentinels the values give,
// the file names no redis.addrs, and each password_env it names is the
// container's variable from the Secret key the values name. What else
// follows from having a Redis follows from Sentinel too: the Redis alert,
// and install notes that do not call the release local-only.
func TestChartSentinel(t *testing.T) {
	c := chartCase{name: "sentinel", values: readFile(t, repoPath(t, chartDir+"/ci/sentinel-values.yaml")),
		fixtures: []string{"k8s/redis", "tests/deploy/testdata/helm/sentinel.yaml"}}
	vals := chartValues(t, c)
	str := func(path string) string {
		t.Helper()
		v, err := vals.PathValue(path)
		if err != nil {
			t.Fatalf("values %s: %v", path, err)
		}
		return fmt.Sprint(v)
	}
	rawAddrs, err := vals.PathValue("redis.sentinel.addrs")
	if err != nil {
		t.Fatal(err)
	}
	var sentinels []string
	for _, a := range rawAddrs.([]any) {
		sentinels = append(sentinels, fmt.Sprint(a))
	}
	if len(sentinels) == 0 {
		t.Fatal("ci/sentinel-values.yaml names no sentinels")
	}

	out, err := renderChart(t, c.values)
	if err != nil {
		t.Fatal(err)
	}
	if notes := out[releaseName+"/templates/NOTES.txt"]; strings.Contains(notes, "local mode") {
		t.Errorf("the install notes say local mode only with Sentinel:\n%s", notes)
	}
	if rules := out[releaseName+"/templates/prometheusrule.yaml"]; !strings.Contains(rules, "alert: ExtauthzRedisDown") {
		t.Errorf("no ExtauthzRedisDown alert with Sentinel (monitoring.prometheusRule on):\n%s", rules)
	}

	var p problems
	s := chartSet(t, &p, c)
	p.report(t)
	text, ok := s.configMapKey(releaseName+"-config", "extauthz.yaml")
	if !ok {
		t.Fatalf("no ConfigMap %s-config with extauthz.yaml", releaseName)
	}
	summary, err := extauthzValidateSummary("chart sentinel", []byte(text), nil)
	if err != nil {
		t.Fatal(err)
	}
	if want := fmt.Sprintf("redis master %q from sentinels %s,", str("redis.sentinel.masterName"), strings.Join(sentinels, ",")); !strings.Contains(summary, want) {
		t.Errorf("extauthz validate does not say %q:\n%s", want, summary)
	}
	sc, err := parseSidecarConfig([]byte(text))
	if err != nil {
		t.Fatal(err)
	}
	if sc.Redis == nil || sc.Redis.Sentinel == nil {
		t.Fatalf("the chart wrote no redis.sentinel:\n%s", text)
	}
	if len(sc.Redis.Addrs) != 0 {
		t.Errorf("redis.addrs is %v beside redis.sentinel", sc.Redis.Addrs)
	}

	var env map[string]corev1.EnvVar
	for _, o := range s.deployments() {
		if o.meta.Name != releaseName {
			continue
		}
		for _, ctr := range o.k8s.(*appsv1.Deployment).Spec.Template.Spec.Containers {
			if ctr.Name == "extauthz" {
				env = map[string]corev1.EnvVar{}
				for _, e := range ctr.Env {
					env[e.Name] = e
				}
			}
		}
	}
	if env == nil {
		t.Fatal("no extauthz container in the Deployment")
	}
	for _, w := range []struct{ field, got, values string }{
		{"redis.password_env", sc.Redis.PasswordEnv, "redis"},
		{"redis.sentinel.password_env", sc.Redis.Sentinel.PasswordEnv, "redis.sentinel"},
	} {
		if want := str(w.values + ".passwordEnv"); w.got != want {
			t.Errorf("%s is %q, want %s.passwordEnv %q", w.field, w.got, w.values, want)
			continue
		}
		e, ok := env[w.got]
		if !ok || e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil {
			t.Errorf("%s names %s, which the container does not take from a Secret: %+v", w.field, w.got, e)
			continue
		}
		ref := e.ValueFrom.SecretKeyRef
		if want := str(w.values + ".existingSecret"); ref.Name != want {
			t.Errorf("env %s is from Secret %s, want %s.existingSecret %s", w.got, ref.Name, w.values, want)
		}
		if want := str(w.values + ".existingSecretKey"); ref.Key != want {
			t.Errorf("env %s is from key %s, want %s.existingSecretKey %s", w.got, ref.Key, w.values, want)
		}
	}
}

// TestChartDefaultsDocumented checks every top-level value has a comment
// in values.yaml or sits under one: the file is the chart's reference.
func TestChartDefaultsDocumented(t *testing.T) {
	text := string(readFile(t, repoPath(t, chartDir+"/values.yaml")))
	var top map[string]any
	if err := yaml.Unmarshal([]byte(text), &top); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(text, "\n")
	for key := range top {
		documented := false
		for i, l := range lines {
			if strings.HasPrefix(l, key+":") {
				documented = i > 0 && strings.HasPrefix(strings.TrimSpace(lines[i-1]), "#") || strings.Contains(l, "#")
			}
		}
		if !documented {
			t.Errorf("values.yaml: %s has no comment saying what it is", key)
		}
	}
}
