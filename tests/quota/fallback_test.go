package quota_test

import (
	"context"
	"testing"
	"time"

	"github.com/extauthz/extauthz/internal/quota"
	"github.com/extauthz/extauthz/internal/quota/local"
	"github.com/extauthz/extauthz/internal/quota/redisstore"
	"github.com/extauthz/extauthz/tests/internal/testredis"
)

// A replica that loses Redis near the limit falls back from its share of
// what Redis last said the bucket held, not from a full limit ÷ peers, so
// the admissions before and after the loss stay within the limit. Once the
// window has refilled, the fallback bucket is full again.
func TestFallbackStartsFromItsShare(t *testing.T) {
	for _, mode := range []string{"hybrid", "redis"} {
		t.Run(mode, func(t *testing.T) { testFallbackStartsFromItsShare(t, mode) })
	}
}

func testFallbackStartsFromItsShare(t *testing.T, mode string) {
	srv := testredis.Start(t)
	clk := newClock()
	m := redisstore.NewMetrics(nil)
	store := redisstore.NewStore(srv.Client(), redisstore.StoreOptions{Prefix: "rl:", Timeout: time.Second, Metrics: m, Log: quiet, Clock: clk.Now})
	defer store.Close()
	counts, err := local.NewTable(100)
	if err != nil {
		t.Fatal(err)
	}
	table := newTable(t)
	const peers = 3
	primary := quota.Limiter(redisstore.NewRedis(store, table))
	if mode == "hybrid" {
		// The default idle time: it sizes the first slices (see below).
		primary = redisstore.NewHybrid(table, store, fixedPeers(peers), redisstore.HybridOptions{SliceIdle: time.Second, Metrics: m, Log: quiet, Now: clk.Now})
	}
	r := redisstore.NewResilient(primary, table, local.NewFallback(counts), fixedPeers(peers), store)
	l := quota.Limit{Limit: 90, Window: time.Minute, OnError: quota.ErrorFallback}
	ctx := context.Background()

	// take admits at the current instant until the first denial and
	// returns how many were admitted from Redis and how many by fallback.
	take := func() (fromRedis, fallback int) {
		for i := 0; i < 200; i++ {
			d, err := r.Take(ctx, "k", l, 1, clk.Now())
			if err != nil {
				t.Fatal(err)
			}
			if !d.Allowed {
				return fromRedis, fallback
			}
			if d.Degraded == quota.DegradedFallback {
				fallback++
			} else {
				fromRedis++
			}
		}
		t.Fatal("never denied")
		return
	}
	for i := 0; i < 60; i++ {
		if d, err := r.Take(ctx, "k", l, 1, clk.Now()); err != nil || !d.Allowed || d.Degraded != 0 {
			t.Fatalf("decision %d with Redis up: %+v %v", i, d, err)
		}
	}
	// Worked by hand: redis mode leaves 30 in Redis, a third is 10. In
	// hybrid mode the first lease is 1 token (the tokens Redis refills
	// within the second's idle time: one, at one per 667ms), the next seven are slices
	// of 7 (a quarter of the bucket over three replicas), then a sixth of
	// what Redis holds as it runs low: 6 of 40, then 5 of 34, leaving 29.
	// The 60th decision spent the fourth of those 5, so one is left in
	// the slice, and a third of 29 is 9.
	wantSlice, wantFallback := 0, 10
	if mode == "hybrid" {
		wantSlice, wantFallback = 1, 9
	}
	used, err := srv.Client().HGet(ctx, "rl:{k}", "used").Float64()
	if err != nil {
		t.Fatal(err)
	}
	if want := float64(60 + wantSlice); used < want-0.01 || used > want+0.01 {
		t.Fatalf("Redis counts %.2f tokens in use after 60 decisions; want %d (60 spent, %d in the slice)", used, 60+wantSlice, wantSlice)
	}

	srv.Kill()
	fromSlice, fallback := take()
	if fromSlice != wantSlice || fallback != wantFallback {
		t.Fatalf("after Redis died: %d from the slice and %d by fallback, want %d and %d",
			fromSlice, fallback, wantSlice, wantFallback)
	}
	if total := 60 + fromSlice + fallback; total > 90 {
		t.Fatalf("%d admitted in all, over the limit of 90", total)
	}

	clk.Advance(time.Minute)
	if _, fallback := take(); fallback != 30 {
		t.Fatalf("a window later the fallback admits %d, want the full share, a third of 90: 30", fallback)
	}
}
