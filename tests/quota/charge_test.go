package quota_test

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/redis/go-redis/v9"

	"github.com/extauthz/extauthz/internal/quota"
	"github.com/extauthz/extauthz/internal/quota/redisstore"
	"github.com/extauthz/extauthz/tests/internal/testredis"
)

// chargeLimits are the limits charge: always applies to, each small
// enough that random charges drive it deep into debt and back.
var chargeLimits = []quota.Limit{
	{Algorithm: quota.TokenBucket, Limit: 100, Window: 10 * time.Second, Overdraft: true},
	{Algorithm: quota.TokenBucket, Limit: 30, Window: time.Second, Burst: 60, Overdraft: true},
	{Algorithm: quota.FixedWindow, Limit: 100, Window: 10 * time.Second, Overdraft: true},
	{Algorithm: quota.SlidingWindow, Limit: 100, Window: 10 * time.Second, Overdraft: true},
	{Algorithm: quota.FixedWindow, Limit: 100, Window: 24 * time.Hour, Calendar: quota.NewCalendar(quota.Day, time.UTC), Overdraft: true},
}

// The scripts charge as the Go algorithms do, on the same instants:
// charges past the limit counted into debt, questions denied until it is
// paid, the same remaining counts and (to the microsecond the scripts
// count in) the same waits.
func TestRedisChargesMatchLocal(t *testing.T) {
	clk := newClock()
	store, _, _ := newTestStore(t, clk)
	r := newRedis(t, store)
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(5, 7))
	for _, l := range chargeLimits {
		var local quota.State
		key := fmt.Sprintf("charge:%s:%d:%d:%v", l.Algorithm, l.Limit, l.Burst, l.Calendar != nil)
		var debts int
		for i := 0; i < 600; i++ {
			clk.Advance(time.Duration(rng.IntN(int(300*time.Millisecond/time.Microsecond))) * time.Microsecond)
			n := int64(0)
			if rng.IntN(3) == 0 {
				n = 1 + rng.Int64N(60)
			}
			want, _ := local.Take(l, n, clk.Now().UnixNano())
			got, err := r.Take(ctx, key, l, n, clk.Now())
			if err != nil {
				t.Fatal(err)
			}
			if got.Allowed != want.Allowed || got.Remaining != want.Remaining ||
				absDur(got.RetryAfter-want.RetryAfter) > 2*time.Microsecond || absDur(got.ResetAfter-want.ResetAfter) > 2*time.Microsecond {
				t.Fatalf("%+v step %d (%d units): redis %+v, local %+v", l, i, n, got, want)
			}
			if n > 0 && !got.Allowed {
				t.Fatalf("%+v step %d: a charge of %d was refused", l, i, n)
			}
			if n == 0 && !got.Allowed {
				debts++
			}
		}
		if debts == 0 {
			t.Fatalf("%+v: no question was ever denied; the run never went into debt", l)
		}
	}
}

// Three hybrid replicas beside three redis-mode replicas (the oracle),
// on one Redis, the clock standing still so nothing refills: each
// question and charge goes to the same replica number in both modes, and
// every answer is the same, admission and remaining count. The budget is
// spent by one replica alone (as when one replica serves the long
// responses): then every OTHER replica is asked without charging first,
// and denies, as redis mode does. Redis holds the sum charged, to the
// unit, and hybrid leased nothing (a lease would answer questions after
// the others' charges spent the budget: Hybrid.budget).
func TestHybridChargesSumExactly(t *testing.T) {
	srv := testredis.Start(t)
	rdb := srv.Client()
	ctx := context.Background()
	for _, l := range []quota.Limit{
		{Algorithm: quota.TokenBucket, Limit: 100_000, Window: 24 * time.Hour, Overdraft: true},
		{Algorithm: quota.FixedWindow, Limit: 100_000, Window: 24 * time.Hour, Overdraft: true},
		{Algorithm: quota.SlidingWindow, Limit: 100_000, Window: 24 * time.Hour, Overdraft: true},
	} {
		t.Run(l.Algorithm.String(), func(t *testing.T) {
			clk := newClock()
			reps := newReplicas(t, rdb, clk, 3, 1000, time.Hour)
			store := redisstore.NewStore(rdb, redisstore.StoreOptions{Prefix: "rl:", Timeout: time.Second, Log: quiet, Clock: clk.Now})
			t.Cleanup(store.Close)
			var oracle []*redisstore.Redis
			for range reps {
				oracle = append(oracle, newRedis(t, store))
			}
			rng := rand.New(rand.NewPCG(11, uint64(l.Algorithm)))
			key := "budget:" + l.Algorithm.String()
			both := func(i int, n int64) (hybrid, redis quota.Decision) {
				t.Helper()
				hd, err := reps[i].h.Take(ctx, "hybrid:"+key, l, n, clk.Now())
				if err != nil {
					t.Fatal(err)
				}
				rd, err := oracle[i].Take(ctx, "redis:"+key, l, n, clk.Now())
				if err != nil {
					t.Fatal(err)
				}
				if hd.Allowed != rd.Allowed || hd.Remaining != rd.Remaining {
					t.Fatalf("replica %d, %d units: hybrid %+v, redis mode %+v", i, n, hd, rd)
				}
				return hd, rd
			}
			var charged int64
			var admitted int
			for charged < l.Limit {
				// Budget is left: every question is admitted, on any replica.
				if d, _ := both(rng.IntN(len(reps)), 0); !d.Allowed {
					t.Fatalf("a question with %d of %d charged: %+v", charged, l.Limit, d)
				}
				admitted++
				n := 500 + rng.Int64N(3501)
				if d, _ := both(rng.IntN(len(reps)), n); !d.Allowed {
					t.Fatalf("a charge of %d: %+v", n, d)
				}
				charged += n
			}
			// Spent, by replica 0's charges alone (the loop's last charge
			// crossed the end on some replica; replica 0 charges past it).
			both(0, 500)
			charged += 500
			for i := 1; i < len(reps); i++ {
				if d, _ := both(i, 0); d.Allowed {
					t.Fatalf("replica %d admitted a question with %d of %d charged", i, charged, l.Limit)
				}
			}
			for i, r := range reps {
				if got := testutil.ToFloat64(r.m.TokensLeased); got != 0 {
					t.Fatalf("replica %d leased %v tokens of a charge: always limit", i, got)
				}
			}
			for _, mode := range []string{"hybrid", "redis"} {
				if held := redisCount(t, rdb, mode+":"+key, l); held != charged {
					t.Fatalf("%s: Redis holds %d units, the replicas charged %d", mode, held, charged)
				}
			}
			t.Logf("%s: %d requests admitted, %d units charged, Redis holds them in both modes", l.Algorithm, admitted, charged)
		})
	}
}

// redisCount reads what Redis counts of key under l: a bucket's tokens in
// use, a window's count.
func redisCount(t *testing.T, rdb *redis.Client, key string, l quota.Limit) int64 {
	t.Helper()
	k, field := "rl:{"+key+"}", "used"
	switch l.Algorithm {
	case quota.FixedWindow:
		k, field = k+":fw", "c"
	case quota.SlidingWindow:
		k, field = k+":sw", "c"
	}
	v, err := rdb.HGet(context.Background(), k, field).Result()
	if err != nil {
		t.Fatalf("%s %s: %v", k, field, err)
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil {
		t.Fatal(err)
	}
	return int64(math.Round(f))
}
