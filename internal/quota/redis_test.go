package quota

import (
	"context"
	"io"
	"log/slog"
	"math/rand/v2"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/extauthz/extauthz/internal/metrics"
	"github.com/extauthz/extauthz/internal/testredis"
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
func newTestStore(t *testing.T, clk *clock) (*Store, *redis.Client, *metrics.Metrics) {
	t.Helper()
	srv := testredis.Start(t)
	rdb := srv.Client()
	m := metrics.New("test")
	opts := StoreOptions{Prefix: "rl:", Timeout: time.Second, Metrics: m, Log: quiet}
	if clk != nil {
		opts.Clock = clk.Now
	}
	s := NewStore(rdb, opts)
	t.Cleanup(s.Close)
	return s, rdb, m
}

// The Redis script and the local algorithm make the same decisions for the
// same sequence of instants. Waits may differ by a microsecond: the script
// counts in microseconds and rounds waits up.
func TestRedisMatchesLocal(t *testing.T) {
	clk := newClock()
	store, _, _ := newTestStore(t, clk)
	r := NewRedis(store)
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(1, 2))
	for _, l := range []Limit{
		{Limit: 100, Window: time.Minute},
		{Limit: 3, Window: time.Second, Burst: 5},
		{Limit: 7, Window: 10 * time.Second},
	} {
		var tat int64
		key := "t:" + intervalMicros(l)
		for i := 0; i < 400; i++ {
			clk.Advance(time.Duration(rng.IntN(int(l.Window/time.Duration(l.Limit)*2/time.Microsecond))) * time.Microsecond)
			var want Decision
			tat, want = tokenBucketTake(tat, clk.Now().UnixNano(), l)
			got, err := r.Take(ctx, key, l, clk.Now())
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

func TestLeasePartialGrantAndReturn(t *testing.T) {
	clk := newClock()
	store, rdb, _ := newTestStore(t, clk)
	ctx := context.Background()
	l := Limit{Limit: 10, Window: 10 * time.Second} // one token a second
	ls, err := store.lease(ctx, "p", l, 15)
	if err != nil || ls.granted != 10 || ls.remaining != 0 || ls.full != 10*time.Second {
		t.Fatalf("lease 15 of 10: %+v %v", ls, err)
	}
	ls, _ = store.lease(ctx, "p", l, 3)
	if ls.granted != 0 || ls.wait != time.Second {
		t.Fatalf("empty bucket: %+v, want nothing granted and a 1s wait", ls)
	}
	// Returning more than was taken cannot overfill the bucket.
	if err := store.giveBack(ctx, "p", 50); err != nil {
		t.Fatal(err)
	}
	if n := rdb.Exists(ctx, "rl:{p}").Val(); n != 0 {
		t.Fatalf("a full bucket should have no state; exists = %d", n)
	}
	ls, _ = store.lease(ctx, "p", l, 50)
	if ls.granted != 10 {
		t.Fatalf("after an over-return: granted %d, want the capacity of 10", ls.granted)
	}
	// The key expires once it would be full again.
	if ttl := rdb.PTTL(ctx, "rl:{p}").Val(); ttl <= 9*time.Second || ttl > 10*time.Second+10*time.Millisecond {
		t.Fatalf("PTTL = %v, want about 10s", ttl)
	}
	clk.Advance(4 * time.Second)
	store.giveBack(ctx, "p", 3) // 4 refilled + 3 returned: 7 available
	if ls, _ = store.lease(ctx, "p", l, 50); ls.granted != 7 {
		t.Fatalf("granted %d, want 7", ls.granted)
	}
}

func TestKeysAreHashTagged(t *testing.T) {
	store, rdb, _ := newTestStore(t, nil)
	if got := store.Key("orders:client:ada"); got != "rl:{orders:client:ada}" {
		t.Fatalf("Key = %q", got)
	}
	NewRedis(store).Take(context.Background(), "orders:client:ada", Limit{Limit: 5, Window: time.Minute}, time.Now())
	keys := rdb.Keys(context.Background(), "*").Val()
	if len(keys) != 1 || keys[0] != "rl:{orders:client:ada}" {
		t.Fatalf("keys = %v", keys)
	}
}

// The scripts keep working after Redis loses its script cache.
func TestScriptFlush(t *testing.T) {
	store, rdb, _ := newTestStore(t, nil)
	r := NewRedis(store)
	l := Limit{Limit: 5, Window: time.Minute}
	ctx := context.Background()
	if _, err := r.Take(ctx, "k", l, time.Now()); err != nil {
		t.Fatal(err)
	}
	rdb.ScriptFlush(ctx)
	if d, err := r.Take(ctx, "k", l, time.Now()); err != nil || !d.Allowed || d.Remaining != 3 {
		t.Fatalf("after SCRIPT FLUSH: %+v %v", d, err)
	}
}

// Redis losing the heartbeat set (a restart without persistence) does not
// make the replicas believe they are fewer while they re-register one by
// one: for one ttl each keeps its last count, then counts afresh.
func TestPeersSurviveALostSet(t *testing.T) {
	clk := newClock()
	store, rdb, m := newTestStore(t, clk)
	const ttl = 15 * time.Second
	var ps []*Peers
	for _, id := range []string{"a", "b", "c"} {
		p := NewPeers(store, id, ttl, 1, m, quiet)
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
	d := NewPeers(store, "d", ttl, 1, m, quiet)
	defer d.Close(ctx)
	if d.Count() != 3 {
		t.Fatalf("a new replica: %d, want 3", d.Count())
	}
}

func TestPeers(t *testing.T) {
	clk := newClock()
	store, _, m := newTestStore(t, clk)
	const ttl = 15 * time.Second
	a := NewPeers(store, "a", ttl, 1, m, quiet)
	defer a.Close(context.Background())
	if a.Count() != 1 {
		t.Fatalf("alone: %d", a.Count())
	}
	b := NewPeers(store, "b", ttl, 1, m, quiet)
	c := NewPeers(store, "c", ttl, 1, m, quiet)
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
	store.heartbeat(context.Background(), "b", ttl) // b's last beat, now
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
	store, _, m := newTestStore(t, clk)
	a := NewPeers(store, "a", 15*time.Second, 2, m, quiet)
	defer a.Close(context.Background())
	if a.Count() != 2 {
		t.Fatalf("first heartbeat, alone, min_peers 2: %d, want 2", a.Count())
	}
	clk.Advance(time.Second)
	a.Beat(context.Background())
	if a.Count() != 1 {
		t.Fatalf("second heartbeat, alone: %d, want 1", a.Count())
	}
	b := NewPeers(store, "b", 15*time.Second, 5, m, quiet)
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

func TestReplicaID(t *testing.T) {
	if id := ReplicaID("pod-7"); len(id) != len("pod-7-")+8 || id[:6] != "pod-7-" {
		t.Fatalf("ReplicaID = %q", id)
	}
}
