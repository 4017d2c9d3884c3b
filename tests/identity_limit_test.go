package tests

import (
	"fmt"
	"testing"
	"time"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"

	"github.com/extauthz/extauthz/tests/internal/testredis"
)

// identityLimits gives each mode a policy whose limit per minute is each
// tenant's rpm claim, as jwt_authn verified it: 5 when the claim is
// missing or malformed, never more than 100.
const identityLimits = `
policies:
  - {name: local, match: {path_prefix: /local}, key: ["claim:sub"], limit: {claim: rpm, default: 5, max: 100}, window: 1m, mode: local}
  - {name: redis, match: {path_prefix: /redis}, key: ["claim:sub"], limit: {claim: rpm, default: 5, max: 100}, window: 1m, mode: redis}
  - {name: hybrid, match: {path_prefix: /hybrid}, key: ["claim:sub"], limit: {claim: rpm, default: 5, max: 100}, window: 1m, mode: hybrid}
`

// tenantRequest is a Check of path by tenant sub whose token carries rpm
// (nil: no rpm claim).
func tenantRequest(path, sub string, rpm any) *authv3.CheckRequest {
	claims := map[string]any{"sub": sub}
	if rpm != nil {
		claims["rpm"] = rpm
	}
	return envoyRequest{path: path, jwt: claims}.build()
}

// A limit carried in each tenant's JWT, across three replicas at the
// shipped defaults: tenants of 20 and 60 requests a minute, and one whose
// token claims 500, held to the policy's max of 100, each admitted exactly
// its own limit (plus what refilled during the run) in redis and hybrid
// mode, and per replica in local mode, where each counts alone. The 429s
// advertise each tenant's limit. A malformed claim gets the default and is
// counted; a tenant's limit raised mid-window leaves it what it had not
// spent under the new one.
func TestLimitsFromIdentityAcrossReplicas(t *testing.T) {
	parallel(t)
	srv := testredis.Start(t)
	// No wait for the replicas to count each other: exactness is
	// Redis's, whatever slices the peer count a replica has seen sizes.
	replicas := startReplicas(t, 3, defaultsConfig(srv.Addr, "hybrid", identityLimits))
	tenants := []struct {
		sub   string
		rpm   any
		limit int
	}{
		{"ada", 20, 20},
		{"bob", 60, 60},
		{"cyd", 500, 100}, // above max: clamped
	}
	// 900 Checks, 60 at a time, round robin: each tenant sends 300, three
	// in a row (one to each replica), so in local mode every replica sees
	// 100 of each tenant's, more than any tenant's limit.
	const n = 900
	tenantOf := func(i int) int { return (i / 3) % len(tenants) }
	for _, mode := range []string{"local", "redis", "hybrid"} {
		t.Run(mode, func(t *testing.T) {
			clampedBefore := 0.0
			for _, r := range replicas {
				clampedBefore += r.metric("extauthz_limit_clamped_total", "policy", mode)
			}
			results, elapsed := timedDrive(t, replicas, n, seedConcurrency, func(i int) *authv3.CheckRequest {
				tn := tenants[tenantOf(i)]
				return tenantRequest("/"+mode, tn.sub, tn.rpm)
			})
			counts := tally(t, results)
			if counts[200]+counts[429] != n {
				t.Fatalf("statuses = %v", counts)
			}
			admitted := make([][]int, len(tenants)) // by tenant, by replica
			for i := range admitted {
				admitted[i] = make([]int, len(replicas))
			}
			for i, r := range results {
				tn := tenantOf(i)
				want := fmt.Sprintf(`"%s";q=%d;w=60`, mode, tenants[tn].limit)
				h := deniedHeaders(r.resp)
				if httpStatus(r.resp) == 200 {
					admitted[tn][r.replica]++
					h = okHeaders(r.resp)
				}
				if h["ratelimit-policy"] != want {
					t.Fatalf("%s's %d: RateLimit-Policy %q, want %q", tenants[tn].sub, httpStatus(r.resp), h["ratelimit-policy"], want)
				}
			}
			if mode != "local" {
				// Exactness is Redis's: first make sure no replica decided
				// without it (a breaker opened on a starved machine).
				assertNoFallback(t, replicas)
			}
			for i, tn := range tenants {
				if mode == "local" {
					for r, got := range admitted[i] {
						t.Logf("%s, replica %d:", tn.sub, r)
						assertAdmitted(t, got, tn.limit, tn.limit, time.Minute, elapsed, 1)
					}
					continue
				}
				t.Logf("%s:", tn.sub)
				assertAdmitted(t, admitted[i][0]+admitted[i][1]+admitted[i][2], tn.limit, tn.limit, time.Minute, elapsed, 1)
			}
			clamped := -clampedBefore
			for _, r := range replicas {
				clamped += r.metric("extauthz_limit_clamped_total", "policy", mode)
			}
			if clamped != float64(n/len(tenants)) {
				t.Fatalf("limit_clamped_total = %v, want %d (every Check of cyd's)", clamped, n/len(tenants))
			}
		})
	}

	t.Run("malformed claim", func(t *testing.T) {
		s := replicas[1]
		for _, mode := range []string{"local", "redis", "hybrid"} {
			before := s.metric("extauthz_limit_defaulted_total", "policy", mode, "reason", "malformed")
			n, last := s.admits(10, func() *authv3.CheckRequest { return tenantRequest("/"+mode, "dan", "lots") })
			if h := deniedHeaders(last); n != 5 || h["ratelimit-policy"] != fmt.Sprintf(`"%s";q=5;w=60`, mode) {
				t.Fatalf("%s: malformed rpm: %d of 10 admitted, 429 headers %v; want the default, 5", mode, n, h)
			}
			if got := s.metric("extauthz_limit_defaulted_total", "policy", mode, "reason", "malformed"); got != before+10 {
				t.Fatalf("%s: limit_defaulted_total{reason=malformed} = %v, want %v", mode, got, before+10)
			}
			before = s.metric("extauthz_limit_defaulted_total", "policy", mode, "reason", "missing")
			if n, _ := s.admits(10, func() *authv3.CheckRequest { return tenantRequest("/"+mode, "eli", nil) }); n != 5 {
				t.Fatalf("%s: no rpm claim: %d of 10 admitted, want the default, 5", mode, n)
			}
			if got := s.metric("extauthz_limit_defaulted_total", "policy", mode, "reason", "missing"); got != before+10 {
				t.Fatalf("%s: limit_defaulted_total{reason=missing} = %v, want %v", mode, got, before+10)
			}
		}
	})

	t.Run("raised mid-window", func(t *testing.T) {
		for _, mode := range []string{"local", "redis", "hybrid"} {
			// Round robin over the replicas, but one replica in local
			// mode, where each counts alone.
			targets := replicas
			if mode == "local" {
				targets = replicas[:1]
			}
			admits := func(rpm, n int) (allowed int) {
				for i := 0; i < n; i++ {
					allowed += btoi(httpStatus(targets[i%len(targets)].check(tenantRequest("/"+mode, "fay", rpm))) == 200)
				}
				return allowed
			}
			start := time.Now()
			first := admits(10, 30)
			then := admits(30, 60)
			// Refill at 10 and then 30 a minute: at most one token per 2s
			// of this run.
			slack := int(time.Since(start) / (2 * time.Second))
			if first < 10 || first > 10+slack || first+then < 30 || first+then > 30+slack {
				t.Fatalf("%s: %d admitted at 10 a minute, then %d more at 30; want 10 and 20 (+%d refilled)", mode, first, then, slack)
			}
		}
	})
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}
