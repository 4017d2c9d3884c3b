package tests

import (
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/extauthz/extauthz/tests/internal/testredis"
)

// pairDomain is a route of two rules, a (2 an hour) and b (4 an hour),
// each a descriptor of one request; fixed windows, as the anchor's.
const pairDomain = `
domain: pair
descriptors:
  - {key: rule, value: a, rate_limit: {unit: hour, requests_per_unit: 2}}
  - {key: rule, value: b, rate_limit: {unit: hour, requests_per_unit: 4}}
`

// overFlood is how long the flood of requests over rule a's limit
// lasts: long enough for hybrid mode's summed charges to be made more
// than once (engine.DefaultDeferEvery).
const overFlood = 2500 * time.Millisecond

// rls.counting: each counts a request's descriptors as
// envoyproxy/ratelimit does, in every mode: a request of both rules
// whose first is over is denied and still counts the second (and the
// first, past its limit); its twin at the defaults (all or nothing)
// counts neither. Then a flood of requests over rule a alone: each is
// denied, and each counts, at the Redis calls docs/envoy-gateway.md
// states for each mode (redis: the denied take and the charge, two
// exact calls; hybrid: the denial is the lease's cached one and the
// denied hits are charged summed, at most one call a second for the
// key; local: none); then rule a's limit raised past the count sees
// them all (hybrid: the reload charges the sum still held).
func TestRLSCountingEach(t *testing.T) {
	parallel(t)
	both := rateLimitRequest("pair", envoyRequest{}, actions(genericKey("rule", "a")), actions(genericKey("rule", "b")))
	ruleA := rateLimitRequest("pair", envoyRequest{}, actions(genericKey("rule", "a")))
	ruleB := rateLimitRequest("pair", envoyRequest{}, actions(genericKey("rule", "b")))
	for _, c := range []struct {
		mode, counting string
		// the Redis decision calls the flood makes, per request
		perOver int
	}{
		// -1: the denied hits' charges are one call a second at most
		// (engine.DefaultDeferEvery): the key's first denied hit (the
		// request of both rules) was charged at once, the flood's
		// wait, summed; beside redis mode's denied takes, one each.
		{"local", "each", 0}, {"redis", "each", -1}, {"hybrid", "each", -1},
		// The twins at the defaults: all or nothing (a denied request
		// counts nothing: redis mode's denied take, hybrid's cached
		// denial).
		{"redis", "", 1}, {"hybrid", "", 0},
	} {
		t.Run(c.mode+" "+c.counting, func(t *testing.T) {
			section, dir := domainDir(t, map[string]string{"pair.yaml": pairDomain})
			cfg := strings.Replace(section, "rls: {", "rls: {counting: "+c.counting+", ", 1)
			if c.counting == "" {
				cfg = section
			}
			if c.mode == "local" {
				cfg = "default_mode: local\n" + cfg
			} else {
				cfg = defaultsConfig(testredis.Start(t).Addr, c.mode, cfg)
			}
			s := startSidecar(t, cfg)
			began := time.Now()
			for i := 0; i < 2; i++ {
				if resp := s.shouldRateLimit(both); resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
					t.Fatalf("both rules, call %d: %v", i+1, resp)
				}
			}
			// a is at 2 of 2: the third request is over by a.
			resp := s.shouldRateLimit(both)
			if resp.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT || resp.GetStatuses()[0].GetCode() != rlsv3.RateLimitResponse_OVER_LIMIT ||
				resp.GetStatuses()[1].GetCode() != rlsv3.RateLimitResponse_OK {
				t.Fatalf("both rules, a over: %v", resp)
			}
			// b counted that request (each: 3 of 4, its status says 1
			// left) or was not asked (all or nothing: still 2 of 4, its
			// status without a remaining count).
			status, after := uint32(1), uint32(0)
			if c.counting == "" {
				status, after = 0, 1
			}
			if got := resp.GetStatuses()[1].GetLimitRemaining(); got != status {
				t.Fatalf("both rules, a over: b's status says %d remaining, want %d", got, status)
			}
			if got := s.shouldRateLimit(ruleB).GetStatuses()[0].GetLimitRemaining(); got != after {
				t.Fatalf("b alone after: %d remaining, want %d", got, after)
			}

			// Decision calls answered (a call that timed out and was
			// made again counts once: its answer).
			calls := func() (decisions, all float64) {
				return s.metric("extauthz_redis_calls_total", "op", "fixed_window", "result", "ok") + s.metric("extauthz_redis_calls_total", "op", "lease", "result", "ok"),
					s.metric("extauthz_redis_calls_total")
			}
			d0, a0 := calls()
			flood, n := time.Now(), 0
			for ; time.Since(flood) < overFlood; n++ {
				if rlsStatus(s.shouldRateLimit(ruleA)) != 429 {
					t.Fatalf("flood, call %d: admitted over a's limit", n+1)
				}
			}
			took := time.Since(flood)
			d1, a1 := calls()
			if began.Truncate(time.Hour) != time.Now().Truncate(time.Hour) {
				t.Fatalf("the run straddled the hour (%v): the windows turned; run it again", time.Now())
			}
			t.Logf("%s, counting %q: %d requests over the limit in %v: %v Redis decision calls (%v calls of every kind)", c.mode, c.counting, n, took, d1-d0, a1-a0)
			switch got := int(d1 - d0); {
			case c.perOver >= 0 && got != c.perOver*n:
				t.Errorf("%s: %d Redis decision calls answered for %d requests over the limit, want %d each (%v calls of every kind, answered or not)", c.mode, got, n, c.perOver, a1-a0)
			case c.perOver < 0:
				takes := 0 // redis mode asks Redis for each denial
				if c.mode == "redis" {
					takes = n
				}
				if charges := got - takes; charges < 0 || charges > 1+int(took/time.Second) {
					t.Errorf("%s: %d Redis decision calls for %d requests over the limit in %v: %d charges, want at most one a second", c.mode, got, n, took, charges)
				}
			}

			// a raised to 3 + n + 1: each counted 3 + n (the denied hits
			// included), so 1 more fits; all or nothing counted 2.
			raised := 3 + n + 1
			writeAtomically(t, filepath.Join(dir, "pair.yaml"), strings.Replace(pairDomain, "requests_per_unit: 2}", "requests_per_unit: "+strconv.Itoa(raised)+"}", 1))
			waitMetric(t, s, 10*time.Second, 1, "extauthz_config_reloads_total", "result", "success")
			want := 1
			if c.counting == "" {
				want = 3
			}
			if got := s.rlsAdmitted(3, ruleA); got != want {
				t.Fatalf("a raised to %d after the flood: %d of 3 admitted, want %d", raised, got, want)
			}
		})
	}
}
