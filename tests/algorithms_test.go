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

	"github.com/extauthz/extauthz/internal/config"
	"github.com/extauthz/extauthz/internal/quota/redisstore"
)

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
// with a TTL no longer than it needs. last is Redis's time after the
// key's last decision (zero: not known): a fixed window's key is gone
// once the window it counted has ended, which a check that comes after
// the window's end finds as no key at all.
func assertKeyExpires(t *testing.T, rdb *redis.Client, alg, client string, window time.Duration, last time.Time) {
	t.Helper()
	suffix := map[string]string{"token_bucket": "", "sliding_window": ":sw", "fixed_window": ":fw", "sliding_log": ":log", "leaky_bucket": ":lb"}[alg]
	key := fmt.Sprintf("rl:{%s:client:%s}%s", alg, client, suffix)
	ttl := rdb.PTTL(context.Background(), key).Val()
	if alg == "fixed_window" && ttl == -2*time.Nanosecond && !last.IsZero() && redisNow(t, rdb).Truncate(window) != last.Truncate(window) {
		t.Logf("%s expired with its window, which ended after the run", key)
		return
	}
	// A sliding window's count weighs on the next window too. A token
	// bucket outlives the hybrid leases it counts out (a lease life,
	// rounded up to a quarter of it), then refills within a window.
	need := 2 * window
	if alg == "token_bucket" {
		need = max(need, window+redisstore.DefaultLeaseTTL*5/4)
	}
	if ttl <= 0 || ttl > need+time.Second {
		keys := rdb.Keys(context.Background(), "rl:*").Val()
		t.Fatalf("%s: PTTL %v, want (0, %v]; keys: %v", key, ttl, need, keys)
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
	assert429s(t, results, "leaky_bucket", 10)
	slices.SortFunc(released, func(a, b time.Time) int { return a.Compare(b) })
	var gaps []time.Duration
	var shown []string
	for k := 1; k < len(released); k++ {
		gaps = append(gaps, released[k].Sub(released[k-1]))
		shown = append(shown, gaps[k-1].Round(time.Millisecond).String())
	}
	t.Logf("%d OKs released at intervals %s; slowest OK %v (max_delay %v)", len(released), strings.Join(shown, " "), slowest.Round(time.Millisecond), maxDelay)
	// The count. At most: slots are one interval apart, the first no
	// earlier than the run's start and the last no later than its
	// release, so 1 + (last release − start)/interval. At least: with s
	// the next free slot, a request decided at d is admitted when
	// max(s, d) ≤ d + max_delay, and s moves one interval on. After any
	// decision at d′, s ≥ d′ + c with c = min(interval, max_delay) (an
	// admit moved it past d′ by an interval; a denial found it past
	// d′ + max_delay), so the next decision, at d, loses slot time
	// (s < d) only by what its gap exceeds c: s = d₀ + admitted ×
	// interval + lost, d₀ the first decision. A denial at d found
	// s > d + max_delay, so by the last denial the bucket had admitted
	// 1 + ⌊(d − d₀ + max_delay − lost)/interval⌋: the burst
	// (1 + ⌊max_delay/interval⌋) and one per interval after it, less what
	// gaps in the load lost. The first decision came no later than the
	// first answer, the last denial no earlier than its request was sent.
	// lost is bounded from the requests alone: each decision lies between
	// its request's sending and its answer, so pairwise disjoint spans
	// J₁ < J₂ < … (picked greedily by earliest answer) each hold one, and
	// a stretch with no decision lies within some (sent(Jₘ), back(Jₘ₊₁)):
	// lost ≤ Σ (back(Jₘ₊₁) − sent(Jₘ) − c)⁺. An implementation that admits
	// the burst and then nothing falls below the bound.
	type span struct{ sent, back time.Time }
	spans := make([]span, len(results))
	firstBack := results[0].done
	var lastDenied time.Time
	for i, r := range results {
		spans[i] = span{r.done.Add(-r.latency), r.done}
		if r.done.Before(firstBack) {
			firstBack = r.done
		}
		if r.err == nil && httpStatus(r.resp) == 429 && spans[i].sent.After(lastDenied) {
			lastDenied = spans[i].sent
		}
	}
	slices.SortFunc(spans, func(a, b span) int { return a.back.Compare(b.back) })
	var disjoint []span
	for _, sp := range spans {
		if len(disjoint) == 0 || sp.sent.After(disjoint[len(disjoint)-1].back) {
			disjoint = append(disjoint, sp)
		}
	}
	c := min(interval, maxDelay)
	var lost time.Duration
	for m := 0; m+1 < len(disjoint) && disjoint[m].sent.Before(lastDenied); m++ {
		lost += max(disjoint[m+1].back.Sub(disjoint[m].sent)-c, 0)
	}
	most := 1 + int(released[len(released)-1].Sub(start)/interval)
	least := 1 + int(max(lastDenied.Sub(firstBack)+maxDelay-lost, 0)/interval)
	t.Logf("admitted %d; one slot per %v from the first decision to the last allows %d to %d (first answer %v after the start, last denial sent %v after it, at most %v lost to gaps in the load)",
		counts[200], interval, least, most, firstBack.Sub(start).Round(time.Millisecond), lastDenied.Sub(start).Round(time.Millisecond), lost.Round(time.Millisecond))
	if counts[200] > most || counts[200] < least {
		t.Fatalf("admitted %d; a burst of %d then one slot per %v between the first decision and the last allow %d to %d", counts[200], 1+int(maxDelay/interval), interval, least, most)
	}
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
	// A held OK spends its Redis call and its hold (at most max_delay). A
	// call that times out (a slow moment of a loaded machine) waits for
	// the breaker's verdict (at most the probe's timeout) and is asked
	// once more (docs/modes.md, "When Redis is unreachable"): at most two call
	// timeouts and a probe's.
	if bound := 2*config.DefaultTimeout + redisstore.DefaultProbeTimeout + maxDelay; slowest > bound {
		t.Fatalf("an OK took %v; two Redis calls, the breaker's probe and a hold take at most %v", slowest, bound)
	}
	assertKeyExpires(t, rdb, "leaky_bucket", "ada", 10*time.Second, time.Time{})
}
