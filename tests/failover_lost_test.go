package tests

import (
	"testing"
	"time"

	"github.com/extauthz/extauthz/tests/internal/testredis"
)

// A Sentinel failover to a replica that missed the last writes
// (docs/reliability.md, "When Redis forgets"), made to lose them for
// certain: in the Sentinel runs of TestSentinelFailoverUnderLoad the
// promoted replica held every byte of the stream, so nothing was lost
// and nothing was shown. Here each mode has a replication group of its
// own (a master, one replica, three sentinels) and three sidecars at the
// shipped defaults; both fleets get the same requests at the same
// instants (sideBySide.drive). The run:
//
//  1. warm-up: every replica decides (and in hybrid leases) every key
//     once, and two heartbeats pass;
//  2. the replica is cut off its master (testredis CutReplication: it
//     holds every write up to the cut, and no more), and the fleets are
//     loaded over the limit for lostWindow: every write of that phase
//     is one the promoted replica never gets;
//  3. the master is killed (its writes paused first, so what it ran is
//     counted exactly), the sentinels promote the stale replica, and the
//     load goes on for lostAfter, through the fallback and back.
//
// The claims:
//   - redis mode admits at most one exact bucket per key over the run,
//     plus the fallback's 2% (docs/modes.md, as TestSentinelFailover-
//     UnderLoad allows), plus one token per call the failover lost: a
//     lost decision let its key admit again at most the token it took;
//     the calls lost are the scripts the master ran after the cut (its
//     INFO commandstats at the cut and at the kill);
//   - hybrid admits no more than redis mode, but for a token per key
//     (two exact buckets fed the same arrivals a millisecond apart
//     differ by the token one of them refilled in between): a lease the
//     promoted replica lacks is charged what was spent of it with its
//     key's next call (or stopped by the heartbeat that sees the new
//     run_id), never spent again on top of the bucket the new master
//     holds;
//   - no gRPC error; every sidecar's breaker closes once the new master
//     answers, and the run goes on for 2s at least after that.
const (
	lostWindow = 1500 * time.Millisecond
	lostAfter  = 7 * time.Second
)

func TestSentinelFailoverLosesWrites(t *testing.T) {
	serial(t, "it kills and promotes Redis processes and asserts that every breaker closes within the run at the breaker's defaults: other tests' load would stretch the failover past it")
	gh := testredis.StartSentinels(t, testredis.SentinelOptions{Replicas: 1})
	gr := testredis.StartSentinels(t, testredis.SentinelOptions{Replicas: 1})
	// The binary built without the race detector, as users run it: the
	// run is about rates, as TestSentinelFailoverUnderLoad's is.
	f := &sideBySide{}
	for range 3 {
		f.hybrid = append(f.hybrid, startFastSidecar(t, sentinelConfig(gh, "hybrid", flushPolicy)))
		f.redis = append(f.redis, startFastSidecar(t, sentinelConfig(gr, "redis", flushPolicy)))
	}
	waitPeers(t, f.hybrid, 3)
	waitPeers(t, f.redis, 3)
	r := runLostFailover(t, f, gh, gr)
	assertLostFailover(t, r)
}

// lostRun is what one lost-writes failover measured, per mode.
type lostRun struct {
	total          tallies // the whole run
	elapsed        time.Duration
	lostScripts    [2]int64 // hybrid, redis: scripts the master ran after the cut
	lostBytes      [2]int64 // of the stream, written after the cut
	leaseCallsLost int64    // hybrid lease calls answered between the cut and the kill
	tokensLost     int64    // hybrid tokens leased between the cut and the kill
	forgotten      float64  // hybrid leases found forgotten
	backAfter      time.Duration
	left           time.Duration // of the run after the last breaker closed
}

func runLostFailover(t *testing.T, f *sideBySide, gh, gr *testredis.Sentinels) lostRun {
	t.Helper()
	begin := time.Now()
	warm := f.drive(flushKeys*3, 8, 0, flushRequest)
	if warm.hybrid != warm.hybridN || warm.redis != warm.redisN {
		t.Fatalf("far from the limit, hybrid admitted %d of %d, redis mode %d of %d", warm.hybrid, warm.hybridN, warm.redis, warm.redisN)
	}
	waitBeats(t, f.hybrid, 2)
	leaseCalls := func() (calls, tokens float64) {
		for _, s := range f.hybrid {
			calls += s.metric("extauthz_redis_calls_total", "op", "lease", "result", "ok")
			tokens += s.metric("extauthz_hybrid_tokens_leased_total")
		}
		return calls, tokens
	}

	cutH, cutR := gh.CutReplication(gh.Replicas[0]), gr.CutReplication(gr.Replicas[0])
	c0, k0 := leaseCalls()
	lost := f.drive(0, 16, lostWindow, flushRequest)
	killH, killR := gh.KillMasterCounted(), gr.KillMasterCounted()
	killed := time.Now()
	c1, k1 := leaseCalls()

	done := make(chan tallies, 1)
	go func() { done <- f.drive(0, 16, lostAfter, flushRequest) }()
	for i, g := range []*testredis.Sentinels{gh, gr} {
		promoted, _, all := g.WaitPromoted(g.Master, lostAfter)
		if promoted != g.Replicas[0] {
			t.Fatalf("the sentinels promoted %s, not the replica cut off", promoted.Addr)
		}
		// second_repl_offset is the new master's offset at promotion, plus
		// one: the replica held the stream up to the cut, and no more.
		cut := []testredis.Replicated{cutH, cutR}[i]
		if got := replInfo(t, g.Client(promoted.Addr), "second_repl_offset") - 1; int64(got) != cut.Offset {
			t.Fatalf("the promoted replica's offset was %.0f at promotion; the master's at the cut %d", got, cut.Offset)
		}
		t.Logf("%s: every sentinel named %s %v after the kill", []string{"hybrid", "redis"}[i], promoted.Addr, all.Sub(killed).Round(time.Millisecond))
	}
	after := <-done
	end := time.Now()

	r := lostRun{elapsed: end.Sub(begin)}
	for _, p := range []tallies{warm, lost, after} {
		r.total.hybrid += p.hybrid
		r.total.redis += p.redis
		r.total.hybridN += p.hybridN
		r.total.redisN += p.redisN
		r.total.hybridErrs += p.hybridErrs
		r.total.redisErrs += p.redisErrs
	}
	r.total.elapsed = r.elapsed
	r.lostScripts = [2]int64{killH.Scripts - cutH.Scripts, killR.Scripts - cutR.Scripts}
	r.lostBytes = [2]int64{killH.Offset - cutH.Offset, killR.Offset - cutR.Offset}
	r.leaseCallsLost, r.tokensLost = int64(c1-c0), int64(k1-k0)
	for _, s := range f.hybrid {
		r.forgotten += s.metric("extauthz_hybrid_leases_forgotten_total")
	}
	var lastUp time.Time
	for _, b := range sentinelBreakers(t, append(append([]*sidecar{}, f.hybrid...), f.redis...)) {
		if b.closed == 0 {
			t.Errorf("replica %s: the breaker opened %d times and never closed", b.replica, b.opened)
		}
		if b.up.After(lastUp) {
			lastUp = b.up
		}
	}
	r.backAfter, r.left = lastUp.Sub(killed), end.Sub(lastUp)
	t.Logf("lost window (%v): hybrid admitted %d of %d, redis mode %d of %d; after the kill: hybrid %d of %d, redis mode %d of %d",
		lost.elapsed.Round(time.Millisecond), lost.hybrid, lost.hybridN, lost.redis, lost.redisN, after.hybrid, after.hybridN, after.redis, after.redisN)
	return r
}

func assertLostFailover(t *testing.T, r lostRun) {
	t.Helper()
	bucket := flushKeys * (flushLimit + int(r.elapsed/(time.Minute/time.Duration(flushLimit))))
	t.Logf("the failover lost %d scripts (%d bytes) of hybrid's master, %d (%d bytes) of redis mode's; hybrid lease calls lost %d (%d tokens), leases found forgotten %v",
		r.lostScripts[0], r.lostBytes[0], r.lostScripts[1], r.lostBytes[1], r.leaseCallsLost, r.tokensLost, r.forgotten)
	t.Logf("run of %v: hybrid admitted %d of %d, redis mode %d of %d; one exact bucket per key: %d; last breaker closed %v after the kill, %v before the end",
		r.elapsed.Round(time.Millisecond), r.total.hybrid, r.total.hybridN, r.total.redis, r.total.redisN, bucket,
		r.backAfter.Round(time.Millisecond), r.left.Round(time.Millisecond))
	if r.total.hybridErrs+r.total.redisErrs != 0 {
		t.Errorf("gRPC errors: hybrid %d, redis mode %d; want none", r.total.hybridErrs, r.total.redisErrs)
	}
	if r.lostScripts[1] == 0 || r.leaseCallsLost == 0 {
		t.Fatalf("the failover lost %d of redis mode's scripts and %d hybrid lease calls: nothing was lost, the run proves nothing", r.lostScripts[1], r.leaseCallsLost)
	}
	if r.left < 2*time.Second {
		t.Errorf("only %v of the run after the last breaker closed: too short to show the decisions after the failover", r.left)
	}
	if most := float64(bucket)*1.02 + float64(r.lostScripts[1]); float64(r.total.redis) > most {
		t.Errorf("redis mode admitted %d; one exact bucket per key allows %d, %.0f with the fallback's 2%% and a token per call lost (%d)",
			r.total.redis, bucket, most, r.lostScripts[1])
	}
	if r.total.hybrid > r.total.redis+flushKeys {
		t.Errorf("hybrid admitted %d; redis mode, the oracle, %d: want no more (but a token per key, %d)", r.total.hybrid, r.total.redis, flushKeys)
	}
}

// waitBeats waits until each replica has sent n more heartbeats: a
// replica reads the epoch right after its heartbeat (op peers), so once
// two more have gone, the state everything before was spent in is
// confirmed.
func waitBeats(t *testing.T, replicas []*sidecar, n float64) {
	t.Helper()
	for _, s := range replicas {
		beats := s.metric("extauthz_redis_calls_total", "op", "peers", "result", "ok")
		deadline := time.Now().Add(5 * time.Second)
		for s.metric("extauthz_redis_calls_total", "op", "peers", "result", "ok") < beats+n {
			if time.Now().After(deadline) {
				t.Fatalf("replica %s sent no %v heartbeats within 5s", s.GRPC, n)
			}
			time.Sleep(20 * time.Millisecond) // heartbeats run once a second
		}
	}
}
