package tests

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/extauthz/extauthz/internal/testredis"
)

// redisConfig is a configuration with a redis section and mode as the
// default mode, followed by body. Its timeout is long: these tests are
// about exactness, and a busy test machine must not push decisions into
// fallback (outage_test.go tests short timeouts).
func redisConfig(addr, mode, body string) string {
	return fmt.Sprintf("redis: {addrs: [%s], timeout: 2s}\ndefault_mode: %s\nlocal: {slice_idle: 200ms}\n%s", addr, mode, body)
}

func startReplicas(t *testing.T, n int, cfg string) []*sidecar {
	t.Helper()
	var out []*sidecar
	for i := 0; i < n; i++ {
		out = append(out, startSidecar(t, cfg))
	}
	return out
}

// assertNoFallback fails the test when any replica decided without Redis:
// exactness claims only hold for decisions Redis made.
func assertNoFallback(t *testing.T, replicas []*sidecar) {
	t.Helper()
	for _, r := range replicas {
		if d := r.metric("extauthz_degraded_decisions_total"); d != 0 {
			t.Fatalf("replica %s made %v decisions without Redis (timeouts?)", r.GRPC, d)
		}
	}
}

// waitPeers waits until every replica has observed n peers through Redis,
// so hybrid slices are sized for the real replica count.
func waitPeers(t *testing.T, replicas []*sidecar, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for _, r := range replicas {
		for r.metric("extauthz_peers") != float64(n) {
			if time.Now().After(deadline) {
				t.Fatalf("replica %s sees %v peers, want %d", r.GRPC, r.metric("extauthz_peers"), n)
			}
			time.Sleep(20 * time.Millisecond) // heartbeats run once a second
		}
	}
}

// The seed scenario: limit 100 per minute, three replicas sharing one
// Redis, 600 requests round robin in parallel: exactly 100 allowed in redis
// mode and in hybrid mode.
func TestSeedScenarioSharedRedis(t *testing.T) {
	for _, mode := range []string{"redis", "hybrid"} {
		t.Run(mode, func(t *testing.T) {
			srv := testredis.Start(t)
			replicas := startReplicas(t, 3, redisConfig(srv.Addr, mode, seedPolicy))
			waitPeers(t, replicas, 3)
			results, elapsed := timedDrive(t, replicas, 600, 32, adaOrder)
			counts := tally(t, results)
			if counts[200]+counts[429] != 600 {
				t.Fatalf("statuses = %v", counts)
			}
			assertNoFallback(t, replicas)
			assertAdmitted(t, counts[200], 100, 100, time.Minute, elapsed, 1)
			for _, r := range results {
				if httpStatus(r.resp) == 429 {
					h := deniedHeaders(r.resp)
					if h["ratelimit-policy"] != `"orders";q=100;w=60` || h["retry-after"] == "" || h["ratelimit"] == "" {
						t.Fatalf("429 headers = %v", h)
					}
				}
			}
			var decided float64
			for _, r := range replicas {
				decided += r.metric("extauthz_decisions_total", "policy", "orders", "mode", mode, "result", "allowed")
			}
			if decided != float64(counts[200]) {
				t.Fatalf("replicas count %v allowed decisions, responses %d", decided, counts[200])
			}
		})
	}
}

// A deliberately naive limiter, GET then INCR from three clients, under the
// same load: it admits more than the limit, because requests read the
// count between another's read and its increment. This is the race the
// scripts close.
func TestNaiveGetThenIncrRace(t *testing.T) {
	srv := testredis.Start(t)
	ctx := context.Background()
	clients := []*redis.Client{srv.Client(), srv.Client(), srv.Client()}
	var admitted atomic.Int64
	var wg sync.WaitGroup
	start := make(chan struct{})
	// The 600 requests arrive together, as a burst does; each reads the
	// count and, when it is under the limit, increments it.
	for i := 0; i < 600; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			c := clients[i%3]
			n, err := c.Get(ctx, "naive:ada").Int64()
			if err != nil && err != redis.Nil {
				t.Error(err)
				return
			}
			if n < 100 {
				c.Incr(ctx, "naive:ada")
				admitted.Add(1)
			}
		}()
	}
	close(start)
	wg.Wait()
	t.Logf("naive GET-then-INCR admitted %d of 600 against a limit of 100", admitted.Load())
	if admitted.Load() <= 100 {
		t.Fatalf("naive limiter admitted %d: the race did not show this run", admitted.Load())
	}
}

// A busy key far from its limit makes few Redis calls: at most 10 per
// 1,000 decisions, counted by Redis itself (INFO commandstats).
//
// The figure depends on how busy the key is (a slice covers about 100ms of
// its traffic), so this test runs the binary built without the race
// detector, at a realistic rate.
func TestHybridRedisCallsPerThousand(t *testing.T) {
	srv := testredis.Start(t)
	cfg := redisConfig(srv.Addr, "hybrid", `
clients:
  keys: [{id: ada, key: key-ada}]
policies:
  - {name: busy, key: [client], limit: 100000000, window: 1m}
`)
	replicas := []*sidecar{startFastSidecar(t, cfg), startFastSidecar(t, cfg), startFastSidecar(t, cfg)}
	waitPeers(t, replicas, 3)
	rdb := srv.Client()
	ctx := context.Background()
	key := []string{"-H", "x-api-key: key-ada"}
	runLoadgen(t, replicas, 5000, 48, key...) // warm up: rates are learnt
	before := srv.CommandCalls(ctx, rdb)
	const n = 60_000
	res := runLoadgen(t, replicas, n, 48, key...)
	after := srv.CommandCalls(ctx, rdb)
	if res.Statuses["200"] != n {
		t.Fatalf("statuses = %v", res.Statuses)
	}
	calls := (after["evalsha"] + after["eval"]) - (before["evalsha"] + before["eval"])
	perThousand := float64(calls) / (n / 1000)
	t.Logf("%d decisions in %v (%.0f per second per replica): %d script calls, %.1f per 1,000 (heartbeats included)",
		n, res.Elapsed.Round(time.Millisecond), res.Throughput/3, calls, perThousand)
	if perThousand > 10 {
		t.Fatalf("%.1f Redis calls per 1,000 decisions; want at most 10", perThousand)
	}
}

// After traffic stops, unspent slices go back: the bucket is full again
// (its key gone) within the idle time plus the refill time.
func TestHybridUnspentTokensComeBack(t *testing.T) {
	srv := testredis.Start(t)
	replicas := startReplicas(t, 3, redisConfig(srv.Addr, "hybrid", ordersFor("limit: 1000, window: 10s")))
	waitPeers(t, replicas, 3)
	rdb := srv.Client()
	ctx := context.Background()
	counts := tally(t, drive(t, replicas, 300, 16, adaOrder))
	if counts[200] != 300 {
		t.Fatalf("statuses = %v", counts)
	}
	key := "rl:{orders:client:ada}"
	used, err := rdb.HGet(ctx, key, "used").Float64()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("right after the traffic Redis counts %.1f tokens in use for 300 admitted", used)
	// 300 spent refill in 3s; slices idle out after 200ms. Allow a
	// generous margin: real time is the point here.
	deadline := time.Now().Add(3*time.Second + 200*time.Millisecond + 5*time.Second)
	for rdb.Exists(ctx, key).Val() == 1 {
		if time.Now().After(deadline) {
			u, _ := rdb.HGet(ctx, key, "used").Float64()
			t.Fatalf("bucket not full after idle time plus refill: %.2f tokens in use", u)
		}
		time.Sleep(50 * time.Millisecond) // waiting on real time: refill and idle sweeps
	}
	var returned float64
	for _, r := range replicas {
		returned += r.metric("extauthz_hybrid_tokens_returned_total")
	}
	if used > 300.5 && returned == 0 {
		t.Fatalf("%.1f tokens were leased beyond the 300 spent, but none were returned", used-300)
	}
}

// SIGTERM gives a replica's unspent tokens back to Redis.
func TestHybridShutdownReturnsTokens(t *testing.T) {
	srv := testredis.Start(t)
	s := startSidecar(t, redisConfig(srv.Addr, "hybrid", ordersFor("limit: 10000, window: 1000h")))
	rdb := srv.Client()
	ctx := context.Background()
	tally(t, drive(t, []*sidecar{s}, 500, 16, adaOrder))
	key := "rl:{orders:client:ada}"
	before, _ := rdb.HGet(ctx, key, "used").Float64()
	if err := s.stop(); err != nil {
		t.Fatal(err)
	}
	after, _ := rdb.HGet(ctx, key, "used").Float64()
	t.Logf("tokens in use: %.2f while running, %.2f after SIGTERM (500 spent)", before, after)
	if after < 499.9 || after > 500.1 {
		t.Fatalf("after shutdown Redis counts %.2f tokens in use, want the 500 spent", after)
	}
}
