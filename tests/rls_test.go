package tests

import (
	"bytes"
	"context"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	"github.com/extauthz/extauthz/tests/internal/testredis"
)

// The rate limit service door (Envoy's envoy.service.ratelimit.v3), end to
// end: the real binary, real Redis, requests built the way Envoy's
// ratelimit filter builds them, envoyproxy/ratelimit's descriptor files.

// domainDir writes descriptor files into a directory of their own and
// returns the rls section naming it.
func domainDir(t *testing.T, files map[string]string) (section, dir string) {
	t.Helper()
	dir = t.TempDir()
	for name, content := range files {
		must(t, os.WriteFile(filepath.Join(dir, name), []byte(content), 0o600))
	}
	return fmt.Sprintf("rls: {domains: [%s]}\n", dir), dir
}

// seedDomain gives each counting algorithm the seed limit, 100 per
// minute per user, under a descriptor (alg=<algorithm>, user=<id>), so
// one set of replicas serves them all.
const seedDomain = `
domain: seed
descriptors:
  - key: alg
    value: token_bucket
    descriptors: [{key: user, rate_limit: {unit: minute, requests_per_unit: 100, algorithm: token_bucket}}]
  - key: alg
    value: sliding_window
    descriptors: [{key: user, rate_limit: {unit: minute, requests_per_unit: 100, algorithm: sliding_window}}]
  - key: alg
    value: fixed_window
    descriptors: [{key: user, rate_limit: {unit: minute, requests_per_unit: 100}}]
  - key: alg
    value: sliding_log
    descriptors: [{key: user, rate_limit: {unit: minute, requests_per_unit: 100, algorithm: sliding_log}}]
`

// seedRequest is what Envoy sends for a request of user under a route
// whose rate_limits entry is [generic_key alg=<alg>, request_headers
// x-user → user].
func seedRequest(alg, user string) func(int) *rlsv3.RateLimitRequest {
	req := rateLimitRequest("seed", envoyRequest{headers: [][2]string{{"x-user", user}}},
		actions(genericKey("alg", alg), requestHeader("x-user", "user")))
	return func(int) *rlsv3.RateLimitRequest { return req }
}

// The seed scenario through descriptors, at the shipped defaults: three
// replicas, 600 requests 60 at a time round robin, exactly the limit of
// 100 admitted in redis and hybrid mode, for every counting algorithm
// (fixed_window being what envoyproxy/ratelimit users have today); and
// again in hybrid mode under rls.counting: each (the anchor's counting,
// the default as /bin/ratelimit): its denied requests' hits are charged
// too, which only adds to the count, so exactly 100 still.
func TestRLSSeedScenario(t *testing.T) {
	parallel(t)
	for _, c := range []struct{ mode, counting string }{{"redis", ""}, {"hybrid", ""}, {"hybrid", "each"}} {
		name := c.mode
		if c.counting != "" {
			name += " counting " + c.counting
		}
		t.Run(name, func(t *testing.T) {
			mode := c.mode
			srv := testredis.Start(t)
			rdb := srv.Client()
			section, _ := domainDir(t, map[string]string{"seed.yaml": seedDomain})
			if c.counting != "" {
				section = strings.Replace(section, "rls: {", "rls: {counting: "+c.counting+", ", 1)
			}
			replicas := startReplicas(t, 3, defaultsConfig(srv.Addr, mode, section))
			for _, alg := range countingAlgorithms {
				t.Run(alg, func(t *testing.T) { assertRLSSeedExact(t, replicas, rdb, alg) })
			}
			assertNotDegraded(t, replicas)
		})
	}
}

// assertRLSSeedExact is assertSeedExact through the rate limit service:
// exactly 100 admitted (the token bucket plus what refilled during the
// run), the denials' statuses and headers say so, the replicas' metrics
// count what the answers say, and a run that crossed a window boundary
// (by Redis TIME) is repeated under another user.
func assertRLSSeedExact(t *testing.T, replicas []*sidecar, rdb *redis.Client, alg string) {
	t.Helper()
	policy := "seed.alg_" + alg + ".user"
	for attempt, user := range []string{"ada", "bob", "cyd"} {
		allowedBefore := allowedDecisions(replicas, policy)
		before := redisNow(t, rdb)
		start := time.Now()
		results := driveRLS(t, replicas, seedBurst, seedConcurrency, seedRequest(alg, user))
		elapsed := time.Since(start)
		after := redisNow(t, rdb)
		if alg != "token_bucket" && alg != "sliding_log" && before.Truncate(time.Minute) != after.Truncate(time.Minute) && attempt < 2 {
			t.Logf("the run crossed the minute at %v: the window turned; again with another user", after.Truncate(time.Minute))
			continue
		}
		counts := tallyRLS(t, results)
		buckets := 0
		if alg == "token_bucket" {
			buckets = 1
		}
		assertAdmitted(t, counts[200], 100, 100, time.Minute, elapsed, buckets)
		if counts[200] > 102 {
			t.Fatalf("admitted %d: more than 2 over the limit is never refill in a seed run", counts[200])
		}
		for _, r := range results {
			st := r.resp.GetStatuses()[0]
			if rlsStatus(r.resp) == 429 && (st.GetCode() != rlsv3.RateLimitResponse_OVER_LIMIT || st.GetLimitRemaining() != 0 ||
				st.GetCurrentLimit().GetRequestsPerUnit() != 100 || st.GetCurrentLimit().GetUnit() != rlsv3.RateLimitResponse_RateLimit_MINUTE ||
				headerOf(r.resp, "ratelimit-policy") != fmt.Sprintf(`"%s";q=100;w=60`, policy)) {
				t.Fatalf("denial %v", r.resp)
			}
		}
		if got := allowedDecisions(replicas, policy) - allowedBefore; got != float64(counts[200]) {
			t.Fatalf("replicas count %v allowed decisions, answers %d", got, counts[200])
		}
		return
	}
}

func headerOf(resp *rlsv3.RateLimitResponse, name string) string {
	for _, h := range resp.GetResponseHeadersToAdd() {
		if h.GetKey() == name {
			return h.GetValue()
		}
	}
	return ""
}

// shopDomain exercises each feature of the descriptor language once. Its
// windows are hours (fixed windows, aligned to the hour): a test's few
// requests then cross a window's end with negligible odds.
const shopDomain = `
domain: shop
descriptors:
  # nested under a wildcard: 3 an hour per user on any /api/ route
  - key: route
    value: /api/*
    descriptors:
      - key: user
        rate_limit: {name: per_user, unit: hour, requests_per_unit: 3}
  # gold users: 10 an hour, in place of per_user
  - key: plan
    value: gold
    descriptors:
      - key: user
        rate_limit: {unit: hour, requests_per_unit: 10, replaces: [{name: per_user}]}
  - key: health
    rate_limit: {unlimited: true}
  - key: beta
    shadow_mode: true
    rate_limit: {unit: hour, requests_per_unit: 2}
  - key: bulk
    rate_limit: {unit: hour, requests_per_unit: 10}
  - key: tiny
    rate_limit: {unit: hour, requests_per_unit: 1}
`

// Nested and wildcard matching, replaces, unlimited, shadow_mode,
// hits_addend, the statuses' fields, and several descriptors one of which
// is denied, through the real binary in redis mode.
func TestRLSDescriptors(t *testing.T) {
	parallel(t)
	srv := testredis.Start(t)
	rdb := srv.Client()
	section, _ := domainDir(t, map[string]string{"shop.yaml": shopDomain})
	s := startSidecar(t, defaultsConfig(srv.Addr, "redis", section))
	admitted := s.rlsAdmitted
	routeUser := actions(requestHeader(":path", "route"), requestHeader("x-user", "user"))
	planUser := actions(requestHeader("x-plan", "plan"), requestHeader("x-user", "user"))

	t.Run("nested and wildcard", func(t *testing.T) {
		ada := envoyRequest{headers: [][2]string{{":path", "/api/orders/7"}, {"x-user", "ada"}}}
		if got := admitted(5, rateLimitRequest("shop", ada, routeUser)); got != 3 {
			t.Fatalf("/api/orders/7 as ada: %d of 5 admitted, want 3", got)
		}
		// Another user has a bucket of its own; a route the wildcard
		// does not match has no limit.
		bob := envoyRequest{headers: [][2]string{{":path", "/api/cart"}, {"x-user", "bob"}}}
		if got := admitted(5, rateLimitRequest("shop", bob, routeUser)); got != 3 {
			t.Fatalf("bob: %d admitted, want 3", got)
		}
		static := envoyRequest{headers: [][2]string{{":path", "/static/app.js"}, {"x-user", "ada"}}}
		if got := admitted(10, rateLimitRequest("shop", static, routeUser)); got != 10 {
			t.Fatalf("/static: %d of 10 admitted, want all", got)
		}
	})
	t.Run("replaces", func(t *testing.T) {
		// A gold user on an /api/ route: both descriptors match, the
		// gold limit replaces per_user, which is neither applied nor
		// spent.
		cyd := envoyRequest{headers: [][2]string{{":path", "/api/orders"}, {"x-user", "cyd"}, {"x-plan", "gold"}}}
		req := rateLimitRequest("shop", cyd, routeUser, planUser)
		if len(req.GetDescriptors()) != 2 {
			t.Fatalf("descriptors %v", req.GetDescriptors())
		}
		if got := admitted(12, req); got != 10 {
			t.Fatalf("gold: %d of 12 admitted, want 10", got)
		}
		resp := s.shouldRateLimit(req)
		if st := resp.GetStatuses()[0]; st.GetCurrentLimit() != nil || st.GetCode() != rlsv3.RateLimitResponse_OK {
			t.Fatalf("replaced descriptor's status %v", st)
		}
		// Without the gold descriptor, per_user applies, untouched.
		cyd.headers = cyd.headers[:2]
		if got := admitted(5, rateLimitRequest("shop", cyd, routeUser, planUser)); got != 3 {
			t.Fatalf("per_user after gold: %d admitted, want 3", got)
		}
	})
	t.Run("unlimited", func(t *testing.T) {
		req := rateLimitRequest("shop", envoyRequest{}, actions(genericKey("health", "probe")))
		for i := 0; i < 50; i++ {
			st := s.shouldRateLimit(req).GetStatuses()[0]
			if st.GetCode() != rlsv3.RateLimitResponse_OK || st.GetLimitRemaining() != math.MaxUint32 {
				t.Fatalf("unlimited status %v", st)
			}
		}
		// Never counted: no key in Redis, no decision.
		if keys := rdb.Keys(context.Background(), "rl:{rls/shop:health*").Val(); len(keys) != 0 {
			t.Fatalf("an unlimited descriptor left keys %v", keys)
		}
		if n := s.metric("extauthz_decisions_total", "policy", "shop.health"); n != 0 {
			t.Fatalf("an unlimited descriptor was counted: %v", n)
		}
	})
	t.Run("shadow_mode", func(t *testing.T) {
		req := rateLimitRequest("shop", envoyRequest{}, actions(metadataAction("beta", "", "on")))
		if got := admitted(5, req); got != 5 {
			t.Fatalf("shadow: %d of 5 admitted, want all", got)
		}
		if a, sd := s.metric("extauthz_decisions_total", "policy", "shop.beta", "result", "allowed"),
			s.metric("extauthz_decisions_total", "policy", "shop.beta", "result", "shadow_denied"); a != 2 || sd != 3 {
			t.Fatalf("shadow: %v allowed, %v shadow denied; want 2 and 3", a, sd)
		}
	})
	t.Run("hits_addend and one denied", func(t *testing.T) {
		five, zero := uint64(5), uint64(0)
		bulk := routeRateLimit{actions: []rlAction{genericKey("bulk", "import")}, hitsAddend: &five}
		peek := routeRateLimit{actions: []rlAction{genericKey("bulk", "import")}, hitsAddend: &zero}
		tiny := actions(genericKey("tiny", "x"))
		if st := s.shouldRateLimit(rateLimitRequest("shop", envoyRequest{}, bulk)).GetStatuses()[0]; st.GetLimitRemaining() != 5 {
			t.Fatalf("a request of 5 hits: %v", st)
		}
		// The tiny limit's only hit, then bulk and tiny together: tiny
		// denies, and bulk's 5 are not spent.
		if rlsStatus(s.shouldRateLimit(rateLimitRequest("shop", envoyRequest{}, tiny))) != 200 {
			t.Fatal("tiny's first hit denied")
		}
		resp := s.shouldRateLimit(rateLimitRequest("shop", envoyRequest{}, bulk, tiny))
		sts := resp.GetStatuses()
		if rlsStatus(resp) != 429 || sts[0].GetCode() != rlsv3.RateLimitResponse_OK || sts[0].GetLimitRemaining() != 5 ||
			sts[1].GetCode() != rlsv3.RateLimitResponse_OVER_LIMIT {
			t.Fatalf("bulk and tiny: %v", resp)
		}
		// A question of 0 hits spends nothing either.
		if st := s.shouldRateLimit(rateLimitRequest("shop", envoyRequest{}, peek)).GetStatuses()[0]; st.GetLimitRemaining() != 5 {
			t.Fatalf("0 hits: %v", st)
		}
		// The request-level hits_addend (Envoy's filter state) applies
		// where a descriptor sets none.
		req := rateLimitRequest("shop", envoyRequest{}, actions(genericKey("bulk", "import")))
		req.HitsAddend = 5
		if st := s.shouldRateLimit(req).GetStatuses()[0]; st.GetLimitRemaining() != 0 || st.GetCode() != rlsv3.RateLimitResponse_OK {
			t.Fatalf("request hits_addend 5: %v", st)
		}
		if rlsStatus(s.shouldRateLimit(rateLimitRequest("shop", envoyRequest{}, actions(genericKey("bulk", "import"))))) != 429 {
			t.Fatal("bulk spent, still admitted")
		}
	})
	t.Run("status fields", func(t *testing.T) {
		eve := envoyRequest{headers: [][2]string{{":path", "/api/x"}, {"x-user", "eve"}}}
		before := redisNow(t, rdb)
		resp := s.shouldRateLimit(rateLimitRequest("shop", eve, routeUser, actions(genericKey("nothing", "here"))))
		after := redisNow(t, rdb)
		st, none := resp.GetStatuses()[0], resp.GetStatuses()[1]
		cl := st.GetCurrentLimit()
		if st.GetCode() != rlsv3.RateLimitResponse_OK || cl.GetName() != "per_user" || cl.GetRequestsPerUnit() != 3 ||
			cl.GetUnit() != rlsv3.RateLimitResponse_RateLimit_HOUR || st.GetLimitRemaining() != 2 {
			t.Fatalf("status %v", st)
		}
		// The reset is the end of the hour, by Redis TIME when the
		// script ran (between the two readings, unless the hour turned
		// between them).
		end := before.Truncate(time.Hour).Add(time.Hour)
		lo, hi := end.Sub(after), end.Sub(before)
		if d := st.GetDurationUntilReset().AsDuration(); after.Before(end) && (d < lo-time.Millisecond || d > hi) {
			t.Fatalf("reset in %v, want within [%v, %v]", d, lo, hi)
		}
		if none.GetCode() != rlsv3.RateLimitResponse_OK || none.GetCurrentLimit() != nil {
			t.Fatalf("unmatched descriptor's status %v", none)
		}
		if resp.GetOverallCode() != rlsv3.RateLimitResponse_OK || headerOf(resp, "ratelimit") == "" {
			t.Fatalf("answer %v", resp)
		}
	})
	t.Run("limit sent by Envoy", func(t *testing.T) {
		l := actions(genericKey("", "anything"))
		l.override = &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 4, Unit: typev3.RateLimitUnit_HOUR}
		if got := admitted(6, rateLimitRequest("shop", envoyRequest{}, l)); got != 4 {
			t.Fatalf("override of 4 an hour: %d of 6 admitted", got)
		}
	})
	if d := s.metric("extauthz_degraded_decisions_total"); d != 0 {
		t.Fatalf("%v decisions made without Redis", d)
	}
}

// Domain files reload with the configuration, on change and on SIGHUP:
// an edited limit applies without losing counts, a new file's domain
// appears, and an invalid file keeps every running limit and names its
// file and field.
func TestRLSReload(t *testing.T) {
	parallel(t)
	const limit = "domain: edge\ndescriptors:\n  - key: remote_address\n    rate_limit: {unit: hour, requests_per_unit: %d}\n"
	section, dir := domainDir(t, map[string]string{"edge.yaml": fmt.Sprintf(limit, 3)})
	s := startSidecar(t, section)
	edge := func(ip string) *rlsv3.RateLimitRequest {
		return rateLimitRequest("edge", envoyRequest{sourceIP: ip}, actions(remoteAddress()))
	}
	admitted := s.rlsAdmitted
	if got := admitted(5, edge("192.0.2.1")); got != 3 {
		t.Fatalf("before: %d admitted, want 3", got)
	}
	writeAtomically(t, filepath.Join(dir, "edge.yaml"), fmt.Sprintf(limit, 6))
	waitMetric(t, s, 10*time.Second, 1, "extauthz_config_reloads_total", "result", "success")
	if got := admitted(5, edge("192.0.2.1")); got != 3 {
		t.Fatalf("after raising the limit to 6: %d more admitted, want 3", got)
	}

	// A new file in the directory: its domain is served.
	if got := admitted(3, rateLimitRequest("api", envoyRequest{}, actions(genericKey("", "x")))); got != 3 {
		t.Fatalf("unknown domain api: %d of 3 admitted, want all", got)
	}
	writeAtomically(t, filepath.Join(dir, "api.yaml"), "domain: api\ndescriptors:\n  - key: generic_key\n    rate_limit: {unit: hour, requests_per_unit: 1}\n")
	waitMetric(t, s, 10*time.Second, 2, "extauthz_config_reloads_total", "result", "success")
	if got := admitted(3, rateLimitRequest("api", envoyRequest{}, actions(genericKey("", "x")))); got != 1 {
		t.Fatalf("domain api: %d of 3 admitted, want 1", got)
	}
	if n := s.metric("extauthz_rls_unknown_domain_requests_total"); n != 3 {
		t.Fatalf("unknown domain requests: %v, want 3", n)
	}

	// An invalid file: refused, the running limits stay, the log names
	// the file and the field.
	writeAtomically(t, filepath.Join(dir, "edge.yaml"), strings.Replace(fmt.Sprintf(limit, 6), "unit: hour", "unit: fortnight", 1))
	waitMetric(t, s, 10*time.Second, 1, "extauthz_config_reloads_total", "result", "failure")
	if got := admitted(2, edge("192.0.2.2")); got != 2 {
		t.Fatalf("after an invalid file: %d admitted", got)
	}
	want := filepath.Join(dir, "edge.yaml") + `: descriptors[0].rate_limit.unit: \"fortnight\" is not a unit`
	if log := s.logs.String(); !strings.Contains(log, want) {
		t.Fatalf("log does not name the file and field (%s):\n%s", want, tail(log, 10))
	}
	if got := admitted(2, edge("192.0.2.1")); got != 0 {
		t.Fatalf("192.0.2.1 spent its 6: %d admitted", got)
	}
	// SIGHUP re-reads: the file is still invalid.
	s.cmd.Process.Signal(syscall.SIGHUP)
	waitMetric(t, s, 10*time.Second, 2, "extauthz_config_reloads_total", "result", "failure")

	// The main configuration names another directory: its files are
	// served, and from then on watched instead.
	other := t.TempDir()
	must(t, os.WriteFile(filepath.Join(other, "edge.yaml"), []byte(fmt.Sprintf(limit, 1)), 0o600))
	main, _ := os.ReadFile(s.config)
	writeAtomically(t, s.config, strings.Replace(string(main), dir, other, 1))
	waitMetric(t, s, 10*time.Second, 3, "extauthz_config_reloads_total", "result", "success")
	if got := admitted(2, edge("192.0.2.3")); got != 1 {
		t.Fatalf("the other directory's limit of 1: %d admitted", got)
	}
	writeAtomically(t, filepath.Join(other, "edge.yaml"), fmt.Sprintf(limit, 3))
	waitMetric(t, s, 10*time.Second, 4, "extauthz_config_reloads_total", "result", "success")
	if got := admitted(3, edge("192.0.2.3")); got != 2 {
		t.Fatalf("after raising the other directory's limit to 3: %d more admitted, want 2", got)
	}
}

// Redis killed under load, at the defaults, through the rate limit
// service: no gRPC error, every answer OK from the fallback, the breaker
// open within 250ms, and then no call waiting on Redis or making a call.
func TestRLSRedisKilledUnderLoad(t *testing.T) {
	serial(t, "the breaker must open within 250ms of the kill and no later decision take half a call timeout (75ms): milliseconds at the breaker's defaults")
	for i, mode := range []string{"redis", "hybrid"} {
		t.Run(mode, func(t *testing.T) {
			srv := testredis.Start(t)
			section, _ := domainDir(t, map[string]string{"edge.yaml": "domain: edge\ndescriptors:\n  - key: remote_address\n    rate_limit: {unit: second, requests_per_unit: 1000000}\n"})
			s := startSidecar(t, defaultsConfig(srv.Addr, mode, section))
			// Each request from an address of its own: a bucket per
			// decision, so every decision reaches Redis until it dies.
			req := func(n int) *rlsv3.RateLimitRequest {
				return rateLimitRequest("edge", envoyRequest{sourceIP: fmt.Sprintf("10.%d.%d.%d", 40+i, n>>8&255, n&255)}, actions(remoteAddress()))
			}
			breakLoaded(t, s, startRLSBackground(s, 16, req), 200, srv.Kill)
			if n := s.metric("extauthz_degraded_decisions_total", "policy", "edge.remote_address", "action", "fallback"); n == 0 {
				t.Fatal("no fallback decisions counted")
			}
			if n := s.metric("extauthz_checks_total", "door", "rls", "outcome", "error"); n != 0 {
				t.Fatalf("%v rate limit calls answered with an error", n)
			}
		})
	}
}

// extauthz check -rls asks the running sidecar and exits 0 when OK, 1
// over the limit; validate names a bad domain file's fault.
func TestRLSCommandLine(t *testing.T) {
	parallel(t)
	section, dir := domainDir(t, map[string]string{"edge.yaml": "domain: edge\ndescriptors:\n  - key: remote_address\n    rate_limit: {unit: hour, requests_per_unit: 1}\n"})
	s := startSidecar(t, section)
	run := func(args ...string) (int, string) {
		out, err := exec.Command(binary, args...).CombinedOutput()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		return code, string(out)
	}
	code, out := run("check", "-addr", s.GRPC, "-rls", "edge", "remote_address=192.0.2.9")
	if code != 0 || !strings.HasPrefix(out, "OK, domain edge\n  descriptor 0 (remote_address=192.0.2.9): OK, limit 1 per hour, 0 remaining") {
		t.Fatalf("first: exit %d\n%s", code, out)
	}
	code, out = run("check", "-addr", s.GRPC, "-rls", "edge", "remote_address=192.0.2.9")
	if code != 1 || !strings.HasPrefix(out, "OVER_LIMIT (Envoy answers 429), domain edge") || !strings.Contains(out, "retry-after: ") {
		t.Fatalf("second: exit %d\n%s", code, out)
	}

	must(t, os.WriteFile(filepath.Join(dir, "bad.yaml"), []byte("domain: bad\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute}\n"), 0o600))
	code, out = run("validate", "-config", s.config)
	want := filepath.Join(dir, "bad.yaml") + ": descriptors[0].rate_limit.requests_per_unit: is required (0 puts every request over the limit)"
	if code != 1 || !strings.Contains(out, want) {
		t.Fatalf("validate: exit %d\n%s\nwant %s", code, out, want)
	}
}

// The metric names made from request values (detailed_metric) are bounded
// per process, not per configuration: every name is a set of series kept
// for the life of the process, so a reload must not open a fresh budget.
// 1,500 values, a SIGHUP on the unchanged files, 1,500 more: still 1,000
// names of their own (the rate limit's own name takes the rest), not
// 1,000 more per reload, as a budget per configuration would allow.
func TestRLSDetailedMetricNamesBoundedAcrossReloads(t *testing.T) {
	parallel(t)
	section, _ := domainDir(t, map[string]string{"detailed.yaml": `
domain: detailed
descriptors:
  - key: device
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 10}
`})
	s := startFastSidecar(t, section)
	names := func() int {
		seen := map[string]bool{}
		for _, m := range s.metrics()["extauthz_decisions_total"].GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "policy" && strings.HasPrefix(l.GetValue(), "detailed.device_") {
					seen[l.GetValue()] = true
				}
			}
		}
		return len(seen)
	}
	device := func(v string) *rlsv3.RateLimitRequest {
		return rateLimitRequest("detailed", envoyRequest{headers: [][2]string{{"x-device", v}}}, actions(requestHeader("x-device", "device")))
	}
	next := 0
	for reload := 0; reload < 3; reload++ {
		if reload > 0 {
			must(t, s.cmd.Process.Signal(syscall.SIGHUP))
			waitMetric(t, s, 10*time.Second, float64(reload), "extauthz_config_reloads_total", "result", "success")
		}
		for range 1500 {
			s.shouldRateLimit(device("d" + strconv.Itoa(next)))
			next++
		}
		if got := names(); got != 1000 {
			t.Fatalf("after %d values and %d reloads: %d names of their own, want 1000", next, reload, got)
		}
	}
	if got := s.metric("extauthz_decisions_total", "policy", "detailed.device"); got != 3*1500-1000 {
		t.Fatalf("decisions under the rate limit's own name: %v, want %d", got, 3*1500-1000)
	}
}

// A *.yaml entry of a domains directory that cannot be followed (a
// dangling symlink, a symlink loop) fails the reload and keeps the running
// domains, as naming that file directly does, rather than leaving it out
// and "succeeding" with its domain gone and unlimited.
func TestRLSUnreadableDomainEntryKeepsTheRunningConfig(t *testing.T) {
	parallel(t)
	const limit = "domain: edge\ndescriptors:\n  - key: remote_address\n    rate_limit: {unit: hour, requests_per_unit: 3}\n"
	section, dir := domainDir(t, map[string]string{"edge.yaml": limit})
	s := startSidecar(t, section)
	edge := func(ip string) *rlsv3.RateLimitRequest {
		return rateLimitRequest("edge", envoyRequest{sourceIP: ip}, actions(remoteAddress()))
	}
	if got := s.rlsAdmitted(2, edge("192.0.2.1")); got != 2 {
		t.Fatalf("before: %d of 2 admitted", got)
	}
	swap := func(target string) {
		tmp := filepath.Join(dir, ".edge.tmp")
		must(t, os.Symlink(target, tmp))
		must(t, os.Rename(tmp, filepath.Join(dir, "edge.yaml")))
	}
	failures := 0
	for _, tc := range []struct {
		name  string
		setup func()
	}{
		{"a dangling symlink", func() { swap(filepath.Join(dir, "missing.yaml")) }},
		{"a symlink loop", func() {
			must(t, os.Symlink(filepath.Join(dir, "edge.yaml"), filepath.Join(dir, "loop.yaml")))
			swap(filepath.Join(dir, "loop.yaml"))
		}},
	} {
		tc.setup()
		must(t, s.cmd.Process.Signal(syscall.SIGHUP))
		failures++
		waitMetric(t, s, 10*time.Second, float64(failures), "extauthz_config_reloads_total", "result", "failure")
		if n := s.metric("extauthz_config_reloads_total", "result", "success"); n != 0 {
			t.Fatalf("%s: %v successful reloads, want none", tc.name, n)
		}
		if !s.logShows(filepath.Join(dir, "edge.yaml")+`\" cannot be read`, 10*time.Second) {
			t.Fatalf("%s: the log does not name edge.yaml:\n%s", tc.name, tail(s.logs.String(), 5))
		}
	}
	// The running limit still holds: one of its 3 is left.
	if got := s.rlsAdmitted(3, edge("192.0.2.1")); got != 1 {
		t.Fatalf("after the failed reloads: %d of 3 admitted, want 1 (edge's limit still running)", got)
	}
}

// A descriptor whose hits_addend no limit can ever grant is told so: its
// Retry-After is the window (nothing shorter is true) and the problem
// detail says it is never admitted, as a Check's does, where it was the
// token bucket's refill time for the whole amount (2,576,980,317 s for
// 2^32−1 hits on 100 a minute) or, near 2^64, 1 s. The limit keeps its
// units for requests that fit.
func TestRLSHitsThatNeverFit(t *testing.T) {
	parallel(t)
	section, _ := domainDir(t, map[string]string{"bulk.yaml": `
domain: bulk
descriptors:
  - key: bulk
    rate_limit: {unit: minute, requests_per_unit: 100, algorithm: token_bucket}
`})
	s := startSidecar(t, section)
	for _, n := range []uint64{101, 1<<32 - 1, math.MaxUint64} {
		resp := s.shouldRateLimit(rateLimitRequest("bulk", envoyRequest{},
			routeRateLimit{actions: []rlAction{genericKey("bulk", "import")}, hitsAddend: &n}))
		if resp.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT {
			t.Fatalf("hits_addend %d: %v, want OVER_LIMIT", n, resp.GetOverallCode())
		}
		if got := headerOf(resp, "retry-after"); got != "60" {
			t.Errorf("hits_addend %d: retry-after %q, want 60 (the window)", n, got)
		}
		if got := resp.GetStatuses()[0].GetDurationUntilReset().AsDuration(); got != time.Minute {
			t.Errorf("hits_addend %d: duration_until_reset %v, want 1m", n, got)
		}
		if body := string(resp.GetRawBody()); !strings.Contains(body, "never admitted") || !strings.Contains(body, "admits at most 100 at once") {
			t.Errorf("hits_addend %d: body %s; want it to say the request is never admitted", n, body)
		}
	}
	if got := s.rlsAdmitted(100, rateLimitRequest("bulk", envoyRequest{}, actions(genericKey("bulk", "import")))); got != 100 {
		t.Fatalf("after the requests that never fit: %d of 100 admitted", got)
	}
}

// '=' joins an entry's key to its value in a partition key, so it is
// escaped in both: the entries a=b:c and a:b=c, each under a limit of 2 a
// minute, count apart (they shared one count before, so the second was
// denied after the first spent 2), and the Redis keys show the spelling.
// An entry without '=' keeps the key it always had
// (internal/rls TestPartitionKeys).
func TestRLSEntriesWithEqualsCountApart(t *testing.T) {
	parallel(t)
	srv := testredis.Start(t)
	section, _ := domainDir(t, map[string]string{"eq.yaml": `
domain: eq
descriptors:
  - {key: a, rate_limit: {unit: minute, requests_per_unit: 2}}
  - {key: "a=b", rate_limit: {unit: minute, requests_per_unit: 2}}
`})
	s := startSidecar(t, defaultsConfig(srv.Addr, "redis", section))
	entry := func(k, v string) *rlsv3.RateLimitRequest {
		return rateLimitRequest("eq", envoyRequest{}, actions(genericKey(k, v)))
	}
	cases := []struct {
		key, value, redisKey string
	}{
		{"a", "b=c", "rl:{rls/eq:a=b%3Dc}:fw"}, // a descriptor counts in a fixed window
		{"a=b", "c", "rl:{rls/eq:a%3Db=c}:fw"},
	}
	for _, c := range cases {
		var got []rlsv3.RateLimitResponse_Code
		for range 3 {
			got = append(got, s.shouldRateLimit(entry(c.key, c.value)).GetOverallCode())
		}
		ok, over := rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT
		if !slices.Equal(got, []rlsv3.RateLimitResponse_Code{ok, ok, over}) {
			t.Fatalf("entry %s:%s, three requests: %v; want its own limit of 2, then a denial", c.key, c.value, got)
		}
	}
	for _, c := range cases {
		if n := srv.Client().Exists(context.Background(), c.redisKey).Val(); n != 1 {
			t.Fatalf("entry %s:%s: no Redis key %s (keys: %v)", c.key, c.value, c.redisKey, srv.Client().Keys(context.Background(), "*").Val())
		}
	}
}

// A RateLimitRequest that does not decode is decided, never answered with
// gRPC's Internal error, which Envoy's ratelimit filter lets through
// (failure_mode_deny is off by default) uncounted: at the shipped defaults
// it is OVER_LIMIT, counted in extauthz_rls_undecodable_requests_total and
// as an error of the rls door. Two inputs reach it: a string that is not
// valid UTF-8 (proto3 forbids it) and a truncated message. With
// rls.on_undecodable: allow it is OK, counted as such. Either way the
// connection decides a valid request after it.
func TestRLSUndecodableRequestIsDecided(t *testing.T) {
	parallel(t)
	section, _ := domainDir(t, map[string]string{"d.yaml": "domain: d\ndescriptors:\n  - {key: user, rate_limit: {unit: minute, requests_per_unit: 100}}\n"})
	valid := rateLimitRequest("d", envoyRequest{headers: [][2]string{{"x-user", "PLACEHOLDER"}}}, actions(requestHeader("x-user", "user")))
	b, err := proto.Marshal(valid)
	must(t, err)
	inputs := map[string][]byte{
		"invalid UTF-8": bytes.Replace(b, []byte("PLACEHOLDER"), []byte("\xff\xfeACEHOLDER"), 1),
		"truncated":     b[:len(b)-3],
	}
	for _, c := range []struct {
		name, config, answer string
		want                 rlsv3.RateLimitResponse_Code
	}{
		{"defaults", section, "over_limit", rlsv3.RateLimitResponse_OVER_LIMIT},
		// The knob under test: an operator who prefers to let such
		// requests through, counted.
		{"allow", strings.Replace(section, "rls: {", "rls: {on_undecodable: allow, ", 1), "ok", rlsv3.RateLimitResponse_OK},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := startSidecar(t, c.config)
			for name, msg := range inputs {
				var resp rlsv3.RateLimitResponse
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				err := s.conn.Invoke(ctx, "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit", msg, &resp, grpc.ForceCodec(rawCodec{}))
				cancel()
				if err != nil {
					t.Fatalf("%s: gRPC error %v, want a decision", name, err)
				}
				if resp.GetOverallCode() != c.want {
					t.Fatalf("%s: %v, want %v", name, resp.GetOverallCode(), c.want)
				}
			}
			if got := s.metric("extauthz_rls_undecodable_requests_total", "answer", c.answer); got != float64(len(inputs)) {
				t.Fatalf("extauthz_rls_undecodable_requests_total{answer=%q} = %v, want %d", c.answer, got, len(inputs))
			}
			if got := s.metric("extauthz_checks_total", "door", "rls", "outcome", "error"); got != float64(len(inputs)) {
				t.Fatalf("extauthz_checks_total{door=rls,outcome=error} = %v, want %d", got, len(inputs))
			}
			if resp := s.shouldRateLimit(valid); resp.GetOverallCode() != rlsv3.RateLimitResponse_OK || len(resp.GetStatuses()) != 1 {
				t.Fatalf("a valid request after the undecodable ones: %v", resp)
			}
		})
	}
}
