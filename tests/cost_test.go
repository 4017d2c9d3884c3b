package tests

import (
	"fmt"
	"strconv"
	"testing"
	"time"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"

	"github.com/extauthz/extauthz/tests/internal/testredis"
)

// costPolicies gives each mode the seed limit, 100 per minute per client,
// with each request's cost read from the x-cost header (as a trusted
// filter in front of the sidecar would set it).
const costPolicies = `
clients:
  keys: [{id: ada, key: key-ada}, {id: bob, key: key-bob}]
policies:
  - {name: local, match: {path_prefix: /local}, key: [client], limit: 100, window: 1m, mode: local, cost: {header: x-cost}}
  - {name: redis, match: {path_prefix: /redis}, key: [client], limit: 100, window: 1m, mode: redis, cost: {header: x-cost}}
  - {name: hybrid, match: {path_prefix: /hybrid}, key: [client], limit: 100, window: 1m, mode: hybrid, cost: {header: x-cost}}
`

// costRequest asks for path with cost, as ada unless another key is
// given; cost "" sends no x-cost header.
func costRequest(path, cost string, key ...string) *authv3.CheckRequest {
	h := [][2]string{{"x-api-key", "key-ada"}}
	if len(key) > 0 {
		h[0][1] = key[0]
	}
	if cost != "" {
		h = append(h, [2]string{"x-cost", cost})
	}
	return envoyRequest{method: "POST", path: path, headers: h}.build()
}

// Costs across three replicas stay exact: 600 requests of costs 1, 2, 3,
// 4 in turn, round robin and 60 at a time, spend exactly the 100 units of
// the limit (plus what refilled during the run) in redis and hybrid mode,
// and 100 units per replica in local mode, where each counts alone. A
// request costing more than the bucket holds is denied up front with a
// detail saying so; a malformed cost is charged the default and counted.
func TestCostsAcrossReplicasStayExact(t *testing.T) {
	parallel(t)
	srv := testredis.Start(t)
	// No wait for the replicas to count each other: exactness is
	// Redis's, whatever slices the peer count a replica has seen sizes.
	replicas := startReplicas(t, 3, defaultsConfig(srv.Addr, "hybrid", costPolicies))
	cost := func(i int) int64 { return int64(i%4) + 1 }
	for _, mode := range []string{"local", "redis", "hybrid"} {
		t.Run(mode, func(t *testing.T) {
			results, elapsed := timedDrive(t, replicas, seedBurst, seedConcurrency, func(i int) *authv3.CheckRequest {
				return costRequest("/"+mode, strconv.FormatInt(cost(i), 10))
			})
			counts := tally(t, results)
			if counts[200]+counts[429] != seedBurst {
				t.Fatalf("statuses = %v", counts)
			}
			spent := make([]int, len(replicas))
			for i, r := range results {
				if httpStatus(r.resp) == 200 {
					spent[r.replica] += int(cost(i))
				}
			}
			if mode == "local" {
				for i, units := range spent {
					t.Logf("replica %d:", i)
					assertAdmitted(t, units, 100, 100, time.Minute, elapsed, 1)
				}
				return
			}
			// Exactness is Redis's: first make sure no replica decided
			// without it (a breaker opened on a starved machine).
			assertNoFallback(t, replicas)
			assertAdmitted(t, spent[0]+spent[1]+spent[2], 100, 100, time.Minute, elapsed, 1)
		})
	}
	t.Run("above the burst", func(t *testing.T) {
		for _, mode := range []string{"local", "redis", "hybrid"} {
			resp := replicas[0].check(costRequest("/"+mode, "101"))
			p := problemBody(t, resp)
			want := "This request costs 101 units; policy " + mode + " admits at most 100 at once, so it is never admitted as sent."
			if httpStatus(resp) != 429 || p["detail"] != want {
				t.Fatalf("%s: %d %v, want 429 with detail %q", mode, httpStatus(resp), p, want)
			}
		}
	})
	t.Run("malformed cost", func(t *testing.T) {
		s := replicas[1]
		for _, mode := range []string{"local", "redis", "hybrid"} {
			before := s.metric("extauthz_cost_defaulted_total", "policy", mode, "reason", "malformed")
			// Bob's bucket is full: the default, 1 unit, is charged
			// (never nothing), as the remaining count says.
			resp := s.check(costRequest("/"+mode, "lots", "key-bob"))
			if h := okHeaders(resp); httpStatus(resp) != 200 || h["ratelimit"] != fmt.Sprintf(`"%s";r=99;t=1`, mode) {
				t.Fatalf("%s: malformed cost: %d %v, want allowed with 99 left", mode, httpStatus(resp), h)
			}
			if got := s.metric("extauthz_cost_defaulted_total", "policy", mode, "reason", "malformed"); got != before+1 {
				t.Fatalf("%s: cost_defaulted_total{reason=malformed} = %v, want %v", mode, got, before+1)
			}
		}
	})
}
