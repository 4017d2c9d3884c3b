package tests

import (
	"fmt"
	"os/exec"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/extauthz/extauthz/tests/internal/testredis"
)

// The tests in this file run what users run: the shipped defaults (no
// redis.timeout, no slice_idle, no fallback section), replicas started one
// after another and loaded at once, as a Kubernetes rollout does, with no
// waiting for them to see each other. Every exactness claim of docs/modes.md
// has its twin here.

// defaultsConfig is a configuration with only what a user must write: the
// Redis address and the mode.
func defaultsConfig(addr, mode, body string) string {
	return fmt.Sprintf("redis: {addrs: [%s]}\ndefault_mode: %s\n%s", addr, mode, body)
}

// seedAlgorithms gives each algorithm the seed limit, 100 per minute,
// under a policy named after it and matched by path, so one set of
// replicas serves every algorithm.
//
// The leaky bucket shapes instead: 100 per 10s is a slot every 100ms, and
// with max_delay 150ms a burst passes 1 + ⌊150/100⌋ = 2 at once, then one
// per slot while the run lasts.
const seedAlgorithms = `
clients:
  keys:
    - {id: ada, key: key-ada}
    - {id: bob, key: key-bob}
    - {id: cyd, key: key-cyd}
policies:
  - {name: token_bucket, match: {path_prefix: /token_bucket}, key: [client], limit: 100, window: 1m}
  - {name: sliding_window, match: {path_prefix: /sliding_window}, key: [client], limit: 100, window: 1m, algorithm: sliding_window}
  - {name: fixed_window, match: {path_prefix: /fixed_window}, key: [client], limit: 100, window: 1m, algorithm: fixed_window}
  - {name: sliding_log, match: {path_prefix: /sliding_log}, key: [client], limit: 100, window: 1m, algorithm: sliding_log}
  - {name: leaky_bucket, match: {path_prefix: /leaky_bucket}, key: [client], limit: 100, window: 10s, algorithm: leaky_bucket, max_delay: 150ms}
`

var countingAlgorithms = []string{"token_bucket", "sliding_window", "fixed_window", "sliding_log"}

// seedBurst is the seed scenario the shipped defaults are held to: 600
// requests, 60 at a time, round robin over the replicas.
const seedBurst, seedConcurrency = 600, 60

// assertSeedExact runs the seed burst for one algorithm and checks that the
// replicas admitted exactly the limit: 100, plus for the token bucket what
// refilled while the run lasted (one token per 600ms of measured run time,
// never more than 2). Fixed and sliding windows start on the minute: a run
// that straddles one would legitimately admit more, so the run is repeated
// under another client's key when Redis TIME says it crossed a boundary.
// The 429s carry the policy's headers, the replicas' metrics count what
// the responses say, and the policy's state in Redis expires on its own.
func assertSeedExact(t *testing.T, replicas []*sidecar, rdb *redis.Client, alg string) {
	t.Helper()
	for attempt, client := range []string{"ada", "bob", "cyd"} {
		allowedBefore := allowedDecisions(replicas, alg)
		before := redisNow(t, rdb)
		results, elapsed := timedDrive(t, replicas, seedBurst, seedConcurrency, algorithmRequest(alg, "key-"+client))
		after := redisNow(t, rdb)
		if alg != "token_bucket" && alg != "sliding_log" && before.Truncate(time.Minute) != after.Truncate(time.Minute) && attempt < 2 {
			t.Logf("the run crossed the minute at %v: the window turned; again with another key", after.Truncate(time.Minute))
			continue
		}
		counts := tally(t, results)
		if counts[200]+counts[429] != seedBurst {
			t.Fatalf("statuses = %v", counts)
		}
		buckets := 0
		if alg == "token_bucket" {
			buckets = 1
		}
		assertAdmitted(t, counts[200], 100, 100, time.Minute, elapsed, buckets)
		if counts[200] > 102 {
			t.Fatalf("admitted %d: more than 2 over the limit is never refill in a seed run", counts[200])
		}
		assert429s(t, results, alg, 60)
		if got := allowedDecisions(replicas, alg) - allowedBefore; got != float64(counts[200]) {
			t.Fatalf("replicas count %v allowed decisions, responses %d", got, counts[200])
		}
		assertKeyExpires(t, rdb, alg, client, time.Minute, after)
		return
	}
}

// allowedDecisions sums the replicas' allowed decisions of a policy.
func allowedDecisions(replicas []*sidecar, policy string) float64 {
	var n float64
	for _, r := range replicas {
		n += r.metric("extauthz_decisions_total", "policy", policy, "result", "allowed")
	}
	return n
}

// assertNotDegraded fails the test when any replica decided without Redis
// or marked it down: at the defaults, a busy or throttled replica must
// neither open its breaker nor fall back.
func assertNotDegraded(t *testing.T, replicas []*sidecar) {
	t.Helper()
	for _, r := range replicas {
		mfs := r.metrics()
		if _, ok := mfs["extauthz_redis_breaker_opened_total"]; !ok {
			t.Fatalf("replica %s exports no extauthz_redis_breaker_opened_total", r.GRPC)
		}
		for _, name := range []string{"extauthz_degraded_decisions_total", "extauthz_redis_breaker_opened_total"} {
			if n := sumMetric(mfs, name); n != 0 {
				t.Errorf("replica %s: %s = %v, want 0", r.GRPC, name, n)
			}
		}
	}
}

// The seed scenario at the shipped defaults, in redis and hybrid mode, for
// every algorithm: the counting ones admit exactly the limit, the leaky
// bucket shapes.
func TestSeedAtDefaults(t *testing.T) {
	serial(t, "the seed's figures are for a run of about a second: at most 2 refilled, and the leaky bucket's releases within max_delay (150ms); beside the parallel group a run took 2.3s, refilled 3 and released one OK 405ms late")
	for _, mode := range []string{"redis", "hybrid"} {
		t.Run(mode, func(t *testing.T) {
			replicas, rdb := testSeedUnder(t, mode, nil)
			t.Run("leaky_bucket", func(t *testing.T) { testLeakyBucketShapes(t, replicas, rdb) })
			assertNotDegraded(t, replicas)
		})
	}
}

// The same with each replica CPU-limited the way a Kubernetes CPU limit
// does it: frozen 40ms of every 100ms (what a CFS quota of 0.6 CPU does to
// a process that wants more), with SIGSTOP and SIGCONT.
func TestSeedAtDefaultsCPUThrottled(t *testing.T) {
	serial(t, "its replicas are throttled with SIGSTOP on purpose, and the claim is about that load alone")
	for _, mode := range []string{"redis", "hybrid"} {
		t.Run(mode, func(t *testing.T) {
			replicas, _ := testSeedUnder(t, mode, func(replicas []*sidecar) func() {
				return throttle(t, replicas, 40*time.Millisecond, 100*time.Millisecond)
			})
			assertNotDegraded(t, replicas)
		})
	}
}

// The same with a busy loop holding one of the machine's cores.
func TestSeedAtDefaultsBusyCore(t *testing.T) {
	serial(t, "a busy loop holds one of the machine's cores on purpose, and the claim is about that load alone")
	for _, mode := range []string{"redis", "hybrid"} {
		t.Run(mode, func(t *testing.T) {
			replicas, _ := testSeedUnder(t, mode, func([]*sidecar) func() { return busyCore(t) })
			assertNotDegraded(t, replicas)
		})
	}
}

// testSeedUnder starts three replicas at the defaults, one after another,
// applies the hostile condition (nil: none) for as long as the seed burst
// runs for every counting algorithm, and returns the replicas.
func testSeedUnder(t *testing.T, mode string, hostile func([]*sidecar) func()) ([]*sidecar, *redis.Client) {
	t.Helper()
	srv := testredis.Start(t)
	rdb := srv.Client()
	replicas := startReplicas(t, 3, defaultsConfig(srv.Addr, mode, seedAlgorithms))
	stop := func() {}
	if hostile != nil {
		stop = hostile(replicas)
	}
	for _, alg := range countingAlgorithms {
		t.Run(alg, func(t *testing.T) { assertSeedExact(t, replicas, rdb, alg) })
	}
	stop()
	return replicas, rdb
}

// throttle freezes every replica for `frozen` of each `period`, as the CFS
// bandwidth controller does to a container over its CPU limit, until the
// returned function is called. Replicas are throttled out of phase, as
// containers are. Sleeping is the point here: real time is what a CPU limit
// takes away.
func throttle(t *testing.T, replicas []*sidecar, frozen, period time.Duration) (stop func()) {
	t.Helper()
	done := make(chan struct{})
	var wg sync.WaitGroup
	for i, r := range replicas {
		pid := r.cmd.Process.Pid
		phase := period * time.Duration(i) / time.Duration(len(replicas))
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer syscall.Kill(pid, syscall.SIGCONT)
			timer := time.NewTimer(phase)
			defer timer.Stop()
			for {
				select {
				case <-done:
					return
				case <-timer.C:
				}
				syscall.Kill(pid, syscall.SIGSTOP)
				time.Sleep(frozen) // the throttled part of the period
				syscall.Kill(pid, syscall.SIGCONT)
				timer.Reset(period - frozen)
			}
		}()
	}
	var once sync.Once
	stop = func() { once.Do(func() { close(done); wg.Wait() }) }
	t.Cleanup(stop)
	return stop
}

// busyCore runs a shell busy loop that holds one core until the returned
// function is called.
func busyCore(t *testing.T) (stop func()) {
	t.Helper()
	cmd := exec.Command("sh", "-c", "while :; do :; done")
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	must(t, cmd.Start())
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cmd.Process.Kill()
			cmd.Wait()
		})
	}
	t.Cleanup(stop)
	return stop
}
