package quota_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sort"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/redis/go-redis/v9"

	"github.com/extauthz/extauthz/internal/quota"
	"github.com/extauthz/extauthz/internal/quota/redisstore"
	"github.com/extauthz/extauthz/tests/internal/testredis"
)

// The bound of bucket_state.lua, tested: replicas spend leases, give them
// back, let them end and die holding them, at random, on an injected
// clock that also leaps past whole lease lives; every unit admitted is
// then replayed, in time order, through one exact limit (a token bucket
// fed only the admitted units, or the exact window counts). The replicas
// together may admit less than the exact limit would (under-use), never
// an admission it would refuse.
func TestHybridLeasesNeverBeatOneBucket(t *testing.T) {
	t.Parallel() // an injected clock: nothing in it waits on real time
	srv := testredis.Start(t)
	for _, a := range []quota.Algorithm{quota.TokenBucket, quota.FixedWindow, quota.SlidingWindow} {
		for seed := uint64(1); seed <= 8; seed++ {
			t.Run(fmt.Sprintf("%s/seed%d", a, seed), func(t *testing.T) {
				testLeaseBound(t, srv, a, seed)
			})
		}
	}
}

// admission is units admitted at an instant.
type admission struct {
	at    time.Time
	units int64
}

// leaseReplica is one replica of the bound test, with a client of its own
// so that its death can cut it off from Redis (a killed process returns
// nothing).
type leaseReplica struct {
	h    *redisstore.Hybrid
	rdb  *redis.Client
	dead bool
}

func testLeaseBound(t *testing.T, srv *testredis.Server, a quota.Algorithm, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, uint64(a)+17))
	clk := newClock()
	ctx := context.Background()
	peers := int64(3 + rng.IntN(6))
	spawn := func() *leaseReplica {
		rdb := srv.Client()
		store := redisstore.NewStore(rdb, redisstore.StoreOptions{Prefix: "rl:", Timeout: time.Second, Log: quiet, Clock: clk.Now})
		table, err := redisstore.NewTable(1000)
		if err != nil {
			t.Fatal(err)
		}
		// An hour's idle time keeps the background sweeper out of the
		// way: the test sweeps when its dice say so. The lease life is
		// the default.
		h := redisstore.NewHybrid(table, store, fixedPeers(peers), redisstore.HybridOptions{SliceIdle: time.Hour, Log: quiet, Now: clk.Now})
		r := &leaseReplica{h: h, rdb: rdb}
		t.Cleanup(func() {
			if !r.dead {
				h.Close(ctx)
			}
			store.Close()
		})
		return r
	}
	reps := make([]*leaseReplica, peers)
	for i := range reps {
		reps[i] = spawn()
	}
	l := quota.Limit{Algorithm: a, Limit: int64(20 + rng.IntN(300)), Window: time.Duration(10+rng.IntN(110)) * time.Second}
	if a == quota.TokenBucket && rng.IntN(2) == 0 {
		l.Burst = int64(5 + rng.IntN(400))
	}
	key := fmt.Sprintf("bound:%s:%d", a, seed)

	var admitted []admission
	var denied, deaths int
	for step := 0; step < 2500; step++ {
		switch x := rng.IntN(100); {
		case x < 25:
			clk.Advance(time.Duration(rng.IntN(int(50 * time.Millisecond))))
		case x < 30:
			clk.Advance(time.Duration(rng.IntN(int(5 * time.Second))))
		case x < 31:
			// Past a whole lease life: leases end unspent.
			clk.Advance(redisstore.DefaultLeaseTTL + time.Duration(rng.IntN(int(15*time.Second))))
		case x < 35:
			// A sweep: idle leases go back (where the bucket is short, or
			// all of them, as at shutdown).
			reason := []redisstore.GiveBackReason{redisstore.ReturnIdle, redisstore.ReturnShutdown}[rng.IntN(2)]
			reps[rng.IntN(len(reps))].h.Sweep(clk.Now(), 0, reason)
			continue
		case x < 36:
			// A replica dies holding its leases; another takes its place.
			i := rng.IntN(len(reps))
			reps[i].dead = true
			reps[i].rdb.Close()
			reps[i] = spawn()
			deaths++
			continue
		}
		units := []int64{1, 1, 1, 1, 1, 2, 3, 0}[rng.IntN(8)]
		d, err := reps[rng.IntN(len(reps))].h.Take(ctx, key, l, units, clk.Now())
		if err != nil {
			t.Fatal(err)
		}
		switch {
		case d.Allowed && units > 0:
			admitted = append(admitted, admission{clk.Now(), units})
		case !d.Allowed:
			denied++
		}
	}
	var total int64
	for _, ad := range admitted {
		total += ad.units
	}
	t.Logf("%s %+v over %d replicas (%d died): %d units admitted in %d decisions, %d denied", a, l, peers, deaths, total, len(admitted), denied)
	if err := exactReplay(l, admitted); err != nil {
		t.Fatal(err)
	}
}

// exactReplay feeds the admissions, in time order, to one exact limit l
// that sees nothing else, and reports the first it would refuse.
func exactReplay(l quota.Limit, as []admission) error {
	sort.SliceStable(as, func(i, j int) bool { return as[i].at.Before(as[j].at) })
	switch l.Algorithm {
	case quota.TokenBucket:
		// Full when the first unit is taken; refilled at the limit's
		// rate, never above capacity.
		capacity, perNs := float64(l.Capacity()), float64(l.Limit)/float64(l.Window)
		tokens, last := capacity, time.Time{}
		for i, ad := range as {
			if !last.IsZero() {
				tokens = min(capacity, tokens+float64(ad.at.Sub(last))*perNs)
			}
			last = ad.at
			if tokens+1e-6 < float64(ad.units) {
				return fmt.Errorf("admission %d (%d units at %v) finds %.3f tokens in one exact bucket of %v", i, ad.units, ad.at, tokens, l)
			}
			tokens -= float64(ad.units)
		}
	case quota.FixedWindow:
		counts := map[int64]int64{}
		for i, ad := range as {
			w := ad.at.UnixMicro() / l.Window.Microseconds()
			counts[w] += ad.units
			if counts[w] > l.Limit {
				return fmt.Errorf("admission %d (%d units at %v) makes %d in its window, over the limit %d", i, ad.units, ad.at, counts[w], l.Limit)
			}
		}
	case quota.SlidingWindow:
		// The estimate at each admission, the scripts' integer form:
		// p×(w−e) + c×w ≤ limit×w, counting what was admitted.
		w := l.Window.Microseconds()
		counts := map[int64]int64{}
		for i, ad := range as {
			now := ad.at.UnixMicro()
			k, e := now/w, now%w
			counts[k] += ad.units
			if counts[k-1]*(w-e)+counts[k]*w > l.Limit*w {
				return fmt.Errorf("admission %d (%d units at %v): estimate %.2f over the limit %d", i, ad.units, ad.at,
					float64(counts[k-1])*float64(w-e)/float64(w)+float64(counts[k]), l.Limit)
			}
		}
	}
	return nil
}

// A bucket that refilled up to its capacity less a lease held out stays
// there when the lease ends: the tokens refill could not add while the
// lease was out are not added at its end. Replica A leases a large slice
// far from the limit and spends it just before the lease ends; replica B
// drains the bucket just after. One exact bucket fed the same admissions
// refuses B's last ones if the level jumped back to full at the expiry.
func TestHybridLeaseEndDoesNotRefillAtOnce(t *testing.T) {
	srv := testredis.Start(t)
	clk := newClock()
	ctx := context.Background()
	// One replica each, as a replica believes before it has heard of the
	// others: the slice is then a quarter of the bucket, large enough
	// that its jump would show above refill.
	reps := newReplicas(t, srv.Client(), clk, 1, 1000, time.Hour)
	repB := newReplicas(t, srv.Client(), clk, 1, 1000, time.Hour)[0]
	a, b := reps[0], repB
	l := quota.Limit{Limit: 1000, Window: time.Minute} // 16.7 tokens a second
	var admitted []admission
	take := func(r *replica) bool {
		d, err := r.h.Take(ctx, "jump", l, 1, clk.Now())
		if err != nil {
			t.Fatal(err)
		}
		if d.Allowed {
			admitted = append(admitted, admission{clk.Now(), 1})
		}
		return d.Allowed
	}
	take(a) // leases a slice and holds the rest of it
	held := int(testutil.ToFloat64(a.m.TokensLeased)) - 1
	clk.Advance(29 * time.Second) // the bucket refills up to capacity less the lease
	for i := 0; i < held; i++ {
		if !take(a) {
			t.Fatalf("A's lease refused its %dth token of %d", i+1, held)
		}
	}
	if calls := leaseCalls(a.m); calls != 1 {
		t.Fatalf("A made %v lease calls; its slice should have served every decision", calls)
	}
	// Let the lease end in Redis (its expiry is rounded up to a quarter
	// of its life) and drain from B.
	clk.Advance(redisstore.DefaultLeaseTTL/4 + 2*time.Second)
	drained := 0
	for take(b) && drained < 2000 {
		drained++
	}
	t.Logf("A spent %d before its lease ended; B drained %d after", held, drained)
	if held < 200 {
		t.Fatalf("A spent only %d from its lease: the scenario needs a large slice", held)
	}
	if err := exactReplay(l, admitted); err != nil {
		t.Fatal(err)
	}
}
