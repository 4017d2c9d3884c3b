package deploy

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	"github.com/prometheus/common/model"
	"github.com/prometheus/common/promslog"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql/promqltest"
	"github.com/prometheus/prometheus/rules"
	"sigs.k8s.io/yaml"
)

// The chart's alerts are unit-tested the way Prometheus users test theirs:
// a file in promtool's test format (tests/deploy/testdata/alerts_test.yaml:
// input series in expanding notation, and the alerts expected to fire at
// given times) run by Prometheus's own rule engine: promqltest's loader
// for the series, the rules package's Manager and Group for loading (with
// rulefmt's validation) and evaluation, step by step at the evaluation
// interval, as `promtool test rules` does. The rules are the ones the chart
// renders, taken from its PrometheusRule.
//
// One difference from promtool: expected annotations are compared only
// where a test gives them (promtool wants all of them). Every firing
// alert's annotations must still expand without a template error.

// ruleTestFile is promtool's rule test file.
type ruleTestFile struct {
	RuleFiles          []string        `json:"rule_files"`
	EvaluationInterval model.Duration  `json:"evaluation_interval"`
	Tests              []ruleTestGroup `json:"tests"`
}

type ruleTestGroup struct {
	Name           string          `json:"name"`
	Interval       model.Duration  `json:"interval"`
	InputSeries    []inputSeries   `json:"input_series"`
	AlertRuleTests []alertRuleTest `json:"alert_rule_test"`
}

type inputSeries struct {
	Series string `json:"series"`
	Values string `json:"values"`
}

type alertRuleTest struct {
	EvalTime  model.Duration `json:"eval_time"`
	Alertname string         `json:"alertname"`
	ExpAlerts []expAlert     `json:"exp_alerts"`
}

type expAlert struct {
	ExpLabels      map[string]string `json:"exp_labels"`
	ExpAnnotations map[string]string `json:"exp_annotations"`
}

// renderedRules renders the chart with values and writes its
// PrometheusRule's groups as a Prometheus rule file, whose path it returns.
func renderedRules(t *testing.T, values []byte) (string, *monitoringv1.PrometheusRule) {
	t.Helper()
	out, err := renderChart(t, values)
	if err != nil {
		t.Fatal(err)
	}
	objs, errs := decodeFiles(renderedFiles(out))
	for _, err := range errs {
		t.Fatal(err)
	}
	for _, o := range objs {
		pr, ok := o.k8s.(*monitoringv1.PrometheusRule)
		if !ok {
			continue
		}
		data, err := yaml.Marshal(map[string]any{"groups": pr.Spec.Groups})
		if err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(t.TempDir(), "extauthz-rules.yaml")
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
		return path, pr
	}
	t.Fatal("the chart rendered no PrometheusRule")
	return "", nil
}

// TestAlertRules runs testdata/alerts_test.yaml against the rules the
// chart renders for the sidecar layout (which has every alert: the
// extauthz ones and the Envoy ones), and checks every alert is shown
// firing by some test.
func TestAlertRules(t *testing.T) {
	ruleFile, pr := renderedRules(t, readFile(t, repoPath(t, chartDir+"/ci/sidecar-values.yaml")))
	var tf ruleTestFile
	if err := yaml.UnmarshalStrict(readFile(t, "testdata/alerts_test.yaml"), &tf); err != nil {
		t.Fatalf("testdata/alerts_test.yaml: %v", err)
	}
	interval := time.Duration(tf.EvaluationInterval)
	if interval == 0 {
		interval = time.Minute
	}
	shown := map[string]bool{}
	for _, tg := range tf.Tests {
		t.Run(tg.Name, func(t *testing.T) {
			for _, err := range runRuleTestGroup(tg, interval, ruleFile) {
				t.Error(err)
			}
		})
		for _, at := range tg.AlertRuleTests {
			if len(at.ExpAlerts) > 0 {
				shown[at.Alertname] = true
			}
		}
	}
	for _, g := range pr.Spec.Groups {
		for _, r := range g.Rules {
			if r.Alert != "" && !shown[r.Alert] {
				t.Errorf("alert %s is never shown firing in testdata/alerts_test.yaml", r.Alert)
			}
		}
	}
}

// TestSharedLayoutRulesLoad loads the shared layout's rules into
// Prometheus's rule manager: they differ from the sidecar layout's in
// their selectors.
func TestSharedLayoutRulesLoad(t *testing.T) {
	ruleFile, _ := renderedRules(t, readFile(t, repoPath(t, chartDir+"/ci/shared-istio-values.yaml")))
	tg := ruleTestGroup{Name: "load", Interval: model.Duration(time.Minute), InputSeries: []inputSeries{{Series: "up", Values: "1"}}}
	for _, err := range runRuleTestGroup(tg, time.Minute, ruleFile) {
		t.Error(err)
	}
}

// runRuleTestGroup loads tg's series, evaluates the rules in ruleFile at
// every interval from 0 to the last eval_time, and compares the firing
// alerts at each eval_time with the expected ones.
func runRuleTestGroup(tg ruleTestGroup, interval time.Duration, ruleFile string) []error {
	load := fmt.Sprintf("load %s\n", time.Duration(tg.Interval))
	for _, s := range tg.InputSeries {
		load += fmt.Sprintf("  %s %s\n", s.Series, s.Values)
	}
	suite, err := promqltest.NewLazyLoader(load, promqltest.LazyLoaderOpts{EnableAtModifier: true, EnableNegativeOffset: true})
	if err != nil {
		return []error{err}
	}
	defer suite.Close()
	m := rules.NewManager(&rules.ManagerOptions{
		QueryFunc:    rules.EngineQueryFunc(suite.QueryEngine(), suite.Storage()),
		AppendableV2: suite.Storage(),
		Context:      context.Background(),
		NotifyFunc:   func(context.Context, string, ...*rules.Alert) {},
		Logger:       promslog.NewNopLogger(),
	})
	groups, errs := m.LoadGroups(interval, labels.EmptyLabels(), "", nil, false, ruleFile)
	if errs != nil {
		return errs
	}
	names := make([]string, 0, len(groups))
	for n := range groups {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		for _, r := range groups[n].Rules() {
			if ar, ok := r.(*rules.AlertingRule); ok {
				ar.SetRestored(true) // as promtool: the ALERTS series are written
			}
		}
	}

	byTime := map[time.Duration][]alertRuleTest{}
	var last time.Duration
	for _, at := range tg.AlertRuleTests {
		d := time.Duration(at.EvalTime)
		byTime[d] = append(byTime[d], at)
		last = max(last, d)
	}
	var out []error
	start := time.Unix(0, 0).UTC()
	for step := time.Duration(0); step <= last; step += interval {
		ts := start.Add(step)
		var evalErrs []error
		suite.WithSamplesTill(ts, func(err error) {
			if err != nil {
				evalErrs = append(evalErrs, err)
				return
			}
			for _, n := range names {
				groups[n].Eval(suite.Context(), ts)
				for _, r := range groups[n].Rules() {
					if r.LastError() != nil {
						evalErrs = append(evalErrs, fmt.Errorf("rule %s at %v: %w", r.Name(), step, r.LastError()))
					}
				}
			}
		})
		if len(evalErrs) > 0 {
			return append(out, evalErrs...)
		}
		// eval_times between this evaluation and the next see its result.
		for d, tests := range byTime {
			if d < step || d >= step+interval {
				continue
			}
			for _, at := range tests {
				out = append(out, compareAlerts(tg.Name, at, firing(groups, at.Alertname))...)
			}
		}
	}
	return out
}

// firing returns the firing alerts of rule name, as promtool collects them.
func firing(groups map[string]*rules.Group, name string) []*rules.Alert {
	var out []*rules.Alert
	for _, g := range groups {
		for _, r := range g.Rules() {
			ar, ok := r.(*rules.AlertingRule)
			if !ok || ar.Name() != name {
				continue
			}
			for _, a := range ar.ActiveAlerts() {
				if a.State == rules.StateFiring {
					out = append(out, a)
				}
			}
		}
	}
	return out
}

// compareAlerts compares got with at's expected alerts: the same label
// sets (alertname added, as promtool does), and the annotations at gives.
func compareAlerts(group string, at alertRuleTest, got []*rules.Alert) []error {
	where := fmt.Sprintf("%s: %s at %v", group, at.Alertname, time.Duration(at.EvalTime))
	var errs []error
	for _, a := range got {
		a.Annotations.Range(func(l labels.Label) {
			if strings.Contains(l.Value, "error expanding template") || strings.Contains(l.Value, "<no value>") {
				errs = append(errs, fmt.Errorf("%s: annotation %s does not expand: %s", where, l.Name, l.Value))
			}
		})
	}
	gotSets := make([]string, len(got))
	for i, a := range got {
		gotSets[i] = a.Labels.String()
	}
	wantSets := make([]string, len(at.ExpAlerts))
	for i, e := range at.ExpAlerts {
		l := map[string]string{labels.AlertName: at.Alertname}
		for k, v := range e.ExpLabels {
			l[k] = v
		}
		wantSets[i] = labels.FromMap(l).String()
	}
	sort.Strings(gotSets)
	sort.Strings(wantSets)
	if strings.Join(gotSets, "\n") != strings.Join(wantSets, "\n") {
		return append(errs, fmt.Errorf("%s:\n  want %v\n  got  %v", where, wantSets, gotSets))
	}
	for _, e := range at.ExpAlerts {
		for _, a := range got {
			if !labelsMatch(a.Labels, e.ExpLabels) {
				continue
			}
			for k, v := range e.ExpAnnotations {
				if g := a.Annotations.Get(k); g != v {
					errs = append(errs, fmt.Errorf("%s: annotation %s:\n  want %q\n  got  %q", where, k, v, g))
				}
			}
		}
	}
	return errs
}

func labelsMatch(l labels.Labels, want map[string]string) bool {
	for k, v := range want {
		if l.Get(k) != v {
			return false
		}
	}
	return true
}
