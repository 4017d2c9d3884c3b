package tests

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"github.com/redis/go-redis/v9"

	"github.com/extauthz/extauthz/tests/internal/testredis"
)

// clusterConfig is defaultsConfig for a Cluster.
func clusterConfig(c *testredis.Cluster, mode, body string) string {
	return defaultsConfig(strings.Join(c.Addrs(), ", "), mode, body)
}

// The seed scenario against a three-master Redis Cluster, and keys spread
// over every master.
func TestClusterSeedScenarioAndSpread(t *testing.T) {
	parallel(t)
	cluster := testredis.StartCluster(t, 3)
	cc := cluster.Client(t)
	ctx := context.Background()
	for _, mode := range []string{"redis", "hybrid"} {
		t.Run(mode, func(t *testing.T) {
			must(t, cc.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error { return m.FlushAll(ctx).Err() }))
			replicas := startReplicas(t, 3, clusterConfig(cluster, mode, seedPolicy+`
  - {name: per-ip, match: {path_prefix: /ip}, key: [ip], limit: 10, window: 1m}
`))
			results, elapsed := timedDrive(t, replicas, 600, 32, adaOrder)
			assertNoFallback(t, replicas)
			assertAdmitted(t, tally(t, results)[200], 100, 100, time.Minute, elapsed, 1)

			// 300 client IPs: their keys hash to slots on every master.
			tally(t, drive(t, replicas, 300, 16, func(i int) *authv3.CheckRequest {
				return envoyRequest{path: "/ip", sourceIP: fmt.Sprintf("10.9.%d.%d", i/250, i%250)}.build()
			}))
			perMaster := map[string]int64{}
			for _, m := range cluster.Masters {
				n, err := m.Client().DBSize(ctx).Result()
				must(t, err)
				perMaster[m.Addr] = n
			}
			t.Logf("keys per master: %v", perMaster)
			if len(perMaster) != 3 {
				t.Fatalf("saw %d masters", len(perMaster))
			}
			for addr, n := range perMaster {
				if n == 0 {
					t.Fatalf("master %s holds no keys: %v", addr, perMaster)
				}
			}
			assertNoFallback(t, replicas)
		})
	}
}

// The hot key's slot moves to another master while every decision goes to
// Redis: ASK and MOVED are followed, no Check fails, and the limit holds
// exactly across the move.
func TestClusterSlotMigrationUnderLoad(t *testing.T) {
	parallel(t)
	cluster := testredis.StartCluster(t, 3)
	cc := cluster.Client(t)
	ctx := context.Background()
	s := startSidecar(t, clusterConfig(cluster, "redis", seedPolicy))
	key := "rl:{orders:client:ada}"
	slot, err := cc.ClusterKeySlot(ctx, key).Result()
	must(t, err)

	bg := startBackground(s, 8, adaOrder)
	waitCount(t, bg, 50) // the bucket now exists on its master
	src, dst := slotOwner(t, cluster, slot), -1
	for i := range cluster.Masters {
		if i != src {
			dst = i
			break
		}
	}
	migrateSlot(t, cluster, int(slot), src, dst)
	waitCount(t, bg, len(bg.snapshot())+300) // decisions after the move
	samples := bg.halt()

	allowed := 0
	for i, smp := range samples {
		if smp.err != nil {
			t.Fatalf("request %d: gRPC error %v", i, smp.err)
		}
		switch smp.status {
		case 200:
			allowed++
		case 429:
		default:
			t.Fatalf("request %d: status %d", i, smp.status)
		}
	}
	if got := slotOwner(t, cluster, slot); got != dst {
		t.Fatalf("slot %d is on master %d, want %d", slot, got, dst)
	}
	elapsed := samples[len(samples)-1].start.Sub(samples[0].start) + time.Second
	t.Logf("%d decisions across the migration of slot %d from master %d to %d", len(samples), slot, src, dst)
	assertAdmitted(t, allowed, 100, 100, time.Minute, elapsed, 1)
	if d := s.metric("extauthz_degraded_decisions_total"); d != 0 {
		t.Fatalf("%v decisions fell back during the migration", d)
	}
}

// slotOwner returns the index of the master serving slot.
func slotOwner(t *testing.T, c *testredis.Cluster, slot int64) int {
	t.Helper()
	slots, err := c.Masters[0].Client().ClusterSlots(context.Background()).Result()
	must(t, err)
	for _, r := range slots {
		if int64(r.Start) <= slot && slot <= int64(r.End) {
			for i, m := range c.Masters {
				if m.Addr == r.Nodes[0].Addr {
					return i
				}
			}
		}
	}
	t.Fatalf("no master serves slot %d", slot)
	return -1
}

// migrateSlot moves one slot and its keys from master src to master dst,
// the way redis-cli --cluster reshard does: IMPORTING/MIGRATING, MIGRATE
// each key, then assign the slot everywhere. The whole move has 30s and
// 100 rounds of 100 keys: the tests' slots hold a few keys.
func migrateSlot(t *testing.T, c *testredis.Cluster, slot, src, dst int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sc, dc := c.Masters[src].Client(), c.Masters[dst].Client()
	srcID, err := sc.ClusterMyID(ctx).Result()
	must(t, err)
	dstID, err := dc.ClusterMyID(ctx).Result()
	must(t, err)
	must(t, dc.Do(ctx, "CLUSTER", "SETSLOT", slot, "IMPORTING", srcID).Err())
	must(t, sc.Do(ctx, "CLUSTER", "SETSLOT", slot, "MIGRATING", dstID).Err())
	host, port, _ := strings.Cut(c.Masters[dst].Addr, ":")
	for round := 0; ; round++ {
		if round == 100 {
			t.Fatalf("slot %d still holds keys after 100 rounds of MIGRATE", slot)
		}
		keys, err := sc.ClusterGetKeysInSlot(ctx, slot, 100).Result()
		must(t, err)
		if len(keys) == 0 {
			break
		}
		for _, k := range keys {
			must(t, sc.Migrate(ctx, host, port, k, 0, 5*time.Second).Err())
		}
	}
	for _, m := range c.Masters {
		must(t, m.Client().Do(ctx, "CLUSTER", "SETSLOT", slot, "NODE", dstID).Err())
	}
}

// A master killed mid-run, at the defaults: no gRPC error, every decision
// a 200 (keys on the dead master by on_redis_error, the rest by Redis),
// and no decision waiting out a Redis timeout once the dead master is
// known. (The breaker covers the whole store; whether it opens depends on
// which master holds the heartbeat key: per-master health is future
// work.)
func TestClusterMasterKilledMidRun(t *testing.T) {
	serial(t, "no decision may wait out a Redis call timeout (150ms) a second after the kill: milliseconds at the breaker's defaults")
	cluster := testredis.StartCluster(t, 3)
	s := startSidecar(t, clusterConfig(cluster, "hybrid", perIPPolicy))
	bg := startBackground(s, 16, perIPRequest(2))
	waitCount(t, bg, 300)
	cluster.Masters[1].Kill()
	killedAt := time.Now()
	waitCount(t, bg, len(bg.snapshot())+1000)
	samples := bg.halt()
	var slow int
	for i, smp := range samples {
		if smp.err != nil || smp.status != 200 {
			t.Errorf("sample %d, %v after the kill: status %d, error %v, latency %v", i, smp.start.Sub(killedAt), smp.status, smp.err, smp.latency)
		}
		if smp.start.After(killedAt.Add(time.Second)) && smp.latency >= defaultRedisTimeout {
			slow++
		}
	}
	if s.metric("extauthz_degraded_decisions_total", "action", "fallback") == 0 {
		t.Fatal("no fallback decisions counted")
	}
	if slow > 0 {
		t.Fatalf("%d decisions waited a Redis timeout more than a second after the master died", slow)
	}
}
