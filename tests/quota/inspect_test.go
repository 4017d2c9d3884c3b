package quota_test

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/extauthz/extauthz/internal/quota"
	"github.com/extauthz/extauthz/internal/quota/redisstore"
)

// The counters API's store operations against a real Redis, for every
// algorithm and a calendar window: reading a count spends nothing (read
// twice, it reads the same), a reset deletes every key of the partition
// and the count starts afresh.
func TestInspectAndReset(t *testing.T) {
	clk := newClock()
	store, rdb, _ := newTestStore(t, clk)
	r := newRedis(t, store)
	ctx := context.Background()
	limits := map[string]quota.Limit{}
	for _, a := range allAlgorithms {
		limits[a.String()] = perMinute(a)
	}
	limits["calendar"] = quota.Limit{Algorithm: quota.FixedWindow, Limit: 100, Window: 24 * time.Hour, Calendar: quota.NewCalendar(quota.Day, zone(t, "Europe/Paris"))}
	for name, l := range limits {
		if _, err := r.Take(ctx, "orders:client:ada", l, 3, clk.Now()); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		for i := 0; i < 2; i++ {
			in, err := r.Inspect(ctx, "orders:client:ada", l, clk.Now())
			want := int64(97)
			if l.Algorithm == quota.LeakyBucket {
				want = 0 // three slots taken at once: the next is 1.8s away, beyond max_delay
			}
			if err != nil || in.Decision.Remaining != want || len(in.Keys) != 1 {
				t.Fatalf("%s: inspection %d: %+v %v, want %d remaining", name, i, in, err, want)
			}
		}
	}
	if n := len(rdb.Keys(ctx, "rl:{orders:client:ada}*").Val()); n != 6 {
		t.Fatalf("%d keys, want one per algorithm and the calendar's", n)
	}
	if err := r.Reset(ctx, "orders:client:ada"); err != nil {
		t.Fatal(err)
	}
	if keys := rdb.Keys(ctx, "*").Val(); len(keys) != 0 {
		t.Fatalf("after the reset: %v", keys)
	}
	for name, l := range limits {
		if in, err := r.Inspect(ctx, "orders:client:ada", l, clk.Now()); err != nil || in.Decision.Remaining != 100 && l.Algorithm != quota.LeakyBucket {
			t.Fatalf("%s after the reset: %+v %v", name, in, err)
		}
	}
}

// A hybrid replica reports the tokens it leased; forgetting a key (what a
// replica does when another reset it) drops them without giving them
// back, since they came from the budget before the reset.
func TestHybridForgetDropsLeasedTokens(t *testing.T) {
	clk := newClock()
	_, rdb, _ := newTestStore(t, clk)
	rep := newReplicas(t, rdb, clk, 1, 100, time.Hour)[0]
	ctx := context.Background()
	l := quota.Limit{Limit: 100, Window: time.Minute}
	// A busy key leases more than it spends at once. (Slices here are
	// capped at a quarter of the bucket, 25: 40 decisions leave part of a
	// slice leased, where 50 could spend two slices to the token.)
	const spent = 40
	for i := 0; i < spent; i++ {
		clk.Advance(time.Millisecond)
		rep.h.Take(ctx, "k", l, 1, clk.Now())
	}
	in, err := rep.h.Inspect(ctx, "k", l, clk.Now())
	if err != nil || in.Leased < 1 || in.Decision.Remaining+in.Leased+spent != 100 {
		t.Fatalf("inspection %+v %v: Redis's remaining, the leased tokens and the %d spent make the 100", in, err, spent)
	}
	rep.h.Forget("k")
	if in, _ := rep.h.Inspect(ctx, "k", l, clk.Now()); in.Leased != 0 {
		t.Fatalf("after Forget, %d tokens still leased", in.Leased)
	}
	rep.h.Sweep(clk.Now().Add(time.Hour), 0, redisstore.ReturnIdle)
	if n := testutil.ToFloat64(rep.m.TokensReturned.WithLabelValues("idle")); n != 0 {
		t.Fatalf("%v forgotten tokens were given back", n)
	}
}
