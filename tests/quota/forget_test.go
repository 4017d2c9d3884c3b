package quota_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/redis/go-redis/v9"

	"github.com/extauthz/extauthz/internal/quota"
	"github.com/extauthz/extauthz/internal/quota/redisstore"
	"github.com/extauthz/extauthz/tests/internal/testredis"
)

// When Redis forgets what it leased (docs/reliability.md, "When Redis
// forgets"), the replicas' leases are no longer counted there: a replica
// must not give their tokens back and must charge what it spent of them,
// so that from the loss on the replicas together admit at most one fresh
// bucket. These tests drive the hybrid limiter on a frozen clock (no
// refill), so the counts are exact.

// forgetLimit is 600 a minute (capacity 600): with three replicas a slice
// is at most 600 / (4 × 3) = 50 tokens.
var forgetLimit = quota.Limit{Limit: 600, Window: time.Minute}

const forgetSlice = 50

// takeN makes n decisions for key on r at clk's now and returns how many
// were admitted.
func takeN(t *testing.T, h *redisstore.Hybrid, clk *clock, key string, n int) int {
	t.Helper()
	admitted := 0
	for i := 0; i < n; i++ {
		d, err := h.Take(context.Background(), key, forgetLimit, 1, clk.Now())
		if err != nil {
			t.Fatalf("take: %v", err)
		}
		if d.Allowed {
			admitted++
		}
	}
	return admitted
}

// drain sends key's requests to the replicas in turn until each has been
// denied three times in a row, and returns the admissions: on a frozen
// clock, what is left of the bucket and of the leases the replicas may
// still spend.
func drain(t *testing.T, hs []*redisstore.Hybrid, clk *clock, key string) int {
	t.Helper()
	admitted, denied := 0, make([]int, len(hs))
	for i := 0; i < 5000; i++ {
		done := true
		for _, d := range denied {
			done = done && d >= 3
		}
		if done {
			return admitted
		}
		r := i % len(hs)
		if takeN(t, hs[r], clk, key, 1) == 1 {
			admitted++
			denied[r] = 0
		} else {
			denied[r]++
		}
	}
	t.Fatalf("key %s: still admitting after 5000 decisions on a frozen clock", key)
	return 0
}

// The key's state is lost while three replicas hold leases (deleted, as
// an eviction or a flush does): each replica spends what it still holds,
// and the call that retires its lease learns Redis no longer holds the
// grant, gives nothing back and charges what it spent of the lease. From
// the loss on, the replicas admit at most one fresh bucket (600), and at
// least that less what they spent of their leases before the loss (one
// slice each at most): what is paid twice.
func TestHybridLeaseRedisLostIsChargedPerKey(t *testing.T) {
	srv := testredis.Start(t)
	rdb := srv.Client()
	clk := newClock()
	reps := newReplicas(t, rdb, clk, 3, 1000, time.Hour)
	hs := []*redisstore.Hybrid{reps[0].h, reps[1].h, reps[2].h}
	before := 0
	for _, h := range hs {
		before += takeN(t, h, clk, "lost", 10)
	}
	if before != 30 {
		t.Fatalf("admitted %d of the first 30, far from the limit", before)
	}
	if err := rdb.Del(context.Background(), "rl:{lost}").Err(); err != nil {
		t.Fatal(err)
	}
	after := drain(t, hs, clk, "lost")
	forgotten := 0.0
	for _, r := range reps {
		forgotten += testutil.ToFloat64(r.m.LeasesForgotten)
	}
	t.Logf("after the key was lost: %d admitted (a fresh bucket: 600); %v leases found forgotten", after, forgotten)
	if after > 600 {
		t.Errorf("admitted %d after the key was lost; one fresh bucket allows 600", after)
	}
	if after < 600-3*forgetSlice {
		t.Errorf("admitted %d after the key was lost; want at least 600 less a slice per replica (%d): more was charged than the leases spent", after, 600-3*forgetSlice)
	}
	if forgotten != 3 {
		t.Errorf("%v leases counted as forgotten, want the 3 held", forgotten)
	}
}

// A give-back to a Redis that lost the lease credits nothing: replica a
// holds a lease when the key is flushed, b drains the fresh bucket, and
// a's shutdown returns its unspent tokens, which this Redis never
// debited. A third replica then finds nothing left (frozen clock).
func TestHybridGiveBackToARedisThatForgotCreditsNothing(t *testing.T) {
	srv := testredis.Start(t)
	rdb := srv.Client()
	clk := newClock()
	reps := newReplicas(t, rdb, clk, 3, 1000, time.Hour)
	a, b, c := reps[0].h, reps[1].h, reps[2].h
	takeN(t, a, clk, "back", 10) // a holds 40 unspent of a 49-token lease
	if err := rdb.FlushAll(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	fresh := drain(t, []*redisstore.Hybrid{b}, clk, "back")
	a.Close(context.Background()) // gives back what it holds
	late := drain(t, []*redisstore.Hybrid{c}, clk, "back")
	t.Logf("b admitted %d from the fresh bucket; after a's give-back c admitted %d", fresh, late)
	if fresh != 600 {
		t.Errorf("b admitted %d from a fresh bucket of 600", fresh)
	}
	if late != 0 {
		t.Errorf("c admitted %d after a gave back a lease this Redis never granted; want 0", late)
	}
	if f := testutil.ToFloat64(reps[0].m.LeasesForgotten); f != 1 {
		t.Errorf("a counted %v leases forgotten at its give-back, want 1", f)
	}
}

// heartbeatReplicas are newReplicas with a real heartbeat each
// (redisstore.Peers), watched by the replica's hybrid limiter.
func heartbeatReplicas(t *testing.T, rdb *redis.Client, clk *clock, n int) ([]*redisstore.Hybrid, []*redisstore.Peers, []*redisstore.Metrics) {
	t.Helper()
	var hs []*redisstore.Hybrid
	var ps []*redisstore.Peers
	var ms []*redisstore.Metrics
	for i := 0; i < n; i++ {
		m := redisstore.NewMetrics(nil)
		store := redisstore.NewStore(rdb, redisstore.StoreOptions{Prefix: "rl:", Timeout: time.Second, Metrics: m, Log: quiet, Clock: clk.Now})
		table, err := redisstore.NewTable(1000)
		if err != nil {
			t.Fatal(err)
		}
		p := redisstore.NewPeers(store, fmt.Sprintf("r%d", i), time.Minute, n, quiet)
		h := redisstore.NewHybrid(table, store, fixedPeers(n), redisstore.HybridOptions{SliceIdle: time.Hour, Metrics: m, Log: quiet, Now: clk.Now})
		p.Watch(h)
		t.Cleanup(func() { h.Close(context.Background()); p.Close(context.Background()); store.Close() })
		hs, ps, ms = append(hs, h), append(ps, p), append(ms, m)
	}
	return hs, ps, ms
}

// FLUSHALL while three replicas hold leases, learnt through the
// heartbeat (the epoch key is gone): every lease stops at once (its
// unspent tokens are never spent) and the key's next call charges only
// what was spent of it since the last heartbeat that found Redis
// unchanged. From the flush on the replicas admit at most one fresh
// bucket, and at least that less the 5 units each spent since that
// heartbeat. (The heartbeats also run once a second on their own: one
// that lands between the manual ones only charges less.)
func TestHybridHeartbeatStopsLeasesWhenRedisForgets(t *testing.T) {
	srv := testredis.Start(t)
	rdb := srv.Client()
	clk := newClock()
	hs, ps, ms := heartbeatReplicas(t, rdb, clk, 3)
	ctx := context.Background()
	for _, h := range hs {
		takeN(t, h, clk, "flushed", 10)
	}
	for _, p := range ps {
		p.CheckState(ctx) // the state the leases were granted in, confirmed
	}
	for _, h := range hs {
		takeN(t, h, clk, "flushed", 5) // spent since the confirmation
	}
	if err := rdb.FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	for _, p := range ps {
		p.CheckState(ctx)
	}
	after := drain(t, hs, clk, "flushed")
	lost := 0.0
	for _, m := range ms {
		lost += testutil.ToFloat64(m.StateLost.WithLabelValues("epoch"))
	}
	t.Logf("after FLUSHALL: %d admitted (a fresh bucket: 600; 15 spent since the last confirmed heartbeat); %v heartbeats found the epoch gone", after, lost)
	if lost < 3 {
		t.Errorf("%v replicas learnt of the flush from the epoch key, want 3", lost)
	}
	if after > 600 || after < 600-15 {
		t.Errorf("admitted %d after the flush; want 585 to 600: one fresh bucket, less at most what was spent since the last confirmed heartbeat (5 per replica)", after)
	}
}

// A restart that loads an RDB (as a failover promotes a replica): run_id
// changes, so every lease stops; the key's next call finds whether the
// state loaded holds the lease. Key kept was leased before the SAVE: its
// lease is known, its parked tokens go back, nothing is charged, and the
// replicas admit exactly what Redis held. Key lost was leased after the
// SAVE (an older RDB): forgotten, charged what was spent since the last
// confirmed heartbeat.
func TestHybridRestoredRDBKeepsWhatItHolds(t *testing.T) {
	srv := testredis.Start(t)
	rdb := srv.Client()
	clk := newClock()
	hs, ps, ms := heartbeatReplicas(t, rdb, clk, 3)
	ctx := context.Background()
	for _, h := range hs {
		takeN(t, h, clk, "kept", 10)
	}
	if err := rdb.Save(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	for _, h := range hs {
		takeN(t, h, clk, "lost", 10)
	}
	for _, p := range ps {
		p.CheckState(ctx)
	}
	srv.Restart() // loads the RDB saved above
	// The breaker marks the store down and up again; as it comes back,
	// Warm reads the new run_id, before decisions reach Redis.
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, err := hs[0].Take(ctx, "probe", forgetLimit, 0, clk.Now())
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the store did not come back within 10s: %v", err)
		}
		time.Sleep(20 * time.Millisecond) // polling for the breaker to close
	}
	for _, p := range ps {
		p.CheckState(ctx)
	}
	kept := drain(t, hs, clk, "kept")
	lost := drain(t, hs, clk, "lost")
	runID, forgotten := 0.0, 0.0
	for _, m := range ms {
		runID += testutil.ToFloat64(m.StateLost.WithLabelValues("run_id"))
		forgotten += testutil.ToFloat64(m.LeasesForgotten)
	}
	t.Logf("after a restart from an RDB: key kept %d admitted (570 left), key lost %d (a fresh bucket: 600); %v replicas saw the run_id change; %v leases forgotten", kept, lost, runID, forgotten)
	if runID < 3 {
		t.Errorf("%v replicas learnt of the restart from run_id, want 3", runID)
	}
	if kept != 570 {
		t.Errorf("key kept: admitted %d after the restart; the RDB held its leases, so exactly the 570 left", kept)
	}
	if lost > 600 || lost < 600-3*10 {
		t.Errorf("key lost: admitted %d after the restart; want 570 to 600: a fresh bucket, less at most what was spent of the lost leases", lost)
	}
	if forgotten != 3 {
		t.Errorf("%v leases forgotten, want the 3 of key lost", forgotten)
	}
}

// One key evicted under maxmemory (allkeys-lru and volatile-lru): Redis
// drops the bucket while the replicas hold leases of it, and its leases
// are settled per key as above.
func TestHybridEvictedKeyIsChargedPerKey(t *testing.T) {
	for _, policy := range []string{"allkeys-lru", "volatile-lru"} {
		t.Run(policy, func(t *testing.T) {
			srv := testredis.Start(t, "--maxmemory-policy", policy)
			rdb := srv.Client()
			clk := newClock()
			reps := newReplicas(t, rdb, clk, 3, 1000, time.Hour)
			hs := []*redisstore.Hybrid{reps[0].h, reps[1].h, reps[2].h}
			ctx := context.Background()
			for _, h := range hs {
				takeN(t, h, clk, "evicted", 10)
			}
			// Lower maxmemory below what is used: the next write evicts
			// until Redis fits, and the bucket is the only key there is
			// (under volatile-lru, the only one with a TTL too).
			info, err := rdb.Info(ctx, "memory").Result()
			if err != nil {
				t.Fatal(err)
			}
			var mem int64
			fmt.Sscanf(info[strings.Index(info, "used_memory:")+len("used_memory:"):], "%d", &mem)
			if err := rdb.ConfigSet(ctx, "maxmemory", fmt.Sprint(mem-512)).Err(); err != nil {
				t.Fatal(err)
			}
			rdb.Set(ctx, "trigger", "x", 0) // refused (OOM) once nothing is left to evict: the eviction is what counts
			if err := rdb.ConfigSet(ctx, "maxmemory", "0").Err(); err != nil {
				t.Fatal(err)
			}
			if n, _ := rdb.Exists(ctx, "rl:{evicted}").Result(); n != 0 {
				t.Fatal("the bucket was not evicted")
			}
			if ev := infoField(t, rdb, "stats", "evicted_keys"); ev < 1 {
				t.Fatalf("Redis reports %d keys evicted", ev)
			}
			after := drain(t, hs, clk, "evicted")
			t.Logf("%s: after the bucket was evicted %d admitted (a fresh bucket: 600)", policy, after)
			if after > 600 || after < 600-3*forgetSlice {
				t.Errorf("admitted %d after the eviction; want at most a fresh bucket (600), at least that less a slice per replica", after)
			}
		})
	}
}

// infoField reads an integer field of INFO section.
func infoField(t *testing.T, rdb *redis.Client, section, field string) int64 {
	t.Helper()
	info, err := rdb.Info(context.Background(), section).Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(info, "\r\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			n, _ := strconv.ParseInt(v, 10, 64)
			return n
		}
	}
	t.Fatalf("INFO %s has no %s", section, field)
	return 0
}
