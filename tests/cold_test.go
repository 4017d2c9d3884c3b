package tests

import (
	"fmt"
	"testing"
	"time"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"

	"github.com/extauthz/extauthz/tests/internal/testredis"
)

// Leases fitted to cold keys (internal/quota/redisstore/hybrid_fit.go),
// end to end: three replicas of the binary, one real Redis.
//
// The knob: local.lease_ttl is 250ms here, not the shipped 60s, because
// the fitting is in lease lives: a key seen fewer than 64 times in a
// lease life on a replica gets a life of lease_ttl × 2^i (up to 10
// minutes) that sees about 64 of its decisions, and a replica takes its
// keys' rates as unknown for its first lease life. At 60s the steady
// state below takes many minutes to reach and a measured run several
// lives long would take an hour; at 250ms it is reached within a second,
// and the measured run (2,000 decisions a replica) spans one and a half
// to three fitted lives. The twins at the
// shipped defaults are the steady-state rows of `make bench` (10,000
// uniform keys, 100,000 Zipf(1.1) keys; docs/benchmarks.md).
const coldLeaseTTL = "250ms"

// coldPolicies: "cold" far from its limit (the calls claim), "over" with
// every key over its limit (the oracle).
var coldPolicies = fmt.Sprintf(`
local: {lease_ttl: %s}
policies:
  - {name: cold, match: {path_prefix: /cold}, key: ["header:x-user"], limit: 1000000, window: 1m}
  - {name: over, match: {path_prefix: /over}, key: ["header:x-user"], limit: %d, window: 1m, burst: %d}
`, coldLeaseTTL, overLimit, overBurst)

const (
	coldKeys  = 10  // a fitted life is 64 to 128 of a key's decisions, 640 to 1,280 of its replica's
	overLimit = 600 // per minute: a token every 100ms
	overBurst = 120 // a lease holds at most 120 ÷ (4 × 3) = 10 tokens
	overKeys  = 20
)

// The claim (docs/modes.md, "Lease life"): keys seen fewer than 64 times
// in a lease life on a replica make at most 20 Redis calls per 1,000
// decisions in steady state (the target for 10,000 uniform keys; the
// fitting aims at 1 in 65, 15.4, plus the heartbeats), where lease_ttl's
// fixed life makes 1 in 1 + rate × life. Every call the replicas made
// counts, as in `make bench`. And the bound holds with fitted leases,
// whatever their lives: keys over their limit admit, key by key, no more
// than one exact bucket fed the same arrivals (0 wrongly allowed). What
// they admit less (under-use) is logged, not asserted: at this lease_ttl
// slices of 10 tokens end unspent every few hundred milliseconds and
// their tokens are lost to the bucket, a cost of the short life, not of
// the fitting (fixed 250ms lives lost 8% of the exact count in one run,
// fitted ones 1.3%); the 0.1% claim is the shipped defaults', asserted
// by TestAccuracyOracle and TestAccuracyOracleLoadMoves.
func TestHybridColdKeysFittedLeases(t *testing.T) {
	serial(t, "its keys must stay cold at the rate it drives them (each replica under 64 decisions per key per 250ms lease life), and its oracle compares instants with a 100ms refill: beside other tests both become a matter of the machine's load")
	srv := testredis.Start(t)
	replicas := startReplicas(t, 3, defaultsConfig(srv.Addr, "hybrid", coldPolicies))
	// Request i goes to replica i % 3 (drive's round robin), for key
	// (i / 3) % coldKeys: every replica sees every key in turn.
	cold := make([]*authv3.CheckRequest, coldKeys)
	for k := range cold {
		cold[k] = envoyRequest{path: "/cold", headers: [][2]string{{"x-user", fmt.Sprintf("cold-%02d", k)}}}.build()
	}
	coldReq := func(i int) *authv3.CheckRequest { return cold[(i/3)%coldKeys] }
	calls := func() (n float64) {
		for _, r := range replicas {
			n += r.metric("extauthz_redis_calls_total") -
				r.metric("extauthz_redis_calls_total", "result", "canceled") -
				r.metric("extauthz_redis_calls_total", "result", "abandoned")
		}
		return n
	}

	// Warm-up: the replicas watch for a lease life, the keys' probes end
	// and their rates are learnt.
	if counts := tally(t, drive(t, replicas, 1500, 16, coldReq)); counts[200] != 1500 {
		t.Fatalf("warm-up: statuses %v; every key is far from its limit", counts)
	}
	const n = 6000
	before := calls()
	results, elapsed := timedDrive(t, replicas, n, 16, coldReq)
	made := calls() - before
	counts := tally(t, results)
	perReplica := float64(n) / float64(len(replicas)) / elapsed.Seconds()
	rate := perReplica / coldKeys // each key's decisions a second on each replica
	perK := 1000 * made / n
	t.Logf("%d decisions in %v (%.0f a second per replica, each key %.1f a second per replica, %.1f per 250ms lease life): %.0f Redis calls, %.1f per 1,000 (a fixed 250ms life: %.1f)",
		n, elapsed.Round(time.Millisecond), perReplica, rate, rate/4, made, perK, 1000/(1+rate*0.2475))
	if rate/4 >= 64 {
		t.Fatalf("each key is seen %.0f times per lease life on a replica: not a cold key at this rate (the claim is for fewer than 64)", rate/4)
	}
	if counts[200] != n {
		t.Fatalf("statuses %v; every key is far from its limit, so every denial is under-use", counts)
	}
	if perK > 20 {
		t.Errorf("%.1f Redis calls per 1,000 decisions on cold keys; leases fitted to their rates make at most 20", perK)
	}

	// The oracle: every key over its limit from the first half second
	// (its burst of 120 against ~20 a second a replica) to the end.
	over := make([]*authv3.CheckRequest, overKeys)
	for k := range over {
		over[k] = envoyRequest{path: "/over", headers: [][2]string{{"x-user", fmt.Sprintf("over-%02d", k)}}}.build()
	}
	const m = 6000
	results = drive(t, replicas, m, 16, func(i int) *authv3.CheckRequest { return over[(i/3)%overKeys] })
	byKey := make([][]result, overKeys)
	for i, r := range results {
		if r.err != nil {
			t.Fatalf("request %d: %v", i, r.err)
		}
		byKey[(i/3)%overKeys] = append(byKey[(i/3)%overKeys], r)
	}
	var wronglyAllowed, wronglyLimited, total int
	for k, rs := range byKey {
		admitted := 0
		first, last := rs[0], rs[0]
		for _, r := range rs {
			if st := httpStatus(r.resp); st == 200 {
				admitted++
			} else if st != 429 {
				t.Fatalf("key %d: status %d", k, st)
			}
			if r.done.Add(-r.latency).Before(first.done.Add(-first.latency)) {
				first = r
			}
			if r.done.After(last.done) {
				last = r
			}
		}
		// As in oracle_test.go: the first decision lies in [first sent,
		// first answered], the last in [last sent, last answered]; an
		// exact bucket full at the first admits its burst and a token per
		// interval to the last.
		interval := time.Minute / overLimit
		firstSent, firstBack := first.done.Add(-first.latency), first.done
		lastSent, lastBack := last.done.Add(-last.latency), last.done
		lo := overBurst + int(max(lastSent.Sub(firstBack), 0)/interval)
		hi := overBurst + int(lastBack.Sub(firstSent)/interval)
		if admitted > hi {
			wronglyAllowed += admitted - hi
			t.Errorf("key %d admitted %d; one exact bucket admits at most %d", k, admitted, hi)
		}
		wronglyLimited += max(lo-admitted, 0)
		total += len(rs)
	}
	t.Logf("oracle: %d decisions on %d keys over their limit: %d wrongly allowed, %d wrongly limited (under-use, not asserted at this lease_ttl)", total, overKeys, wronglyAllowed, wronglyLimited)
	assertNotDegraded(t, replicas)
}
