package quota_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/extauthz/extauthz/internal/quota"
	"github.com/extauthz/extauthz/internal/quota/redisstore"
	"github.com/extauthz/extauthz/tests/internal/testredis"
)

// clock is a settable time source shared by a test's limiters and the
// scripts' injected time.
type clock struct{ ns atomic.Int64 }

func newClock() *clock {
	c := &clock{}
	c.ns.Store(t0.UnixNano())
	return c
}
func (c *clock) Now() time.Time          { return time.Unix(0, c.ns.Load()) }
func (c *clock) Advance(d time.Duration) { c.ns.Add(int64(d)) }

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// newTestStore starts a redis-server and returns a store on it whose
// scripts use clk instead of Redis TIME.
func newTestStore(t *testing.T, clk *clock) (*redisstore.Store, *redis.Client, *redisstore.Metrics) {
	t.Helper()
	srv := testredis.Start(t)
	rdb := srv.Client()
	m := redisstore.NewMetrics(nil)
	opts := redisstore.StoreOptions{Prefix: "rl:", Timeout: time.Second, Metrics: m, Log: quiet}
	if clk != nil {
		opts.Clock = clk.Now
	}
	s := redisstore.NewStore(rdb, opts)
	t.Cleanup(s.Close)
	return s, rdb, m
}

// The Redis script and the local algorithm make the same decisions for the
// same sequence of instants. Waits may differ by a microsecond: the script
// counts in microseconds and rounds waits up.
func TestRedisMatchesLocal(t *testing.T) {
	clk := newClock()
	store, _, _ := newTestStore(t, clk)
	r := newRedis(t, store)
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(1, 2))
	for _, l := range []quota.Limit{
		{Limit: 100, Window: time.Minute},
		{Limit: 3, Window: time.Second, Burst: 5},
		{Limit: 7, Window: 10 * time.Second},
	} {
		var local quota.State
		key := fmt.Sprintf("t:%d:%v:%d", l.Limit, l.Window, l.Burst)
		for i := 0; i < 400; i++ {
			clk.Advance(time.Duration(rng.IntN(int(l.Window/time.Duration(l.Limit)*2/time.Microsecond))) * time.Microsecond)
			want, _ := local.Take(l, 1, clk.Now().UnixNano())
			got, err := r.Take(ctx, key, l, 1, clk.Now())
			if err != nil {
				t.Fatal(err)
			}
			if got.Allowed != want.Allowed || got.Remaining != want.Remaining ||
				absDur(got.RetryAfter-want.RetryAfter) > 2*time.Microsecond || absDur(got.ResetAfter-want.ResetAfter) > 2*time.Microsecond {
				t.Fatalf("%+v step %d: redis %+v, local %+v", l, i, got, want)
			}
		}
	}
}

func absDur(d time.Duration) time.Duration {
	if d < 0 {
		return -d
	}
	return d
}

// bucket_lease.lua grants what is left when fewer tokens remain than are
// wanted, and bucket_return.lua never fills a bucket above its capacity:
// the scripts' own contract, run as the store runs them (with the clock
// prelude, and an injected time).
func TestLeasePartialGrantAndReturn(t *testing.T) {
	srv := testredis.Start(t)
	rdb := srv.Client()
	clk := newClock()
	// One token a second, capacity 10: the interval in µs, the capacity,
	// the tokens wanted at most and needed at least (one: a partial grant
	// is welcome), the time.
	lease := func(want int) (granted, remaining, wait, full int64) {
		t.Helper()
		r := runScript(t, rdb, "bucket_lease", []string{"rl:{p}"}, "1000000.000", 10, want, 1, clk.Now().UnixMicro())
		return r[0], r[1], r[2], r[3]
	}
	giveBack := func(n int) {
		t.Helper()
		runScript(t, rdb, "bucket_return", []string{"rl:{p}"}, n, clk.Now().UnixMicro())
	}
	if g, rem, _, full := lease(15); g != 10 || rem != 0 || full != 10_000_000 {
		t.Fatalf("lease 15 of 10: granted %d, remaining %d, full in %dµs", g, rem, full)
	}
	if g, _, wait, _ := lease(3); g != 0 || wait != 1_000_000 {
		t.Fatalf("empty bucket: granted %d, wait %dµs; want nothing and a 1s wait", g, wait)
	}
	// Returning more than was taken cannot overfill the bucket.
	giveBack(50)
	if n := rdb.Exists(context.Background(), "rl:{p}").Val(); n != 0 {
		t.Fatalf("a full bucket should have no state; exists = %d", n)
	}
	if g, _, _, _ := lease(50); g != 10 {
		t.Fatalf("after an over-return: granted %d, want the capacity of 10", g)
	}
	clk.Advance(4 * time.Second)
	giveBack(3) // 4 refilled + 3 returned: 7 available
	if g, _, _, _ := lease(50); g != 7 {
		t.Fatalf("granted %d, want 7", g)
	}
}

// A debt (what a replica admitted by fallback while its master was down)
// is charged before anything is granted, below empty by one capacity at
// most: the wait then covers the deficit.
func TestLeaseChargesDebtBelowEmpty(t *testing.T) {
	srv := testredis.Start(t)
	rdb := srv.Client()
	clk := newClock()
	// One token a second, capacity 10; ask for one, owing debt.
	lease := func(key string, debt int) (granted, remaining, wait int64) {
		t.Helper()
		r := runScript(t, rdb, "bucket_lease", []string{key}, "1000000.000", 10, 1, 1, clk.Now().UnixMicro(), debt)
		return r[0], r[1], r[2]
	}
	if g, rem, _ := lease("rl:{a}", 4); g != 1 || rem != 5 {
		t.Fatalf("full bucket owing 4: granted %d, remaining %d; want 1 and 5", g, rem)
	}
	// 15 owed of a full 10: 5 below empty, and the next token 6s away.
	if g, _, wait := lease("rl:{b}", 15); g != 0 || wait != 6_000_000 {
		t.Fatalf("owing 15 of 10: granted %d, wait %dµs; want none and 6s", g, wait)
	}
	// 50 owed: charged down to one capacity below empty, 11s to a token.
	if g, _, wait := lease("rl:{c}", 50); g != 0 || wait != 11_000_000 {
		t.Fatalf("owing 50 of 10: granted %d, wait %dµs; want none and 11s", g, wait)
	}
}

// runScript runs one of the store's Lua scripts, with the clock prelude
// every script starts with, from the source tree.
func runScript(t *testing.T, rdb *redis.Client, name string, keys []string, args ...any) []int64 {
	t.Helper()
	v, err := rdb.Eval(context.Background(), scriptSource(t, name), keys, args...).Result()
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	var out []int64
	if list, ok := v.([]any); ok {
		for _, x := range list {
			n, _ := x.(int64)
			out = append(out, n)
		}
	}
	return out
}

// scriptSource is the store's Lua script name as it is sent to Redis.
func scriptSource(t *testing.T, name string) string {
	t.Helper()
	src, ok := redisstore.ScriptSource(name)
	if !ok {
		t.Fatalf("no script %s", name)
	}
	return src
}

func TestKeysAreHashTagged(t *testing.T) {
	store, rdb, _ := newTestStore(t, nil)
	newRedis(t, store).Take(context.Background(), "orders:client:ada", quota.Limit{Limit: 5, Window: time.Minute}, 1, time.Now())
	keys := rdb.Keys(context.Background(), "*").Val()
	if len(keys) != 1 || keys[0] != "rl:{orders:client:ada}" {
		t.Fatalf("keys = %v", keys)
	}
}

// The scripts keep working after Redis loses its script cache.
func TestScriptFlush(t *testing.T) {
	store, rdb, _ := newTestStore(t, nil)
	r := newRedis(t, store)
	l := quota.Limit{Limit: 5, Window: time.Minute}
	ctx := context.Background()
	if _, err := r.Take(ctx, "k", l, 1, time.Now()); err != nil {
		t.Fatal(err)
	}
	rdb.ScriptFlush(ctx)
	if d, err := r.Take(ctx, "k", l, 1, time.Now()); err != nil || !d.Allowed || d.Remaining != 3 {
		t.Fatalf("after SCRIPT FLUSH: %+v %v", d, err)
	}
}

// Redis losing the heartbeat set (a restart without persistence) does not
// make the replicas believe they are fewer while they re-register one by
// one: for one ttl each keeps its last count, then counts afresh.
func TestPeersSurviveALostSet(t *testing.T) {
	clk := newClock()
	store, rdb, _ := newTestStore(t, clk)
	const ttl = 15 * time.Second
	var ps []*redisstore.Peers
	for _, id := range []string{"a", "b", "c"} {
		p := redisstore.NewPeers(store, id, ttl, 1, quiet)
		defer p.Close(context.Background())
		ps = append(ps, p)
	}
	ctx := context.Background()
	for _, p := range ps {
		p.Beat(ctx)
	}
	for _, p := range ps {
		if p.Count() != 3 {
			t.Fatalf("%s before the loss: %d", p.ID(), p.Count())
		}
	}
	rdb.FlushAll(ctx)
	clk.Advance(time.Second)
	ps[0].Beat(ctx) // the first to re-register finds itself alone
	if ps[0].Count() != 3 {
		t.Fatalf("a re-registering alone: %d, want the last count 3", ps[0].Count())
	}
	ps[1].Beat(ctx)
	if ps[1].Count() != 3 {
		t.Fatalf("b re-registering second: %d, want 3", ps[1].Count())
	}
	// c really left while Redis was gone: once the ttl has passed, the
	// others count what the rebuilt set holds.
	ps[2].Close(ctx)
	clk.Advance(ttl)
	ps[0].Beat(ctx)
	if ps[0].Count() != 2 {
		t.Fatalf("a after the ttl: %d, want 2", ps[0].Count())
	}
	// A fresh replica's first heartbeat is no loss: it counts at once.
	d := redisstore.NewPeers(store, "d", ttl, 1, quiet)
	defer d.Close(ctx)
	if d.Count() != 3 {
		t.Fatalf("a new replica: %d, want 3", d.Count())
	}
}

func TestPeers(t *testing.T) {
	clk := newClock()
	store, rdb, _ := newTestStore(t, clk)
	const ttl = 15 * time.Second
	a := redisstore.NewPeers(store, "a", ttl, 1, quiet)
	defer a.Close(context.Background())
	if a.Count() != 1 {
		t.Fatalf("alone: %d", a.Count())
	}
	b := redisstore.NewPeers(store, "b", ttl, 1, quiet)
	c := redisstore.NewPeers(store, "c", ttl, 1, quiet)
	a.Beat(context.Background())
	if a.Count() != 3 {
		t.Fatalf("three replicas: %d", a.Count())
	}
	// c leaves: the count is the highest of the last ttl, so it stays 3
	// for one ttl (as long as a replica that vanished is counted), then 2.
	c.Close(context.Background())
	clk.Advance(time.Second)
	b.Beat(context.Background())
	a.Beat(context.Background())
	if a.Count() != 3 {
		t.Fatalf("1s after c left: %d, want the highest count of the last %v, 3", a.Count(), ttl)
	}
	clk.Advance(ttl)
	b.Beat(context.Background())
	a.Beat(context.Background())
	if a.Count() != 2 {
		t.Fatalf("a ttl after c left: %d, want 2", a.Count())
	}
	// b falls silent: heard now, it counts for one ttl more; a's
	// high-water of 2 is refreshed by every beat that hears 2.
	b.Close(context.Background())
	// b's last beat, now: the heartbeat script, as b's loop would run it.
	runScript(t, rdb, "peers", []string{redisstore.PeersKey("rl:")}, "b", ttl.Milliseconds(), clk.Now().UnixMicro())
	clk.Advance(10 * time.Second)
	a.Beat(context.Background())
	if a.Count() != 2 {
		t.Fatalf("within b's ttl: %d", a.Count())
	}
	clk.Advance(6 * time.Second) // b expires from the set
	a.Beat(context.Background())
	if a.Count() != 2 {
		t.Fatalf("b just expired, 6s after a last heard 2: %d, want 2", a.Count())
	}
	clk.Advance(ttl)
	a.Beat(context.Background())
	if a.Count() != 1 {
		t.Fatalf("a ttl after b expired: %d, want 1", a.Count())
	}
}

// A replica's first heartbeat sees only the replicas that started before
// it, so until its second it assumes at least min_peers; from the second
// on, what it hears.
func TestPeersMinPeersUntilTheSecondHeartbeat(t *testing.T) {
	clk := newClock()
	store, _, _ := newTestStore(t, clk)
	a := redisstore.NewPeers(store, "a", 15*time.Second, 2, quiet)
	defer a.Close(context.Background())
	if a.Count() != 2 {
		t.Fatalf("first heartbeat, alone, min_peers 2: %d, want 2", a.Count())
	}
	clk.Advance(time.Second)
	a.Beat(context.Background())
	if a.Count() != 1 {
		t.Fatalf("second heartbeat, alone: %d, want 1", a.Count())
	}
	b := redisstore.NewPeers(store, "b", 15*time.Second, 5, quiet)
	defer b.Close(context.Background())
	if b.Count() != 5 {
		t.Fatalf("first heartbeat of b hearing 2, min_peers 5: %d, want 5", b.Count())
	}
	clk.Advance(time.Second)
	b.Beat(context.Background())
	if b.Count() != 2 {
		t.Fatalf("second heartbeat of b: %d, want the 2 it hears", b.Count())
	}
}

// newTable is a table of the levels Redis reports and hybrid slices.
// pipeStore returns a store on addrs over the clients cmd/extauthz uses
// (autopipelined, a probe connection of its own) at the shipped breaker
// timings, named name, with its metrics; clock is the scripts' (nil:
// Redis TIME). Both close with the test.
func pipeStore(t *testing.T, addrs []string, name string, clock func() time.Time) (*redisstore.Store, *redisstore.Metrics) {
	t.Helper()
	clients, err := redisstore.NewClients(redisstore.ClientOptions{Addrs: addrs, Name: name})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { clients.Close() })
	m := redisstore.NewMetrics(nil)
	store := redisstore.NewStore(clients.Pipe, clients.StoreOptions(redisstore.StoreOptions{Prefix: "rl:", Metrics: m, Log: quiet, Clock: clock}))
	t.Cleanup(store.Close)
	return store, m
}

func newTable(t testing.TB) *redisstore.Table {
	t.Helper()
	table, err := redisstore.NewTable(1000)
	if err != nil {
		t.Fatal(err)
	}
	return table
}

// newRedis is a redis-mode limiter on store with a table of its own.
func newRedis(t testing.TB, store *redisstore.Store) *redisstore.Redis {
	t.Helper()
	return redisstore.NewRedis(store, newTable(t))
}

// t0 is on a minute, so window boundaries fall on whole minutes after it.
var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func at(d time.Duration) time.Time { return t0.Add(d) }

type fixedPeers int64

func (p fixedPeers) Count() int64 { return int64(p) }
