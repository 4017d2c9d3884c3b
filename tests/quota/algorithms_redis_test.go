package quota_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/extauthz/extauthz/internal/quota"
	"github.com/extauthz/extauthz/tests/internal/testredis"
)

// Each algorithm keeps its state in one key of its own, hash-tagged on
// the partition (one Cluster slot), expiring once it no longer matters.
// Switching a partition's algorithm (a reload) never trips over another
// algorithm's key type.
func TestAlgorithmKeys(t *testing.T) {
	// Redis TIME, not an injected clock: the TTLs are what production sets.
	store, rdb, m := newTestStore(t, nil)
	r := newRedis(t, store)
	ctx := context.Background()
	// The longest a key must live after one admitted request, by algorithm.
	// Expiry runs on Redis' own clock, so only the TTL set is checked.
	ttl := map[quota.Algorithm]time.Duration{
		quota.TokenBucket:   time.Minute / 100,     // one token to refill
		quota.SlidingWindow: 2 * time.Minute,       // this window and the next
		quota.FixedWindow:   time.Minute,           // until the window ends
		quota.SlidingLog:    time.Minute,           // until the entry leaves the window
		quota.LeakyBucket:   time.Minute / 100 * 2, // one slot to drain (after an earlier one)
	}
	wantKey := map[quota.Algorithm]string{
		quota.TokenBucket:   "rl:{orders:client:ada}",
		quota.SlidingWindow: "rl:{orders:client:ada}:sw",
		quota.FixedWindow:   "rl:{orders:client:ada}:fw",
		quota.SlidingLog:    "rl:{orders:client:ada}:log",
		quota.LeakyBucket:   "rl:{orders:client:ada}:lb",
	}
	for _, a := range allAlgorithms {
		l := perMinute(a)
		if _, err := r.Take(ctx, "orders:client:ada", l, 1, time.Now()); err != nil {
			t.Fatalf("%s: %v", a, err)
		}
		if a == quota.LeakyBucket { // the second slot is held for 600ms: > max_delay
			l.MaxDelay = 150 * time.Millisecond
			l.Window = 10 * time.Second
			r.Take(ctx, "orders:client:ada", l, 1, time.Now())
		}
		key := wantKey[a]
		pttl := rdb.PTTL(ctx, key).Val()
		if pttl <= 0 || pttl > ttl[a]+10*time.Millisecond {
			t.Errorf("%s: PTTL %v, want (0, %v]", a, pttl, ttl[a])
		}
	}
	if n := len(rdb.Keys(ctx, "*").Val()); n != len(allAlgorithms) {
		t.Fatalf("%d keys, want one per algorithm", n)
	}
	for _, op := range []string{"lease", "sliding_window", "fixed_window", "sliding_log", "leaky_bucket"} {
		if n := testutil.ToFloat64(m.Calls.WithLabelValues(op, "error")); n != 0 {
			t.Errorf("%s: %v script errors", op, n)
		}
	}
}

// What a sliding log costs in Redis, per admitted request in the window.
// docs/algorithms.md quotes these figures.
func TestSlidingLogMemory(t *testing.T) {
	t.Parallel() // an injected clock: nothing in it waits on real time
	clk := newClock()
	store, rdb, _ := newTestStore(t, clk)
	r := newRedis(t, store)
	ctx := context.Background()
	for _, n := range []int{100, 1000, 10000} {
		l := quota.Limit{Algorithm: quota.SlidingLog, Limit: int64(n), Window: time.Hour}
		part := fmt.Sprintf("mem:%d", n)
		for i := 0; i < n; i++ {
			clk.Advance(time.Millisecond)
			if d, err := r.Take(ctx, part, l, 1, clk.Now()); err != nil || !d.Allowed {
				t.Fatalf("take %d of %d: %+v %v", i, n, d, err)
			}
		}
		bytes, err := rdb.MemoryUsage(ctx, "rl:{"+part+"}:log", 0).Result()
		if err != nil {
			t.Fatal(err)
		}
		per := float64(bytes) / float64(n)
		t.Logf("sliding_log in redis: %d entries take %d bytes, %.0f per entry", n, bytes, per)
		if per > 150 {
			t.Errorf("%.0f bytes per entry; docs/algorithms.md promises under 150", per)
		}
	}
}

// Hybrid mode leases token buckets and the fixed and sliding windows; the
// sliding log and the leaky bucket are their exact redis scripts. Either
// way, 600 requests spread over three replicas admit exactly 100.
func TestHybridOtherAlgorithmsAreExact(t *testing.T) {
	srv := testredis.Start(t)
	rdb := srv.Client()
	ctx := context.Background()
	for _, a := range allAlgorithms[1:] {
		clk := newClock()
		reps := newReplicas(t, rdb, clk, 3, 1000, time.Hour)
		l := quota.Limit{Algorithm: a, Limit: 100, Window: time.Hour, Queue: -1, MaxDelay: 150 * time.Millisecond}
		if a == quota.LeakyBucket {
			// A slot per second, held at most 99s (no configuration
			// allows that; it keeps the arithmetic round): 100 at once.
			l.Window = 100 * time.Second
			l.MaxDelay = 99 * time.Second
		}
		admitted := 0
		for i := 0; i < 600; i++ {
			d, err := reps[i%3].h.Take(ctx, "hyb:"+a.String(), l, 1, clk.Now())
			if err != nil {
				t.Fatal(err)
			}
			if d.Allowed {
				admitted++
			}
		}
		if admitted != 100 {
			t.Errorf("hybrid %s: admitted %d of 600, want 100", a, admitted)
		}
		leased := testutil.ToFloat64(reps[0].m.SlicesLeased) > 0
		if want := a == quota.FixedWindow || a == quota.SlidingWindow; leased != want {
			t.Errorf("hybrid %s: leased slices %v, want %v", a, leased, want)
		}
	}
}

// While Redis is down, on_redis_error: fallback decides with the policy's
// own algorithm at limit ÷ peers: a window stays a window, and a leaky
