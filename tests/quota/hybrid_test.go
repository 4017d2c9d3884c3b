package quota_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/redis/go-redis/v9"

	"github.com/extauthz/extauthz/internal/quota"
	"github.com/extauthz/extauthz/internal/quota/local"
	"github.com/extauthz/extauthz/internal/quota/redisstore"
	"github.com/extauthz/extauthz/tests/internal/testredis"
)

// replica is one simulated sidecar: its own cache, store and hybrid
// limiter, sharing Redis and the clock with the others.
type replica struct {
	h *redisstore.Hybrid
	m *redisstore.Metrics
}

func newReplicas(t *testing.T, rdb *redis.Client, clk *clock, n, maxKeys int, idle time.Duration) []*replica {
	t.Helper()
	var out []*replica
	for i := 0; i < n; i++ {
		m := redisstore.NewMetrics(nil)
		store := redisstore.NewStore(rdb, redisstore.StoreOptions{Prefix: "rl:", Timeout: time.Second, Metrics: m, Log: quiet, Clock: clk.Now})
		table, err := redisstore.NewTable(maxKeys)
		if err != nil {
			t.Fatal(err)
		}
		h := redisstore.NewHybrid(table, store, fixedPeers(n), redisstore.HybridOptions{SliceIdle: idle, Metrics: m, Log: quiet, Now: clk.Now})
		t.Cleanup(func() { h.Close(context.Background()); store.Close() })
		out = append(out, &replica{h: h, m: m})
	}
	return out
}

func leaseCalls(m *redisstore.Metrics) float64 {
	return testutil.ToFloat64(m.Calls.WithLabelValues("lease", "ok"))
}

// Random replicas, keys, limits, arrivals and costs (most requests one
// unit, some several, some asking without spending): hybrid never admits
// more units than a bucket allows (capacity plus what refilled over the
// run).
func TestHybridNeverOverAdmits(t *testing.T) {
	t.Parallel() // an injected clock: nothing in it waits on real time
	srv := testredis.Start(t)
	rdb := srv.Client()
	ctx := context.Background()
	for seed := uint64(1); seed <= 6; seed++ {
		rng := rand.New(rand.NewPCG(seed, 99))
		clk := newClock()
		n := 2 + rng.IntN(4)
		reps := newReplicas(t, rdb, clk, n, 1000, time.Hour)
		type keyState struct {
			l        quota.Limit
			admitted int64
		}
		keys := make([]*keyState, 1+rng.IntN(4))
		for i := range keys {
			l := quota.Limit{Limit: int64(5 + rng.IntN(200)), Window: time.Duration(1+rng.IntN(60)) * time.Second}
			if rng.IntN(2) == 0 {
				l.Burst = int64(1 + rng.IntN(300))
			}
			keys[i] = &keyState{l: l}
		}
		start := clk.Now()
		steps := 3000 + rng.IntN(3000)
		for i := 0; i < steps; i++ {
			// Bursts (no time passes) mixed with pauses.
			if rng.IntN(4) == 0 {
				clk.Advance(time.Duration(rng.IntN(int(200 * time.Millisecond))))
			}
			// Most requests cost one unit; some cost several, some
			// ask without spending.
			k := rng.IntN(len(keys))
			units := []int64{1, 1, 1, 1, 2, 3, 0}[rng.IntN(7)]
			d, err := reps[rng.IntN(n)].h.Take(ctx, fmt.Sprintf("s%d:k%d", seed, k), keys[k].l, units, clk.Now())
			if err != nil {
				t.Fatal(err)
			}
			if d.Allowed {
				keys[k].admitted += units
			}
		}
		elapsed := clk.Now().Sub(start)
		for i, ks := range keys {
			bound := ks.l.Capacity() + int64(elapsed)/ks.l.Interval()
			if ks.admitted > bound {
				t.Fatalf("seed %d key %d (%+v, %d replicas): admitted %d units over %v, bound %d", seed, i, ks.l, n, ks.admitted, elapsed, bound)
			}
		}
	}
}

func TestHybridSteadyTrafficWastesLittle(t *testing.T) {
	t.Parallel() // an injected clock: nothing in it waits on real time
	srv := testredis.Start(t)
	clk := newClock()
	reps := newReplicas(t, srv.Client(), clk, 3, 1000, time.Hour)
	ctx := context.Background()
	l := quota.Limit{Limit: 100, Window: time.Second} // 100 per second
	admitted := 0
	// 300 requests per second, round robin, for 20 simulated seconds.
	for i := 0; i < 6000; i++ {
		clk.Advance(time.Second / 300)
		if d, _ := reps[i%3].h.Take(ctx, "steady", l, 1, clk.Now()); d.Allowed {
			admitted++
		}
	}
	// The bucket allows 100 + 100/s × 20s = 2100. Unspent slice
	// remainders are the only loss.
	if admitted > 2100 || admitted < 2100*95/100 {
		t.Fatalf("admitted %d of a possible 2100", admitted)
	}
	t.Logf("steady traffic at 3× the limit over 3 replicas: admitted %d of 2100", admitted)
}

// Exact near the limit: the seed scenario in one process, 600 requests over
// three replicas against a bucket of 100, time frozen.
func TestHybridSeedExact(t *testing.T) {
	srv := testredis.Start(t)
	clk := newClock()
	reps := newReplicas(t, srv.Client(), clk, 3, 1000, time.Hour)
	ctx := context.Background()
	l := quota.Limit{Limit: 100, Window: time.Minute}
	var mu sync.Mutex
	admitted := 0
	var wg sync.WaitGroup
	for w := 0; w < 30; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for i := w; i < 600; i += 30 {
				d, err := reps[i%3].h.Take(ctx, "orders:client:ada", l, 1, clk.Now())
				if err != nil {
					t.Error(err)
					return
				}
				if d.Allowed {
					mu.Lock()
					admitted++
					mu.Unlock()
				}
			}
		}(w)
	}
	wg.Wait()
	if admitted != 100 {
		t.Fatalf("admitted %d, want exactly 100", admitted)
	}
}

func TestHybridSingleFlight(t *testing.T) {
	srv := testredis.Start(t)
	clk := newClock()
	r := newReplicas(t, srv.Client(), clk, 1, 1000, time.Hour)[0]
	ctx := context.Background()
	l := quota.Limit{Limit: 10000, Window: time.Minute}
	var wg sync.WaitGroup
	start := make(chan struct{})
	for g := 0; g < 64; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			if d, err := r.h.Take(ctx, "hot", l, 1, clk.Now()); err != nil || !d.Allowed {
				t.Errorf("Take: %+v %v", d, err)
			}
		}()
	}
	close(start)
	wg.Wait()
	calls := leaseCalls(r.m)
	waits := testutil.ToFloat64(r.m.LeaseWaits)
	t.Logf("64 concurrent first requests: %v lease calls, %v waited", calls, waits)
	// The first request leases for itself alone (nobody waits yet); the
	// others wait for it, and the next lease is sized for all of them.
	if calls > 2 {
		t.Fatalf("%v lease calls for 64 concurrent misses on one key; want at most 2", calls)
	}
}

func TestHybridDenialIsCached(t *testing.T) {
	srv := testredis.Start(t)
	clk := newClock()
	r := newReplicas(t, srv.Client(), clk, 1, 1000, time.Hour)[0]
	ctx := context.Background()
	l := quota.Limit{Limit: 2, Window: 2 * time.Second} // a token a second
	for i := 0; i < 2; i++ {
		if d, _ := r.h.Take(ctx, "k", l, 1, clk.Now()); !d.Allowed {
			t.Fatalf("take %d denied", i)
		}
	}
	d, _ := r.h.Take(ctx, "k", l, 1, clk.Now())
	if d.Allowed || d.RetryAfter != time.Second {
		t.Fatalf("empty bucket: %+v, want a 1s wait", d)
	}
	before := leaseCalls(r.m)
	clk.Advance(400 * time.Millisecond)
	for i := 0; i < 100; i++ {
		d, _ := r.h.Take(ctx, "k", l, 1, clk.Now())
		if d.Allowed || d.RetryAfter != 600*time.Millisecond {
			t.Fatalf("cached denial: %+v", d)
		}
	}
	if calls := leaseCalls(r.m) - before; calls != 0 {
		t.Fatalf("%v Redis calls while the denial was cached", calls)
	}
	clk.Advance(600 * time.Millisecond)
	if d, _ := r.h.Take(ctx, "k", l, 1, clk.Now()); !d.Allowed {
		t.Fatalf("after the wait: %+v", d)
	}
}

// A busy key far from its limit: its first slice is a quarter of the
// bucket over the replicas (833,333 of 10,000,000 over three), which
// outlasts a lease's life at 5,000 decisions a second, so the replica
// leases once per lease life (its 60s, less the 1% it stops early: 59.4s)
// and never in between. 300,000 decisions at 5,000 a second (60s) after
// the first lease make floor(60s / 59.4s) = 1 call: 0.003 per 1,000.
func TestHybridCallsPerThousand(t *testing.T) {
	srv := testredis.Start(t)
	clk := newClock()
	r := newReplicas(t, srv.Client(), clk, 3, 1000, time.Hour)[0]
	ctx := context.Background()
	l := quota.Limit{Limit: 10_000_000, Window: time.Minute}
	r.h.Take(ctx, "busy", l, 1, clk.Now()) // the first lease
	before := leaseCalls(r.m)
	const n, every = 300_000, 200 * time.Microsecond
	for i := 0; i < n; i++ {
		clk.Advance(every)
		if d, _ := r.h.Take(ctx, "busy", l, 1, clk.Now()); !d.Allowed {
			t.Fatal("denied far from the limit")
		}
	}
	calls := leaseCalls(r.m) - before
	life := redisstore.DefaultLeaseTTL - redisstore.DefaultLeaseTTL/100
	want := float64(n * every / life)
	t.Logf("%.0f lease calls in %d decisions over %v: %.4f per 1,000", calls, n, n*every, calls/(n/1000))
	if calls > want {
		t.Fatalf("%.0f lease calls in %v at 5,000 decisions a second; a lease per lease life (%v) makes %.0f", calls, n*every, life, want)
	}
}

// An idle slice's unspent tokens go back to Redis when the bucket is
// short of them (last seen below half full), and at shutdown; far from
// the limit an idle lease is left to end, costing no call.
func TestHybridReturnsUnspentTokens(t *testing.T) {
	srv := testredis.Start(t)
	rdb := srv.Client()
	clk := newClock()
	r := newReplicas(t, rdb, clk, 1, 1000, time.Second)[0]
	ctx := context.Background()
	l := quota.Limit{Limit: 1000, Window: 1000 * time.Hour} // refills too slowly to matter here
	used := func() float64 {
		v, err := rdb.HGet(ctx, "rl:{idle}", "used").Float64()
		if err == redis.Nil {
			return 0
		}
		return v
	}
	spend := func(n int) {
		for i := 0; i < n; i++ {
			clk.Advance(time.Millisecond)
			if d, err := r.h.Take(ctx, "idle", l, 1, clk.Now()); err != nil || !d.Allowed {
				t.Fatalf("denied far from the limit: %+v %v", d, err)
			}
		}
	}
	idleReturns := func() float64 { return testutil.ToFloat64(r.m.TokensReturned.WithLabelValues("idle")) }
	returnCalls := func() float64 { return testutil.ToFloat64(r.m.Calls.WithLabelValues("return", "ok")) }

	// Far from the limit (200 of 1,000 spent): the idle lease stays.
	spend(200)
	if u := used(); u <= 200 {
		t.Fatalf("Redis shows %v tokens in use; expected the 200 spent plus an unspent slice", u)
	}
	far := used()
	clk.Advance(1100 * time.Millisecond)
	r.h.Sweep(clk.Now(), time.Second, redisstore.ReturnIdle)
	if u, c := used(), returnCalls(); u != far || c != 0 {
		t.Fatalf("far from the limit an idle lease went back: %v in use (was %v), %v return calls", u, far, c)
	}

	// Below half full: after the idle time the unspent tokens go back.
	spend(400)
	before := used()
	if before <= 600 {
		t.Fatalf("Redis shows %v tokens in use; expected the 600 spent plus an unspent slice", before)
	}
	clk.Advance(500 * time.Millisecond)
	r.h.Sweep(clk.Now(), time.Second, redisstore.ReturnIdle)
	if u := used(); u != before {
		t.Fatalf("returned before the slice was idle: %v in use, was %v", u, before)
	}
	clk.Advance(600 * time.Millisecond)
	r.h.Sweep(clk.Now(), time.Second, redisstore.ReturnIdle)
	if u := used(); u < 599.9 || u > 600.1 {
		t.Fatalf("after the idle time Redis shows %v tokens in use, want the 600 spent", u)
	}
	if got, want := idleReturns(), before-600; got < want-0.01 || got > want+0.01 {
		t.Fatalf("%v tokens counted as returned idle, want the %v unspent", got, want)
	}

	// At shutdown every unspent token goes back.
	spend(50)
	r.h.Close(ctx)
	if u := used(); u < 649.9 || u > 650.1 {
		t.Fatalf("after Close Redis shows %v tokens in use, want 650", u)
	}
}

func TestHybridEvictionReturnsTokens(t *testing.T) {
	srv := testredis.Start(t)
	rdb := srv.Client()
	clk := newClock()
	r := newReplicas(t, rdb, clk, 1, 2, time.Hour)[0] // room for two keys
	ctx := context.Background()
	l := quota.Limit{Limit: 1000, Window: time.Hour}
	for _, k := range []string{"a", "a", "a", "a", "b", "c"} { // c evicts a
		clk.Advance(time.Millisecond)
		r.h.Take(ctx, k, l, 1, clk.Now())
	}
	r.h.Close(ctx) // drains the return queue, then returns b's and c's slices
	for _, k := range []string{"a", "b", "c"} {
		v, _ := rdb.HGet(ctx, "rl:{"+k+"}", "used").Float64()
		want := map[string]float64{"a": 4, "b": 1, "c": 1}[k]
		if v < want-0.01 || v > want+0.01 {
			t.Fatalf("key %s: %v tokens in use in Redis, want %v", k, v, want)
		}
	}
}

// BenchmarkHybridLeasedSlice is one decision spent from a leased slice: the
// hot path of hybrid mode, with no I/O.
func BenchmarkHybridLeasedSlice(b *testing.B) {
	h, _, m := benchHybrid(b)
	ctx := context.Background()
	l := quota.Limit{Limit: 1 << 40, Window: time.Second}
	now := time.Now()
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		// Time stands still: the rate estimate grows, slices grow with it,
		// and nearly every decision is spent locally.
		if d, err := h.Take(ctx, "orders:client:ada", l, 1, now); err != nil || !d.Allowed {
			b.Fatal(d, err)
		}
	}
	b.ReportMetric(leaseCalls(m)/float64(b.N)*1000, "leases/1k")
}

// A sliding window's estimate weighs the previous window's admissions, not
// what a replica leased and never spent: the unspent units of a lease that
// ended with its window go back with the key's next lease call, so the
// next window admits what an exact count allows (the weighted formula:
// 70 admitted at 30s of a 1m window, then at 75s ⌊100 − 70 × 45/60⌋ = 47,
// as redis mode and the Go algorithm admit).
func TestHybridWindowLeaseLapsedUnitsComeBack(t *testing.T) {
	srv := testredis.Start(t)
	clk := newClock()
	start := clk.Now().Truncate(time.Minute).Add(time.Minute)
	rep := newReplicas(t, srv.Client(), clk, 1, 1000, time.Hour)[0]
	ctx := context.Background()
	l := quota.Limit{Algorithm: quota.SlidingWindow, Limit: 100, Window: time.Minute}
	take := func(n int) (admitted int) {
		for range n {
			d, err := rep.h.Take(ctx, "formula", l, 1, clk.Now())
			if err != nil {
				t.Fatal(err)
			}
			if d.Allowed {
				admitted++
			}
		}
		return admitted
	}
	clk.Set(start.Add(30 * time.Second))
	if got := take(70); got != 70 {
		t.Fatalf("first window admitted %d of 70", got)
	}
	if leased := testutil.ToFloat64(rep.m.TokensLeased); leased <= 70 {
		t.Fatalf("leased %v units for 70 admissions: no unspent lease to lapse, the test proves nothing", leased)
	}
	clk.Set(start.Add(75 * time.Second))
	if got, want := take(100), 47; got != want {
		t.Fatalf("at 75s admitted %d, want ⌊100 − 70 × 45/60⌋ = %d", got, want)
	}
}

// benchHybrid is one hybrid replica on a Redis of its own for the
// benchmarks, slices never idle; both end with b.
func benchHybrid(b testing.TB) (*redisstore.Hybrid, *redisstore.Store, *redisstore.Metrics) {
	srv := testredis.Start(b)
	m := redisstore.NewMetrics(nil)
	store := redisstore.NewStore(srv.Client(), redisstore.StoreOptions{Prefix: "rl:", Timeout: time.Second, Metrics: m, Log: quiet})
	b.Cleanup(store.Close)
	table, _ := redisstore.NewTable(100_000)
	h := redisstore.NewHybrid(table, store, fixedPeers(1), redisstore.HybridOptions{SliceIdle: time.Hour, Metrics: m, Log: quiet})
	b.Cleanup(func() { h.Close(context.Background()) })
	return h, store, m
}

// benchResilient is benchHybrid behind Resilient, with the context of a
// Check with a deadline (an hour: never reached), all ending with tb.
func benchResilient(tb testing.TB) (*redisstore.Resilient, *redisstore.Metrics, context.Context) {
	h, store, m := benchHybrid(tb)
	counts, _ := local.NewTable(100)
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	tb.Cleanup(cancel)
	return redisstore.NewResilient(h, h, local.NewFallback(counts), fixedPeers(1), store), m, ctx
}

// A decision a hybrid replica serves from the slice it holds needs
// neither Redis nor a wait, so Resilient sets up no deadline for it.
// Before, the Check's deadline, made a tenth earlier for the primary, was
// a runtime timer started and stopped on every decision: 4 allocations
// and 530 to 580 ns through Resilient where the slice itself takes 70
// (BenchmarkResilientHybridWindowSlice), 3.4% of the sidecar's CPU in a
// profile under ghz. A token bucket and a window, as a Check with a
// deadline reaches them.
func TestResilientServesASliceWithoutADeadline(t *testing.T) {
	r, _, ctx := benchResilient(t)
	now := time.Now()
	for _, l := range []quota.Limit{
		{Algorithm: quota.TokenBucket, Limit: 1 << 40, Window: time.Hour, OnError: quota.ErrorFallback},
		{Algorithm: quota.FixedWindow, Limit: 1 << 40, Window: time.Hour, OnError: quota.ErrorFallback},
	} {
		key := "orders:client:" + l.Algorithm.String()
		take := func() {
			if d, err := r.Take(ctx, key, l, 1, now); err != nil || !d.Allowed {
				t.Fatal(d, err)
			}
		}
		take() // leases the slice
		if n := testing.AllocsPerRun(1000, take); n != 0 {
			t.Errorf("%v: a decision from the slice held allocated %v times through Resilient; want none (no deadline, no hold set up for it)", l.Algorithm, n)
		}
	}
}

// BenchmarkResilientHybridWindowSlice is BenchmarkHybridLeasedSlice for a
// fixed window through Resilient, as a Check with a deadline reaches it:
// what the wrapper adds to the hot path.
func BenchmarkResilientHybridWindowSlice(b *testing.B) {
	r, m, ctx := benchResilient(b)
	l := quota.Limit{Algorithm: quota.FixedWindow, Limit: 1 << 40, Window: time.Hour, OnError: quota.ErrorFallback}
	now := time.Now()
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if d, err := r.Take(ctx, "orders:client:ada", l, 1, now); err != nil || !d.Allowed {
			b.Fatal(d, err)
		}
	}
	b.ReportMetric(leaseCalls(m)/float64(b.N)*1000, "leases/1k")
}
