package quota_test

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

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
	const peers = 3
	// In hybrid, the defaults: the lease life sizes the slices (see below).
	r := resilientStack(t, mode, store, m, clk.Now, peers, redisstore.HybridOptions{})
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
	// hybrid mode every slice is a quarter of the bucket over three
	// replicas, 7 (their share of what refills over a lease's life, 15,
	// is more), until half of what Redis holds over the replicas is less:
	// seven slices of 7 leave 41, then 6 of 41 and 5 of 35 leave 30, and
	// the 60th decision spent the last of those 5, so none is left in the
	// slice. The other two replicas may each have leased a slice of at
	// most 7 since this one's last lease, so the fallback counts 30 −
	// 2 × 7 = 16 in Redis, and a third of that is 5.
	wantSlice, wantFallback := 0, 10
	if mode == "hybrid" {
		wantSlice, wantFallback = 0, 5
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

// What the fallback admits while Redis cannot answer is charged to the
// Redis bucket when it can again: a Redis that kept its state (here one
// frozen with SIGSTOP; in a Cluster, the replica promoted in a failover)
// refilled all along and would otherwise hand those tokens out a second
// time. The breaker runs on real time (the freeze opens it, the thaw
// closes it); the scripts run on the test's clock, which stands still, so
// nothing refills meanwhile.
func TestFallbackAdmissionsAreChargedToRedis(t *testing.T) {
	for _, mode := range []string{"hybrid", "redis"} {
		t.Run(mode, func(t *testing.T) { testFallbackCharged(t, mode) })
	}
}

func testFallbackCharged(t *testing.T, mode string) {
	srv := testredis.Start(t)
	clk := newClock()
	m := redisstore.NewMetrics(nil)
	store := redisstore.NewStore(srv.Client(sidecarClient), redisstore.StoreOptions{Prefix: "rl:", Metrics: m, Log: quiet, Clock: clk.Now, Probe: srv.Client(sidecarClient)})
	defer store.Close()
	r := resilientStack(t, mode, store, m, clk.Now, 1, redisstore.HybridOptions{SliceIdle: time.Second})
	l := quota.Limit{Limit: 20, Window: time.Hour, OnError: quota.ErrorFallback}
	ctx := context.Background()
	rdb := srv.Client()
	take := func() quota.Decision {
		t.Helper()
		d, err := r.Take(ctx, "k", l, 1, clk.Now())
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	for i := 0; i < 4; i++ {
		if d := take(); !d.Allowed || d.Degraded != 0 {
			t.Fatalf("decision %d with Redis up: %+v", i, d)
		}
	}

	srv.Freeze()
	fallback := 0
	for i := 0; fallback < 3; i++ {
		if i > 50 {
			t.Fatal("the fallback admitted fewer than 3 in 50 decisions")
		}
		if d := take(); d.Allowed && d.Degraded == quota.DegradedFallback {
			fallback++
		}
	}
	srv.Thaw()
	deadline := time.Now().Add(5 * time.Second)
	for testutil.ToFloat64(m.Up) != 1 {
		if time.Now().After(deadline) {
			t.Fatal("the store did not come back within 5s of the thaw")
		}
		time.Sleep(5 * time.Millisecond) // the store probes every 500ms while down
	}

	// Whatever Redis held now (hybrid leases ahead of spending), the next
	// call to reach it charges the 3 admitted without it.
	before, err := rdb.HGet(ctx, "rl:{k}", "used").Float64()
	if err != nil {
		t.Fatal(err)
	}
	leased := testutil.ToFloat64(m.TokensLeased)
	var d quota.Decision
	for i := 0; ; i++ {
		// Hybrid may still spend what its slice held before the
		// freeze; the first decision that needs Redis leases.
		if d = take(); testutil.ToFloat64(m.TokensLeased) != leased || mode == "redis" || i > 20 {
			break
		}
	}
	if !d.Allowed || d.Degraded != 0 {
		t.Fatalf("after the thaw: %+v, want allowed by Redis", d)
	}
	granted := 1.0 // redis mode takes the decision's token
	if mode == "hybrid" {
		granted = testutil.ToFloat64(m.TokensLeased) - leased
	}
	after, err := rdb.HGet(ctx, "rl:{k}", "used").Float64()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("Redis counted %.0f tokens in use before the call, %.0f after: %.0f granted, %d charged", before, after, granted, 3)
	if want := before + 3 + granted; after < want-0.01 || after > want+0.01 {
		t.Fatalf("Redis counts %.2f tokens in use; want %.0f (%.0f before, 3 admitted by fallback, %.0f granted)", after, want, before, granted)
	}
}

// resilientStack is cmd/extauthz's stack over store in mode ("redis" or
// "hybrid"): the mode's limiter behind Resilient, as many replicas as
// peers, and clk for every clock. hopts are hybrid's options but for
// its metrics, log and clock.
func resilientStack(t *testing.T, mode string, store *redisstore.Store, m *redisstore.Metrics, now func() time.Time, peers int64, hopts redisstore.HybridOptions) *redisstore.Resilient {
	t.Helper()
	return resilientStackOn(t, mode, store, newTable(t), m, now, peers, hopts)
}

// resilientStackOn is resilientStack over table, the per-key state the
// primary keeps (a test that wires store.ChargeDebtsOf(table), as
// redisstore.Open does, charges debts and window fallbacks as Redis
// comes back rather than with each key's next call).
func resilientStackOn(t *testing.T, mode string, store *redisstore.Store, table *redisstore.Table, m *redisstore.Metrics, now func() time.Time, peers int64, hopts redisstore.HybridOptions) *redisstore.Resilient {
	t.Helper()
	counts, err := local.NewTable(100)
	if err != nil {
		t.Fatal(err)
	}
	primary, levels := quota.Limiter(redisstore.NewRedis(store, table)), redisstore.LevelSource(table)
	if mode == "hybrid" {
		hopts.Metrics, hopts.Log, hopts.Now = m, quiet, now
		h := redisstore.NewHybrid(table, store, fixedPeers(peers), hopts)
		primary, levels = h, h // as cmd/extauthz wires it
	}
	return redisstore.NewResilient(primary, levels, local.NewFallback(counts), fixedPeers(peers), store).WithClock(now)
}

// A level Redis reported is stamped when its reply came, not when the
// decision began: the script ran at Redis TIME, which a call queued
// behind others (or sent late by a starved process) reaches late.
// Stamped at the decision's start, a fallback that refills from the
// level credits that stretch's refill again, which Redis gave out
// already. Here a CLIENT PAUSE holds the call 400ms and more: the
// fallback that follows may admit what Redis reported left plus what
// refills after the reply, not the 4 tokens that refilled while the call
// waited (it admitted 7 of a bound of 4 so, in both modes). Hybrid runs
// beside redis mode: what it has left of the slice the held call leased,
// then its fallback, admit no more than redis mode's fallback does.
//
// Real time, not an injected clock: the stamp is the call's real
// duration. The store's timeout is 2s (the default 150ms would give the
// held call up).
func TestFallbackLevelIsWhenRedisAnswered(t *testing.T) {
	for _, mode := range []string{"redis", "hybrid"} {
		t.Run(mode, func(t *testing.T) { testFallbackLevelIsWhenRedisAnswered(t, mode) })
	}
}

func testFallbackLevelIsWhenRedisAnswered(t *testing.T, mode string) {
	srv := testredis.Start(t)
	m := redisstore.NewMetrics(nil)
	store := redisstore.NewStore(srv.Client(), redisstore.StoreOptions{Prefix: "rl:", Timeout: 2 * time.Second, Metrics: m, Log: quiet})
	defer store.Close()
	r := resilientStack(t, mode, store, m, time.Now, 1, redisstore.HybridOptions{})
	l := quota.Limit{Limit: 10, Window: time.Second, OnError: quota.ErrorFallback} // a token every 100ms
	ctx := context.Background()
	// The bucket spent (no denial asked for: hybrid would cache it and
	// answer the next take without a call).
	for i := range l.Limit {
		if d, err := r.Take(ctx, "k", l, 1, time.Now()); err != nil || d.Degraded != 0 || !d.Allowed {
			t.Fatalf("take %d with Redis up: %+v %v", i, d, err)
		}
	}
	if err := srv.Client().Do(ctx, "CLIENT", "PAUSE", "400", "ALL").Err(); err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	d, err := r.Take(ctx, "k", l, 1, began)
	answered := time.Now()
	if err != nil || d.Degraded != 0 || !d.Allowed {
		t.Fatalf("the held take: %+v %v; want allowed by Redis (4 tokens refilled while it waited)", d, err)
	}
	if held := answered.Sub(began); held < 300*time.Millisecond {
		t.Fatalf("the take was held %v; CLIENT PAUSE 400 should have held it", held)
	}
	srv.Kill()
	// Every decision after at one instant, just after the reply: what
	// they admit (hybrid: what is left of the slice it leased, then the
	// fallback's) is the level they start from, with no refill after.
	at := time.Now()
	admitted, fallback := 0, 0
	for {
		d, err := r.Take(ctx, "k", l, 1, at)
		if err != nil {
			t.Fatal(err)
		}
		if !d.Allowed {
			break
		}
		if d.Degraded == quota.DegradedFallback {
			fallback++
		}
		if admitted++; admitted > 20 {
			t.Fatal("never denied")
		}
	}
	if fallback == 0 && mode == "redis" {
		t.Fatal("no decision by the fallback: the test proved nothing")
	}
	// What Redis held when it answered (hybrid: with the slice), plus a
	// token for each 100ms from then to the instant (and the one under
	// way).
	since := at.Sub(answered)
	if bound := d.Remaining + int64(since/(100*time.Millisecond)) + 1; int64(admitted) > bound {
		t.Fatalf("%d admitted (%d by the fallback) at one instant %v after Redis answered, reporting %d left: at most %d (the call was held %v: its refill is Redis's, given out already)",
			admitted, fallback, since.Round(time.Millisecond), d.Remaining, bound, answered.Sub(began).Round(time.Millisecond))
	}
	t.Logf("held %v; Redis reported %d left; %d admitted (%d by the fallback) at one instant %v after", answered.Sub(began).Round(time.Millisecond), d.Remaining, admitted, fallback, since.Round(time.Millisecond))
}
