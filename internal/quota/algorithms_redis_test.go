package quota

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/extauthz/extauthz/internal/testredis"
)

// Each algorithm keeps its state in one key of its own, hash-tagged on
// the partition (one Cluster slot), expiring once it no longer matters.
// Switching a partition's algorithm (a reload) never trips over another
// algorithm's key type.
func TestAlgorithmKeys(t *testing.T) {
	// Redis TIME, not an injected clock: the TTLs are what production sets.
	store, rdb, m := newTestStore(t, nil)
	r := NewRedis(store)
	ctx := context.Background()
	// The longest a key must live after one admitted request, by algorithm.
	// Expiry runs on Redis' own clock, so only the TTL set is checked.
	ttl := map[Algorithm]time.Duration{
		TokenBucket:   time.Minute / 100,     // one token to refill
		SlidingWindow: 2 * time.Minute,       // this window and the next
		FixedWindow:   time.Minute,           // until the window ends
		SlidingLog:    time.Minute,           // until the entry leaves the window
		LeakyBucket:   time.Minute / 100 * 2, // one slot to drain (after an earlier one)
	}
	wantKey := map[Algorithm]string{
		TokenBucket:   "rl:{orders:client:ada}",
		SlidingWindow: "rl:{orders:client:ada}:sw",
		FixedWindow:   "rl:{orders:client:ada}:fw",
		SlidingLog:    "rl:{orders:client:ada}:log",
		LeakyBucket:   "rl:{orders:client:ada}:lb",
	}
	for _, a := range allAlgorithms {
		l := perMinute(a)
		if _, err := r.Take(ctx, "orders:client:ada", l, time.Now()); err != nil {
			t.Fatalf("%s: %v", a, err)
		}
		if a == LeakyBucket { // the second slot is held for 600ms: > max_delay
			l.MaxDelay = 150 * time.Millisecond
			l.Window = 10 * time.Second
			r.Take(ctx, "orders:client:ada", l, time.Now())
		}
		key := store.AlgorithmKey("orders:client:ada", a)
		if key != wantKey[a] {
			t.Fatalf("%s key = %q, want %q", a, key, wantKey[a])
		}
		pttl := rdb.PTTL(ctx, key).Val()
		if pttl <= 0 || pttl > ttl[a]+10*time.Millisecond {
			t.Errorf("%s: PTTL %v, want (0, %v]", a, pttl, ttl[a])
		}
	}
	if n := len(rdb.Keys(ctx, "*").Val()); n != len(allAlgorithms) {
		t.Fatalf("%d keys, want one per algorithm", n)
	}
	for _, op := range []string{"lease", "sliding_window", "fixed_window", "sliding_log", "leaky_bucket"} {
		if n := testutil.ToFloat64(m.RedisCalls.WithLabelValues(op, "error")); n != 0 {
			t.Errorf("%s: %v script errors", op, n)
		}
	}
}

// What a sliding log costs in Redis, per admitted request in the window.
// The README quotes these figures.
func TestSlidingLogMemory(t *testing.T) {
	clk := newClock()
	store, rdb, _ := newTestStore(t, clk)
	r := NewRedis(store)
	ctx := context.Background()
	for _, n := range []int{100, 1000, 10000} {
		l := Limit{Algorithm: SlidingLog, Limit: int64(n), Window: time.Hour}
		part := fmt.Sprintf("mem:%d", n)
		for i := 0; i < n; i++ {
			clk.Advance(time.Millisecond)
			if d, err := r.Take(ctx, part, l, clk.Now()); err != nil || !d.Allowed {
				t.Fatalf("take %d of %d: %+v %v", i, n, d, err)
			}
		}
		bytes, err := rdb.MemoryUsage(ctx, store.AlgorithmKey(part, SlidingLog), 0).Result()
		if err != nil {
			t.Fatal(err)
		}
		per := float64(bytes) / float64(n)
		t.Logf("sliding_log in redis: %d entries take %d bytes, %.0f per entry", n, bytes, per)
		if per > 150 {
			t.Errorf("%.0f bytes per entry; the README promises under 150", per)
		}
	}
}

// Hybrid mode leases token buckets only; every other algorithm is its
// exact redis script, shared by the replicas: 600 requests spread over
// three replicas admit exactly 100.
func TestHybridOtherAlgorithmsAreExact(t *testing.T) {
	srv := testredis.Start(t)
	rdb := srv.Client()
	ctx := context.Background()
	for _, a := range allAlgorithms[1:] {
		clk := newClock()
		reps := newReplicas(t, rdb, clk, 3, 1000, time.Hour)
		l := Limit{Algorithm: a, Limit: 100, Window: time.Hour, Queue: -1, MaxDelay: 150 * time.Millisecond}
		if a == LeakyBucket {
			// A slot per second, held at most 99s (no configuration
			// allows that; it keeps the arithmetic round): 100 at once.
			l.Window = 100 * time.Second
			l.MaxDelay = 99 * time.Second
		}
		admitted := 0
		for i := 0; i < 600; i++ {
			d, err := reps[i%3].h.Take(ctx, "hyb:"+a.String(), l, clk.Now())
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
		if leaseCalls(reps[0].m) != 0 {
			t.Errorf("hybrid %s leased slices", a)
		}
	}
}

// While Redis is down, on_redis_error: fallback decides with the policy's
// own algorithm at limit ÷ peers: a window stays a window, and a leaky
// bucket still holds requests.
func TestFallbackKeepsTheAlgorithm(t *testing.T) {
	cache, err := NewCache(100)
	if err != nil {
		t.Fatal(err)
	}
	r := NewResilient(failing{ErrStoreDown}, cache, fixedPeers(4), redisUp)
	ctx := context.Background()
	for _, a := range allAlgorithms {
		l := Limit{Algorithm: a, Limit: 100, Window: time.Minute, Queue: -1, MaxDelay: 100 * time.Millisecond}
		admitted := 0
		var last Decision
		for i := 0; i < 100; i++ {
			d, err := r.Take(ctx, "fb:"+a.String(), l, at(30*time.Second))
			if err != nil || d.Degraded != DegradedFallback || d.Limit != 100 {
				t.Fatalf("%s: %+v %v", a, d, err)
			}
			if d.Allowed {
				admitted++
				last = d
			}
		}
		want := 25 // 100 ÷ 4 replicas
		if a == LeakyBucket {
			want = 1 // a slot every 2.4s (the share's rate): one at once
		}
		if admitted != want {
			t.Errorf("%s fallback admitted %d, want %d", a, admitted, want)
		}
		// A refund while Redis is down goes to the local fallback state.
		if err := r.Refund(ctx, "fb:"+a.String(), l, at(30*time.Second)); err != nil {
			t.Fatal(err)
		}
		if d, _ := r.Take(ctx, "fb:"+a.String(), l, at(30*time.Second)); !d.Allowed {
			t.Errorf("%s: after a fallback refund, denied: %+v (last admitted %+v)", a, d, last)
		}
	}
}
