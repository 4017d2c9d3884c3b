package engine

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/extauthz/extauthz/internal/config"
	"github.com/extauthz/extauthz/internal/quota/local"
)

var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// rig is an engine in local mode, deciding at instants the test sets.
type rig struct {
	t     *testing.T
	e     *Engine
	m     *Metrics
	table *local.Table
	now   time.Time
}

func newRig(t *testing.T, yaml string) *rig {
	t.Helper()
	cfg, err := config.Parse([]byte(yaml), "test.yaml")
	if err != nil {
		t.Fatal(err)
	}
	r := &rig{t: t, m: NewMetrics(nil), now: t0}
	r.table, _ = local.NewTable(1000)
	r.e, err = Compile(cfg, Limiters{config.ModeLocal: local.New(r.table)}, r.m)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func (r *rig) decide(req *Request) *Verdict {
	r.t.Helper()
	v := &Verdict{}
	if err := r.e.Decide(context.Background(), req, r.now, v); err != nil {
		r.t.Fatal(err)
	}
	return v
}

// take returns the decision of the named policy in v.
func take(t *testing.T, v *Verdict, policy string) *Taken {
	t.Helper()
	for i := range v.Takes() {
		if v.Takes()[i].Policy.Name == policy {
			return &v.Takes()[i]
		}
	}
	t.Fatalf("policy %s did not match; takes: %+v", policy, v.Takes())
	return nil
}

func headers(kv ...string) map[string]string {
	m := map[string]string{}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return m
}

func jwt(claims map[string]any) *structpb.Struct {
	s, err := structpb.NewStruct(map[string]any{"payload": claims})
	if err != nil {
		panic(err)
	}
	return s
}

// A constant cost spends that many units, all or none, and what remains
// says so.
func TestConstantCost(t *testing.T) {
	r := newRig(t, "policies:\n  - {name: search, limit: 10, window: 1m, cost: 3}\n")
	for i, want := range []int64{7, 4, 1} {
		v := r.decide(&Request{})
		if v.Outcome != OK || v.Takes()[0].Units != 3 || v.Takes()[0].Decision.Remaining != want {
			t.Fatalf("request %d: %v %+v, want allowed with %d remaining", i, v.Outcome, v.Takes()[0], want)
		}
	}
	v := r.decide(&Request{})
	if v.Outcome != OverLimit || v.Takes()[0].Decision.Remaining != 1 {
		t.Fatalf("fourth request: %v %+v; 1 unit left cannot pay 3", v.Outcome, v.Takes()[0].Decision)
	}
	// One unit refills every 6s: two more are due in 12s, not before.
	if got := v.Takes()[0].Decision.RetryAfter; got != 12*time.Second {
		t.Fatalf("retry after %v, want 12s", got)
	}
}

// A cost read per request: a header, a verified claim, Envoy metadata.
// Missing or malformed values cost the default and are counted by reason.
func TestCostFromRequest(t *testing.T) {
	r := newRig(t, `
policies:
  - {name: h, match: {path_prefix: /h}, limit: 1000, window: 1m, cost: {header: X-Cost, default: 2}}
  - {name: c, match: {path_prefix: /c}, limit: 1000, window: 1m, cost: {claim: units}}
  - {name: m, match: {path_prefix: /m}, limit: 1000, window: 1m, cost: {metadata: {namespace: envoy.filters.http.lua, key: cost}, default: 5}}
`)
	lua := func(v any) map[string]*structpb.Struct {
		s, _ := structpb.NewStruct(map[string]any{"cost": v})
		return map[string]*structpb.Struct{"envoy.filters.http.lua": s}
	}
	for _, tc := range []struct {
		name   string
		req    Request
		policy string
		units  int64
		reason string // counted as defaulted: "", missing or malformed
	}{
		{"header", Request{Path: "/h", Headers: headers("x-cost", "7")}, "h", 7, ""},
		{"header with spaces", Request{Path: "/h", Headers: headers("x-cost", " 7 ")}, "h", 7, ""},
		{"header zero", Request{Path: "/h", Headers: headers("x-cost", "0")}, "h", 0, ""},
		{"header missing", Request{Path: "/h"}, "h", 2, "missing"},
		{"header not a number", Request{Path: "/h", Headers: headers("x-cost", "seven")}, "h", 2, "malformed"},
		{"header negative", Request{Path: "/h", Headers: headers("x-cost", "-3")}, "h", 2, "malformed"},
		{"header fraction", Request{Path: "/h", Headers: headers("x-cost", "1.5")}, "h", 2, "malformed"},
		{"header overflow", Request{Path: "/h", Headers: headers("x-cost", "99999999999999999999")}, "h", 2, "malformed"},
		{"header of 64 KiB", Request{Path: "/h", Headers: headers("x-cost", strings.Repeat("9", 64<<10))}, "h", 2, "malformed"},
		{"claim number", Request{Path: "/c", JWT: jwt(map[string]any{"units": 4})}, "c", 4, ""},
		{"claim string", Request{Path: "/c", JWT: jwt(map[string]any{"units": "6"})}, "c", 6, ""},
		{"claim fraction", Request{Path: "/c", JWT: jwt(map[string]any{"units": 2.5})}, "c", 1, "malformed"},
		{"claim list", Request{Path: "/c", JWT: jwt(map[string]any{"units": []any{1.0}})}, "c", 1, "malformed"},
		{"claim missing", Request{Path: "/c", JWT: jwt(map[string]any{"sub": "ada"})}, "c", 1, "missing"},
		{"no jwt", Request{Path: "/c"}, "c", 1, "missing"},
		{"metadata number", Request{Path: "/m", Metadata: lua(9)}, "m", 9, ""},
		{"metadata bool", Request{Path: "/m", Metadata: lua(true)}, "m", 5, "malformed"},
		{"metadata missing", Request{Path: "/m"}, "m", 5, "missing"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := map[string]float64{}
			for _, reason := range costProblemNames {
				before[reason] = testutil.ToFloat64(r.m.CostDefaulted.WithLabelValues(tc.policy, reason))
			}
			v := r.decide(&tc.req)
			if tk := take(t, v, tc.policy); v.Outcome != OK || tk.Units != tc.units {
				t.Fatalf("%v, units %d; want allowed at %d units", v.Outcome, tk.Units, tc.units)
			}
			for _, reason := range costProblemNames {
				want := before[reason]
				if reason == tc.reason {
					want++
				}
				if got := testutil.ToFloat64(r.m.CostDefaulted.WithLabelValues(tc.policy, reason)); got != want {
					t.Fatalf("cost_defaulted_total{reason=%q} = %v, want %v", reason, got, want)
				}
			}
		})
	}
}

// Cost 0 asks without spending: the answer one unit would get.
func TestZeroCostAsksWithoutSpending(t *testing.T) {
	r := newRig(t, "policies:\n  - {name: p, limit: 2, window: 1m, cost: {header: x-cost}}\n")
	peek := &Request{Headers: headers("x-cost", "0")}
	for i := 0; i < 3; i++ {
		if v := r.decide(peek); v.Outcome != OK || v.Takes()[0].Decision.Remaining != 2 {
			t.Fatalf("peek %d: %v %+v; a question spends nothing", i, v.Outcome, v.Takes()[0].Decision)
		}
	}
	r.decide(&Request{Headers: headers("x-cost", "2")})
	if v := r.decide(peek); v.Outcome != OverLimit {
		t.Fatalf("peek at an empty bucket: %v, want denied", v.Outcome)
	}
}

// A request costing more than a policy can ever grant at once is denied
// with a detail that says so, without asking any limiter: no state is
// created and the other policies are not charged.
func TestCostAboveBurstIsDeniedUpFront(t *testing.T) {
	r := newRig(t, `
policies:
  - {name: all, limit: 100, window: 1m}
  - {name: bulk, key: ip, limit: 100, window: 1m, burst: 10, cost: {header: x-cost}}
  - {name: audit, key: ip, limit: 5, window: 1m, shadow: true, cost: {header: x-cost}}
`)
	v := r.decide(&Request{Peer: "10.0.0.1", Headers: headers("x-cost", "11")})
	if v.Outcome != OverLimit {
		t.Fatalf("outcome %v, want over limit", v.Outcome)
	}
	d := v.Deny(false)
	if d.Problem.Detail != "This request costs 11 units; policy bulk admits at most 10 at once, so it is never admitted as sent." ||
		len(d.Problem.ViolatedPolicies) != 1 || d.Problem.ViolatedPolicies[0] != "bulk" {
		t.Fatalf("problem = %+v", d.Problem)
	}
	if n := r.table.Len(); n != 0 {
		t.Fatalf("%d keys in the table; no limiter should have been asked", n)
	}
	// The shadow policy would have denied too, and says so in its metrics.
	if got := testutil.ToFloat64(r.m.Decisions.WithLabelValues("audit", "local", "shadow_denied")); got != 1 {
		t.Fatalf("audit shadow_denied = %v, want 1", got)
	}
	// Within bulk's burst but above the shadow policy's limit: allowed,
	// the shadow policy counting a would-be denial without a limiter.
	v = r.decide(&Request{Peer: "10.0.0.1", Headers: headers("x-cost", "10")})
	if v.Outcome != OK || take(t, v, "bulk").Decision.Remaining != 0 || take(t, v, "all").Decision.Remaining != 99 {
		t.Fatalf("cost 10: %v %+v", v.Outcome, v.Takes())
	}
	if got := testutil.ToFloat64(r.m.Decisions.WithLabelValues("audit", "local", "shadow_denied")); got != 2 {
		t.Fatalf("audit shadow_denied = %v, want 2", got)
	}
}

// A denial refunds every unit the other policies took.
func TestCostRefundedOnDenial(t *testing.T) {
	r := newRig(t, `
policies:
  - {name: wide, limit: 100, window: 1m, cost: {header: x-cost}}
  - {name: narrow, limit: 5, window: 1m, cost: {header: x-cost}}
`)
	r.decide(&Request{Headers: headers("x-cost", "4")})
	v := r.decide(&Request{Headers: headers("x-cost", "4")})
	if v.Outcome != OverLimit {
		t.Fatalf("outcome %v; narrow has 1 unit left", v.Outcome)
	}
	v = r.decide(&Request{Headers: headers("x-cost", "0")})
	if got := take(t, v, "wide").Decision.Remaining; got != 96 {
		t.Fatalf("wide has %d left, want 96: the denied request's 4 units come back", got)
	}
}

// Every kind of condition, alone and combined with not.
func TestRicherMatching(t *testing.T) {
	r := newRig(t, `
ip_trusted_hops: 1
policies:
  - name: env
    match: {headers: [{name: X-Env, exact: prod}, {name: user-agent, prefix: "curl/"}, {name: x-debug, absent: true}]}
    limit: 10
    window: 1m
  - name: beta
    match: {headers: [{name: x-beta, present: true}, {name: x-build, regex: "[0-9]+\\.[0-9]+"}]}
    limit: 10
    window: 1m
  - name: gold
    match: {claims: [{name: tier, exact: gold}, {name: scope, prefix: "orders:"}]}
    limit: 10
    window: 1m
  - name: outside
    match: {path_prefix: /api, not: {source_cidrs: [10.0.0.0/8, "2001:db8::/32", 192.168.1.7]}}
    limit: 10
    window: 1m
`)
	gold := jwt(map[string]any{"tier": "gold", "scope": "orders:write"})
	for _, tc := range []struct {
		name string
		req  Request
		want []string
	}{
		{"nothing", Request{Path: "/", Peer: "10.0.0.1"}, nil},
		{"env", Request{Headers: headers("x-env", "prod", "user-agent", "curl/8.0")}, []string{"env"}},
		{"env with debug", Request{Headers: headers("x-env", "prod", "user-agent", "curl/8.0", "x-debug", "")}, nil},
		{"env wrong agent", Request{Headers: headers("x-env", "prod", "user-agent", "wget")}, nil},
		{"env staging", Request{Headers: headers("x-env", "staging", "user-agent", "curl/8.0")}, nil},
		{"beta", Request{Headers: headers("x-beta", "", "x-build", "12.3")}, []string{"beta"}},
		{"beta partial regex", Request{Headers: headers("x-beta", "", "x-build", "v12.3")}, nil},
		{"gold", Request{JWT: gold}, []string{"gold"}},
		{"silver", Request{JWT: jwt(map[string]any{"tier": "silver", "scope": "orders:write"})}, nil},
		{"outside", Request{Path: "/api/x", Peer: "203.0.113.9"}, []string{"outside"}},
		{"inside", Request{Path: "/api/x", Peer: "10.9.8.7"}, nil},
		{"inside v6", Request{Path: "/api/x", Peer: "2001:db8::1"}, nil},
		{"inside v4 in v6", Request{Path: "/api/x", Peer: "::ffff:10.1.1.1"}, nil},
		{"one address", Request{Path: "/api/x", Peer: "192.168.1.7"}, nil},
		{"its neighbour", Request{Path: "/api/x", Peer: "192.168.1.8"}, []string{"outside"}},
		// The client address behind one trusted proxy, as the ip key reads it.
		{"forwarded inside", Request{Path: "/api/x", Peer: "203.0.113.9", Headers: headers("x-forwarded-for", "10.0.0.5")}, nil},
		{"forwarded outside", Request{Path: "/api/x", Peer: "10.0.0.5", Headers: headers("x-forwarded-for", "198.51.100.1")}, []string{"outside"}},
		{"no address", Request{Path: "/api/x"}, []string{"outside"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got []string
			for _, tk := range r.decide(&tc.req).Takes() {
				got = append(got, tk.Policy.Name)
			}
			if strings.Join(got, ",") != strings.Join(tc.want, ",") {
				t.Fatalf("matched %v, want %v", got, tc.want)
			}
		})
	}
}

// Unlimited policies and plans never deny, keep no count, and are counted
// in metrics; clients see the headers of the policies that do limit.
func TestUnlimited(t *testing.T) {
	r := newRig(t, `
clients:
  keys:
    - {id: ops, key: key-ops, plan: internal}
    - {id: ada, key: key-ada}
plans:
  internal: {unlimited: true}
  default: {limit: 2, window: 1m}
policies:
  - {name: office, match: {source_cidrs: [10.0.0.0/8]}, unlimited: true}
  - {name: per-plan, key: [client], limit: plan}
`)
	for i := 0; i < 5; i++ {
		v := r.decide(&Request{Peer: "10.0.0.1", Headers: headers("x-api-key", "key-ops")})
		if v.Outcome != OK || len(v.Takes()) != 2 || v.Tightest() != nil {
			t.Fatalf("ops %d: %v %+v; unlimited decisions are allowed and not described", i, v.Outcome, v.Takes())
		}
	}
	if n := r.table.Len(); n != 0 {
		t.Fatalf("%d keys counted; unlimited decisions keep no state", n)
	}
	if got := testutil.ToFloat64(r.m.Decisions.WithLabelValues("office", "local", "unlimited")); got != 5 {
		t.Fatalf("office unlimited decisions = %v, want 5", got)
	}
	if got := testutil.ToFloat64(r.m.Decisions.WithLabelValues("per-plan", "local", "unlimited")); got != 5 {
		t.Fatalf("per-plan unlimited decisions = %v, want 5", got)
	}
	// Ada's plan is plans.default: two, then denied; the office policy
	// still matches her and never denies.
	for i, want := range []Outcome{OK, OK, OverLimit} {
		v := r.decide(&Request{Peer: "10.0.0.2", Headers: headers("x-api-key", "key-ada")})
		if v.Outcome != want {
			t.Fatalf("ada %d: %v, want %v", i, v.Outcome, want)
		}
		if want == OK && v.Tightest().Policy.Name != "per-plan" {
			t.Fatalf("ada %d: headers describe %s, want per-plan", i, v.Tightest().Policy.Name)
		}
	}
}

// plan_from picks the plan by a verified claim or a trusted header, before
// the API key's plan; an unknown name gets plans.default and is counted.
func TestPlanFrom(t *testing.T) {
	r := newRig(t, `
clients:
  keys: [{id: ada, key: key-ada, plan: gold}]
plans:
  gold: {limit: 5, window: 1m}
  silver: {limit: 3, window: 1m}
  default: {limit: 1, window: 1m}
policies:
  - {name: by-claim, match: {path_prefix: /c}, key: ["claim:sub"], limit: plan, plan_from: "claim:plan"}
  - {name: by-header, match: {path_prefix: /h}, key: [client], limit: plan, plan_from: "header:x-plan"}
`)
	for _, tc := range []struct {
		name, policy string
		req          Request
		limit        int64
		unknown      float64
	}{
		{"claim", "by-claim", Request{Path: "/c", JWT: jwt(map[string]any{"sub": "u1", "plan": "silver"})}, 3, 0},
		{"claim unknown", "by-claim", Request{Path: "/c", JWT: jwt(map[string]any{"sub": "u2", "plan": "platinum"})}, 1, 1},
		{"no claim", "by-claim", Request{Path: "/c", JWT: jwt(map[string]any{"sub": "u3"})}, 1, 1},
		{"header over the key's plan", "by-header", Request{Path: "/h", Headers: headers("x-api-key", "key-ada", "x-plan", "silver")}, 3, 0},
		{"no header: the key's plan", "by-header", Request{Path: "/h", Headers: headers("x-api-key", "key-ada")}, 5, 0},
		{"header unknown", "by-header", Request{Path: "/h", Headers: headers("x-api-key", "key-ada", "x-plan", "gold ")}, 1, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := r.decide(&tc.req)
			if got := take(t, v, tc.policy).Limit.Limit.Limit; got != tc.limit {
				t.Fatalf("limit %d, want %d", got, tc.limit)
			}
			if got := testutil.ToFloat64(r.m.UnknownPlans.WithLabelValues(tc.policy)); got != tc.unknown {
				t.Fatalf("unknown_plans_total = %v, want %v", got, tc.unknown)
			}
		})
	}
}

// A calendar quota's 429 points at the real reset: local midnight of the
// 1st, Paris time, not a multiple of the window.
func TestCalendarQuotaHeaders(t *testing.T) {
	r := newRig(t, "policies:\n  - {name: monthly, limit: 2, window: 1mo, calendar: true, time_zone: Europe/Paris}\n")
	r.now = time.Date(2027, 1, 31, 22, 58, 30, 0, time.UTC) // 23:58:30 in Paris
	r.decide(&Request{})
	r.decide(&Request{})
	v := r.decide(&Request{})
	if v.Outcome != OverLimit {
		t.Fatalf("third request: %v", v.Outcome)
	}
	h := map[string]string{}
	for _, kv := range v.Deny(false).Headers {
		h[kv[0]] = kv[1]
	}
	if h["retry-after"] != "90" || h["ratelimit"] != `"monthly";r=0;t=90` || h["ratelimit-policy"] != `"monthly";q=2;w=2592000` {
		t.Fatalf("429 headers = %v, want the reset in 90s, at midnight in Paris", h)
	}
	r.now = time.Date(2027, 1, 31, 23, 0, 0, 0, time.UTC) // February 1st, 00:00 in Paris
	if v = r.decide(&Request{}); v.Outcome != OK || v.Takes()[0].Decision.Remaining != 1 {
		t.Fatalf("at midnight: %v %+v", v.Outcome, v.Takes()[0].Decision)
	}
	// February has 28 days in 2027: the window ends on March 1st.
	if got, want := v.Takes()[0].Decision.ResetAfter, 28*24*time.Hour; got != want {
		t.Fatalf("reset after %v, want %v", got, want)
	}
}
