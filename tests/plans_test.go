package tests

import (
	"fmt"
	"strings"
	"testing"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"

	"github.com/extauthz/extauthz/tests/internal/testredis"
)

// plansAndMatching gives each mode a plan policy whose plan comes from a
// verified claim, a policy matched by header and by network (not the
// office network), and an unlimited policy for the office network.
func plansAndMatching(modes ...string) string {
	var b strings.Builder
	b.WriteString(`
plans:
  internal: {unlimited: true}
  gold: {limit: 5, window: 1m}
  default: {limit: 2, window: 1m}
policies:
`)
	for _, m := range modes {
		fmt.Fprintf(&b, `  - {name: %[1]s-plans, match: {path_prefix: /%[1]s/plans}, key: ["claim:sub"], limit: plan, plan_from: "claim:plan", mode: %[1]s}
  - name: %[1]s-match
    match: {path_prefix: /%[1]s/match, headers: [{name: x-env, exact: prod}], not: {source_cidrs: [10.0.0.0/8]}}
    key: [ip]
    limit: 1
    window: 1m
    mode: %[1]s
  - {name: %[1]s-office, match: {path_prefix: /%[1]s/match, source_cidrs: [10.0.0.0/8]}, key: [ip], unlimited: true, mode: %[1]s}
`, m)
	}
	return b.String()
}

// admits sends req n times and returns how many were allowed, failing on
// anything but 200 and 429.
func (s *sidecar) admits(n int, req func() *authv3.CheckRequest) (allowed int, last *authv3.CheckResponse) {
	s.t.Helper()
	for i := 0; i < n; i++ {
		last = s.check(req())
		switch httpStatus(last) {
		case 200:
			allowed++
		case 429:
		default:
			s.t.Fatalf("status %d", httpStatus(last))
		}
	}
	return allowed, last
}

// Plans chosen by a verified claim, an unknown plan name falling back to
// plans.default (and counted), an unlimited plan and an unlimited policy
// that never deny and send no RateLimit headers, and a policy matched by
// header and by network: through the real binary, in every mode.
func TestPlansFromClaimsAndRicherMatching(t *testing.T) {
	parallel(t)
	srv := testredis.Start(t)
	s := startSidecar(t, defaultsConfig(srv.Addr, "hybrid", plansAndMatching("local", "redis", "hybrid")))
	for _, mode := range []string{"local", "redis", "hybrid"} {
		t.Run(mode, func(t *testing.T) {
			plan := func(sub, plan string) func() *authv3.CheckRequest {
				return func() *authv3.CheckRequest {
					return envoyRequest{path: "/" + mode + "/plans", jwt: map[string]any{"sub": sub, "plan": plan}}.build()
				}
			}
			for _, tc := range []struct {
				sub, plan string
				allowed   int
				q         string // RateLimit-Policy of the 429; "" when none is denied
			}{
				{"u-gold", "gold", 5, "5"},
				{"u-unknown", "platinum", 2, "2"},
				{"u-internal", "internal", 10, ""},
			} {
				n, last := s.admits(10, plan(tc.sub, tc.plan))
				if n != tc.allowed {
					t.Fatalf("plan %s: %d of 10 allowed, want %d", tc.plan, n, tc.allowed)
				}
				if tc.q == "" {
					if h := okHeaders(last); len(h) != 0 {
						t.Fatalf("plan %s: unlimited, yet headers %v", tc.plan, h)
					}
					continue
				}
				if h := deniedHeaders(last); h["ratelimit-policy"] != fmt.Sprintf(`"%s-plans";q=%s;w=60`, mode, tc.q) {
					t.Fatalf("plan %s: 429 headers %v", tc.plan, h)
				}
			}
			if got := s.metric("extauthz_unknown_plans_total", "policy", mode+"-plans"); got != 10 {
				t.Fatalf("unknown_plans_total = %v, want 10", got)
			}
			if got := s.metric("extauthz_decisions_total", "policy", mode+"-plans", "result", "unlimited"); got != 10 {
				t.Fatalf("unlimited decisions = %v, want 10", got)
			}

			match := func(ip string, env string) func() *authv3.CheckRequest {
				return func() *authv3.CheckRequest {
					r := envoyRequest{path: "/" + mode + "/match", sourceIP: ip}
					if env != "" {
						r.headers = [][2]string{{"x-env", env}}
					}
					return r.build()
				}
			}
			if n, _ := s.admits(3, match("203.0.113.9", "prod")); n != 1 {
				t.Fatalf("prod from outside: %d of 3 allowed, want 1", n)
			}
			if n, _ := s.admits(3, match("203.0.113.9", "staging")); n != 3 {
				t.Fatalf("staging from outside: %d of 3 allowed, want 3 (no policy matches)", n)
			}
			if n, last := s.admits(3, match("10.1.2.3", "prod")); n != 3 || len(okHeaders(last)) != 0 {
				t.Fatalf("prod from the office: %d of 3 allowed, headers %v; want 3 and none", n, okHeaders(last))
			}
			if got := s.metric("extauthz_decisions_total", "policy", mode+"-office", "result", "unlimited"); got != 3 {
				t.Fatalf("office unlimited decisions = %v, want 3", got)
			}
		})
	}
	assertNoFallback(t, []*sidecar{s})
	// Unlimited decisions leave nothing in Redis; the limited ones do.
	keys := srv.Client().Keys(t.Context(), "rl:{*").Val()
	limited := 0
	for _, k := range keys {
		if strings.Contains(k, "internal") || strings.Contains(k, "office") {
			t.Fatalf("an unlimited decision left %s in Redis", k)
		}
		if strings.Contains(k, "u-gold") {
			limited++
		}
	}
	if limited != 2 {
		t.Fatalf("keys %v; want the gold caller's in redis and hybrid mode", keys)
	}
}
