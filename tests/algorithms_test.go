package tests

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"github.com/redis/go-redis/v9"

	"github.com/extauthz/extauthz/internal/testredis"
)

// algorithmPolicies gives each algorithm a policy of its own, named after
// it and matched by path, so one set of replicas serves every algorithm.
//
// The counting algorithms have limit 100 per hour. A 600-request run takes
// well under a second, so a token bucket refills nothing during it (one
// token per 36s) and a sliding log forgets nothing. Fixed and sliding
// windows start on the hour: a run that straddles one (a fraction of a
// second in an hour) would legitimately admit more, so the test reads
// Redis TIME around each run and repeats it under another client's key if
// it crossed a boundary.
//
// The leaky bucket shapes instead: 100 per 10s is a slot every 100ms, and
// with max_delay 150ms a burst passes 1 + ⌊150/100⌋ = 2 at once, then one
// per slot while the run lasts.
const algorithmPolicies = `
clients:
  keys:
    - {id: ada, key: key-ada}
    - {id: bob, key: key-bob}
policies:
  - {name: token_bucket, match: {path_prefix: /token_bucket}, key: [client], limit: 100, window: 1h}
  - {name: sliding_window, match: {path_prefix: /sliding_window}, key: [client], limit: 100, window: 1h, algorithm: sliding_window}
  - {name: fixed_window, match: {path_prefix: /fixed_window}, key: [client], limit: 100, window: 1h, algorithm: fixed_window}
  - {name: sliding_log, match: {path_prefix: /sliding_log}, key: [client], limit: 100, window: 1h, algorithm: sliding_log}
  - {name: leaky_bucket, match: {path_prefix: /leaky_bucket}, key: [client], limit: 100, window: 10s, algorithm: leaky_bucket, max_delay: 150ms}
`

func algorithmRequest(alg, key string) func(int) *authv3.CheckRequest {
	return func(int) *authv3.CheckRequest {
		return envoyRequest{method: "POST", path: "/" + alg + "/orders", headers: [][2]string{{"x-api-key", key}}}.build()
	}
}

// redisNow reads Redis TIME: the clock every script decides by.
func redisNow(t *testing.T, rdb *redis.Client) time.Time {
	t.Helper()
	now, err := rdb.Time(context.Background()).Result()
	if err != nil {
		t.Fatal(err)
	}
	return now
}

// Every algorithm, three replicas sharing one Redis, 600 requests round
// robin in parallel: exactly 100 admitted (redis mode: one script per
// decision; hybrid mode: leased token-bucket slices, the exact script for
// the others).
func TestAlgorithmsSharedRedis(t *testing.T) {
	for _, mode := range []string{"redis", "hybrid"} {
		t.Run(mode, func(t *testing.T) {
			srv := testredis.Start(t)
			rdb := srv.Client()
			// redis.timeout 2s rather than the tests' usual 200ms: this test
			// is about the algorithms' counts, and on a loaded machine a
			// slow call would fall back to local shares (which admit more,
			// by design). degradedDecisions checks that none did.
			cfg := fmt.Sprintf("redis: {addrs: [%s], timeout: 2s}\ndefault_mode: %s\nlocal: {slice_idle: 200ms}\n%s", srv.Addr, mode, algorithmPolicies)
			replicas := startReplicas(t, 3, cfg)
			waitPeers(t, replicas, 3)
			for _, alg := range []string{"token_bucket", "sliding_window", "fixed_window", "sliding_log"} {
				t.Run(alg, func(t *testing.T) {
					for attempt, client := range []string{"ada", "bob"} {
						before := redisNow(t, rdb)
						results, elapsed := timedDrive(t, replicas, 600, 32, algorithmRequest(alg, "key-"+client))
						after := redisNow(t, rdb)
						if before.Truncate(time.Hour) != after.Truncate(time.Hour) && attempt == 0 {
							t.Logf("the run crossed the hour at %v: the window turned; again with another key", after.Truncate(time.Hour))
							continue
						}
						counts := tally(t, results)
						if counts[200]+counts[429] != 600 {
							t.Fatalf("statuses = %v", counts)
						}
						// Only the token bucket refills within the hour: one
						// token per 36s of run (none, in practice).
						buckets := 0
						if alg == "token_bucket" {
							buckets = 1
						}
						assertAdmitted(t, counts[200], 100, 100, time.Hour, elapsed, buckets)
						assert429s(t, results, alg, 3600)
						assertKeyExpires(t, rdb, alg, client, time.Hour)
						return
					}
				})
			}
			t.Run("leaky_bucket", func(t *testing.T) { testLeakyBucketShapes(t, replicas, rdb) })
			var degraded float64
			for _, r := range replicas {
				degraded += r.metric("extauthz_degraded_decisions_total")
			}
			if degraded != 0 {
				t.Fatalf("%v decisions were made without Redis: the counts above are not the algorithms'", degraded)
			}
		})
	}
}

// assert429s checks the denials: RateLimit-Policy names the policy, and
// Retry-After, in whole seconds, equals RateLimit's t.
func assert429s(t *testing.T, results []result, policy string, window int) {
	t.Helper()
	for _, r := range results {
		if httpStatus(r.resp) != 429 {
			continue
		}
		h := deniedHeaders(r.resp)
		retry, err := strconv.Atoi(h["retry-after"])
		if err != nil || retry < 1 || h["ratelimit-policy"] != fmt.Sprintf(`"%s";q=100;w=%d`, policy, window) ||
			h["ratelimit"] != fmt.Sprintf(`"%s";r=0;t=%d`, policy, retry) {
			t.Fatalf("429 headers = %v", h)
		}
	}
}

// assertKeyExpires checks that the policy's state is one hash-tagged key
// with a TTL no longer than it needs.
func assertKeyExpires(t *testing.T, rdb *redis.Client, alg, client string, window time.Duration) {
	t.Helper()
	suffix := map[string]string{"token_bucket": "", "sliding_window": ":sw", "fixed_window": ":fw", "sliding_log": ":log", "leaky_bucket": ":lb"}[alg]
	key := fmt.Sprintf("rl:{%s:client:%s}%s", alg, client, suffix)
	ttl := rdb.PTTL(context.Background(), key).Val()
	// A sliding window's count weighs on the next window too.
	if ttl <= 0 || ttl > 2*window+time.Second {
		keys := rdb.Keys(context.Background(), "rl:*").Val()
		t.Fatalf("%s: PTTL %v, want (0, %v]; keys: %v", key, ttl, 2*window, keys)
	}
}

// The leaky bucket across three replicas: a burst admits 1 + ⌊max_delay /
// interval⌋ at once and then one per interval, and the OKs reach the
// callers spaced by the interval: the replicas hold each admitted request
// until its slot, computed by Redis for all of them.
func testLeakyBucketShapes(t *testing.T, replicas []*sidecar, rdb *redis.Client) {
	const interval, maxDelay = 100 * time.Millisecond, 150 * time.Millisecond
	start := time.Now()
	results := drive(t, replicas, 600, 32, algorithmRequest("leaky_bucket", "key-ada"))
	elapsed := time.Since(start)
	var released []time.Time
	var slowest time.Duration
	for _, s := range results {
		if s.err == nil && httpStatus(s.resp) == 200 {
			released = append(released, s.done)
			slowest = max(slowest, s.latency)
		}
	}
	counts := tally(t, results)
	if counts[200]+counts[429] != 600 {
		t.Fatalf("statuses = %v", counts)
	}
	// 2 at once, plus one per 100ms the run lasted.
	assertAdmitted(t, counts[200], 1+int(maxDelay/interval), 100, 10*time.Second, elapsed, 1)
	assert429s(t, results, "leaky_bucket", 10)
	slices.SortFunc(released, func(a, b time.Time) int { return a.Compare(b) })
	var gaps []time.Duration
	var shown []string
	for k := 1; k < len(released); k++ {
		gaps = append(gaps, released[k].Sub(released[k-1]))
		shown = append(shown, gaps[k-1].Round(time.Millisecond).String())
	}
	t.Logf("OKs released at intervals %s; slowest OK %v (max_delay %v)", strings.Join(shown, " "), slowest.Round(time.Millisecond), maxDelay)
	// Held requests leave one slot apart; unshaped, they would all leave
	// at once. Timers never fire early, but each answer also carries its
	// own scheduling and network time, so single gaps jitter: check the
	// spread of all releases (allowing 60ms of jitter at its two ends)
	// and the median gap.
	if spread, want := released[len(released)-1].Sub(released[0]), time.Duration(len(released)-1)*interval; spread < want-60*time.Millisecond {
		t.Fatalf("%d OKs released within %v; shaping at one per %v wants about %v", len(released), spread, interval, want)
	}
	slices.Sort(gaps)
	if median := gaps[len(gaps)/2]; median < interval/2 {
		t.Fatalf("median gap between OKs %v; shaping wants %v", median, interval)
	}
	if slowest > 3*time.Second {
		t.Fatalf("an OK took %v; holds are bounded by max_delay %v", slowest, maxDelay)
	}
	assertKeyExpires(t, rdb, "leaky_bucket", "ada", 10*time.Second)
}
