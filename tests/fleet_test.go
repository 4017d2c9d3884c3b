package tests

// The fleet driver (tests/internal/fleet): many simulated sidecars against
// one real Redis, measuring what a fleet costs it. `make bench-fleet`
// prints the larger table of docs/capacity.md. It lives in this package,
// not one of its own, and in its parallel group, so that it never runs
// beside the serial, timing-sensitive end-to-end tests here (which run
// alone, before it): a hundred sidecars under the race detector take a
// good part of a 2-core machine.

import (
	"context"
	"testing"
	"time"

	"github.com/extauthz/extauthz/internal/quota"
	"github.com/extauthz/extauthz/tests/internal/fleet"
	"github.com/extauthz/extauthz/tests/internal/testredis"
)

// fleetReplicas and fleetRate are the test's fleet: a hundred sidecars at
// five decisions a second each, over 100,000 keys drawn Zipf(1.1), at the
// shipped defaults (redis.pool_size 4, fallback.peer_ttl 15s).
const (
	fleetReplicas = 100
	fleetRate     = 5
	fleetMeasured = 4 * time.Second
	fleetIdle     = 3 * time.Second
)

// A hundred sidecars on one standalone Redis, in each mode. The claims
// (docs/capacity.md):
//   - connections: one per sidecar for decisions, which are
//     autopipelined, and one more for the breaker's probes once it has
//     had a suspicion: at most two per sidecar, idle or loaded (go-redis's
//     default pools held six per sidecar idle);
//   - Redis calls: one script call per decision in redis mode, one more
//     only after a call failed, plus each sidecar's heartbeat once a
//     second; hybrid never more than that;
//   - heartbeats: once a second per sidecar in a fleet of at most
//     HeartbeatBudget (200).
func TestFleetOfAHundredOnStandaloneRedis(t *testing.T) {
	parallel(t)
	for _, mode := range []string{"redis", "hybrid"} {
		t.Run(mode, func(t *testing.T) {
			// A server per mode: each run starts from no buckets.
			srv := testredis.Start(t)
			res, err := fleet.Run(context.Background(), fleet.Options{
				Addrs: []string{srv.Addr}, Replicas: fleetReplicas, Mode: mode,
				Keys: 100_000, ZipfS: 1.1, Rate: fleetRate,
				Limit:  quota.Limit{Limit: 100, Window: time.Minute, OnError: quota.ErrorFallback},
				Warmup: 2 * time.Second, Duration: fleetMeasured, Idle: fleetIdle, MemoryKeys: 2000,
			})
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("%s: %d sidecars, %d decisions (%.0f/s, %d degraded, %d skipped); Redis calls per decision %.3f (decisions' own %.3f; %d failed); calls p50 %v p99 %v; connections %d idle, %d loaded; Redis %.0f script calls/s, %.3f cores (%.3f with no client); %.0f B per key (%.0f B its value; %d live keys at the end of the load); heartbeats %.0f/s",
				mode, fleetReplicas, res.Decisions, res.PerSecond, res.Degraded, res.Skipped, res.CallsPerDec, res.DecCallsPer, res.FailedCalls,
				res.CallP50, res.CallP99, res.ClientsIdle, res.Clients, res.ScriptCalls, res.CPU, res.BaselineCPU,
				res.MemoryPerKey, res.KeyBytes, res.Keys, res.HeartbeatsPerSec)
			t.Logf("%s: calls by operation %v", mode, res.Calls)

			if res.Decisions < fleetReplicas*fleetRate*int64(fleetMeasured/time.Second)/2 {
				t.Fatalf("%d decisions in %v: under half the %d a second asked for; the figures below mean little", res.Decisions, fleetMeasured, fleetReplicas*fleetRate)
			}
			if limit := 2 * fleetReplicas; res.ClientsIdle > limit || res.Clients > limit {
				t.Errorf("Redis counts %d connections idle and %d under load from %d sidecars; want at most %d (two each)", res.ClientsIdle, res.Clients, fleetReplicas, limit)
			}
			// The bound on calls, from the claim: a call per decision,
			// one more per failed call, a heartbeat per sidecar per second
			// (and one more for the second it straddles), and the
			// decisions in flight at either end of the measured phase
			// (four per sidecar at most), whose calls may fall inside it.
			seconds := int64(fleetMeasured / time.Second)
			bound := res.Decisions + res.FailedCalls + fleetReplicas*(seconds+1) + fleetReplicas*4
			if calls := int64(res.CallsPerDec * float64(res.Decisions)); calls > bound {
				t.Errorf("%d Redis calls for %d decisions; the claim allows %d", calls, res.Decisions, bound)
			}
			idleSeconds := fleetIdle.Seconds()
			if beats := res.HeartbeatsPerSec; beats > fleetReplicas*(1+1/idleSeconds) {
				t.Errorf("%.0f heartbeats a second from %d sidecars; want one each a second", beats, fleetReplicas)
			}
		})
	}
}
