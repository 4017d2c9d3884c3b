package quota_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/extauthz/extauthz/internal/quota"
	"github.com/extauthz/extauthz/tests/internal/testredis"
)

// blockLimits are the limits block_for applies to, small enough that
// random traffic reaches them often; the blocks (3s) are a few windows
// long, so a run sees keys blocked, released and blocked again.
var blockLimits = []quota.Limit{
	{Algorithm: quota.TokenBucket, Limit: 10, Window: 2 * time.Second, BlockFor: 3 * time.Second},
	{Algorithm: quota.TokenBucket, Limit: 5, Window: time.Second, Burst: 12, BlockFor: 3 * time.Second},
	{Algorithm: quota.FixedWindow, Limit: 10, Window: 2 * time.Second, BlockFor: 3 * time.Second},
	{Algorithm: quota.SlidingWindow, Limit: 10, Window: 2 * time.Second, BlockFor: 3 * time.Second},
	{Algorithm: quota.TokenBucket, Limit: 100, Window: 10 * time.Second, Overdraft: true, BlockFor: 3 * time.Second},
	// Calendar windows of a day: the blocks are shorter than a window, so
	// a day's count, once spent, blocks again at each block's end.
	{Algorithm: quota.FixedWindow, Limit: 40, Window: 24 * time.Hour, Calendar: quota.NewCalendar(quota.Day, time.UTC), BlockFor: 3 * time.Second},
}

// The scripts keep the penalty box as the Go state does, on the same
// instants: the denial that starts a block, every take, question and
// refund during it, and the counts when it ends, with the same remaining
// counts and (to the microsecond the scripts count in) the same waits.
func TestRedisBlocksMatchLocal(t *testing.T) {
	clk := newClock()
	store, _, _ := newTestStore(t, clk)
	r := newRedis(t, store)
	ctx := context.Background()
	for li, l := range blockLimits {
		var local quota.State
		key := fmt.Sprintf("block:%d", li)
		rng := rand.New(rand.NewPCG(3, uint64(li)))
		var blocks, during int
		for i := 0; i < 800; i++ {
			clk.Advance(time.Duration(rng.Int64N(int64(150*time.Millisecond/time.Microsecond))) * time.Microsecond)
			n := int64(1)
			switch rng.IntN(6) {
			case 0:
				n = 0
			case 1:
				n = 1 + rng.Int64N(4)
			}
			ns := clk.Now().UnixNano()
			want, _ := local.Take(l, n, ns)
			got, err := r.Take(ctx, key, l, n, clk.Now())
			if err != nil {
				t.Fatal(err)
			}
			if got.Allowed != want.Allowed || got.Remaining != want.Remaining ||
				absDur(got.RetryAfter-want.RetryAfter) > 2*time.Microsecond || absDur(got.ResetAfter-want.ResetAfter) > 2*time.Microsecond {
				t.Fatalf("%+v step %d (%d units): redis %+v, local %+v", l, i, n, got, want)
			}
			switch {
			case !got.Allowed && got.RetryAfter == l.BlockFor:
				blocks++
			case !got.Allowed:
				during++
			}
			if got.Allowed && n > 0 && !l.Charges(n) && rng.IntN(8) == 0 {
				local.Refund(l, 1, ns)
				if err := r.Refund(ctx, key, l, 1, clk.Now()); err != nil {
					t.Fatal(err)
				}
			}
		}
		t.Logf("%s: %d blocks started, %d denials during them", l.Algorithm, blocks, during)
		if blocks < 3 || during == 0 {
			t.Fatalf("%+v: %d blocks, %d denials in them; the run never exercised the box", l, blocks, during)
		}
	}
}

// A block outlives everything else the key holds: a bucket refilled to
// full (which the script would otherwise delete) and a window long over
// still answer the block, and the key's TTL covers it.
func TestRedisBlockOutlivesTheCount(t *testing.T) {
	clk := newClock()
	store, rdb, _ := newTestStore(t, clk)
	r := newRedis(t, store)
	ctx := context.Background()
	const block = 10 * time.Minute
	for _, tc := range []struct {
		l      quota.Limit
		suffix string
	}{
		{quota.Limit{Algorithm: quota.TokenBucket, Limit: 2, Window: time.Second, BlockFor: block}, ""},
		{quota.Limit{Algorithm: quota.FixedWindow, Limit: 2, Window: time.Second, BlockFor: block}, ":fw"},
		{quota.Limit{Algorithm: quota.SlidingWindow, Limit: 2, Window: time.Second, BlockFor: block}, ":sw"},
	} {
		key := "outlive:" + tc.l.Algorithm.String()
		var sent time.Time
		for i := 0; i < 3; i++ {
			sent = time.Now() // the denying call's: its PEXPIRE runs after this
			r.Take(ctx, key, tc.l, 1, clk.Now())
		}
		// Redis counts a TTL down on its own clock from the call that set
		// it: by the time PTTL reads it, what has passed since the call
		// was sent is gone from it (a few ms on a loaded machine).
		ttl, err := rdb.PTTL(ctx, "rl:{"+key+"}"+tc.suffix).Result()
		if err != nil || ttl < block-time.Since(sent) {
			t.Fatalf("%s: TTL %s (%v) %s after the denying call was sent, want at least the block's %s less that", tc.l.Algorithm, ttl, err, time.Since(sent), block)
		}
		clk.Advance(9 * time.Minute)
		d, err := r.Take(ctx, key, tc.l, 0, clk.Now())
		if err != nil || d.Allowed || d.RetryAfter != time.Minute || d.ResetAfter != time.Minute || d.Remaining != 0 {
			t.Fatalf("%s: a question 9m into the block: %+v, %v; want denied for 1m", tc.l.Algorithm, d, err)
		}
		clk.Advance(time.Minute)
		if d, err := r.Take(ctx, key, tc.l, 1, clk.Now()); err != nil || !d.Allowed || d.Remaining != 1 {
			t.Fatalf("%s: after the block: %+v, %v; want admitted, 1 left", tc.l.Algorithm, d, err)
		}
		clk.Advance(-10 * time.Minute) // the next algorithm's key starts where this one did
	}
}

// Three hybrid replicas share a blocked key: a replica asking Redis once
// the block began is denied until its end, its cached denial telling the
// time left; a replica that held a lease when the block began may spend
// what it holds, never more. The block does not reach into leases (the
// smallest honest design: the scripts stop granting, the replicas learn
// of the block at their next call). So the bound is what was out on
// leases when the block began: at most a slice per replica (a quarter of
// the bucket over the replicas, hybrid.go), and when every replica kept
// spending up to the limit, slices shrunk to about a request each.
//
// The run is deterministic (the clock stands still while the replicas
// spend, so nothing refills before the block), which makes the bound a
// figure: the denial that starts the block comes when Redis has nothing
// left to lease, so what was out on leases then is the capacity less what
// was admitted before it, and the replicas spend exactly that during the
// block. The units Inspect reports leased must agree with it.
func TestHybridBlockBound(t *testing.T) {
	srv := testredis.Start(t)
	rdb := srv.Client()
	const block = 30 * time.Second
	for _, l := range []quota.Limit{
		{Algorithm: quota.TokenBucket, Limit: 300, Window: time.Minute, BlockFor: block},
		{Algorithm: quota.FixedWindow, Limit: 300, Window: 10 * time.Minute, BlockFor: block},
		{Algorithm: quota.SlidingWindow, Limit: 300, Window: 10 * time.Minute, BlockFor: block},
	} {
		for _, idle := range []bool{false, true} {
			name := l.Algorithm.String() + map[bool]string{false: "/all_spending", true: "/one_idle"}[idle]
			t.Run(name, func(t *testing.T) {
				testHybridBlockBound(t, rdb, l, idle)
			})
		}
	}
}

// testHybridBlockBound drives three replicas to l's limit, the third
// leasing a slice early and then idle when idle is set, and measures what
// they admit during the block against what they held leased.
func testHybridBlockBound(t *testing.T, rdb *redis.Client, l quota.Limit, idle bool) {
	ctx := context.Background()
	block := l.BlockFor
	clk := newClock()
	clk.Advance(time.Hour) // a window's start: the windows' whole limit is there
	reps := newReplicas(t, rdb, clk, 3, 1000, time.Hour)
	key := fmt.Sprintf("boxed:%s:%v", l.Algorithm, idle)
	spenders := 3
	var admitted int64 // before the block
	if idle {
		if d, err := reps[2].h.Take(ctx, key, l, 1, clk.Now()); err != nil || !d.Allowed {
			t.Fatalf("the first take: %+v, %v", d, err)
		}
		admitted++
		spenders = 2
	}
	// The spenders take until one is denied: the block starts there.
	for i := 0; ; i++ {
		d, err := reps[i%spenders].h.Take(ctx, key, l, 1, clk.Now())
		if err != nil {
			t.Fatal(err)
		}
		if d.Allowed {
			admitted++
			continue
		}
		if d.RetryAfter != block {
			t.Fatalf("the denial at the limit: %+v, want a block of %s", d, block)
		}
		break
	}
	var held int64
	for _, r := range reps {
		in, err := r.h.Inspect(ctx, key, l, clk.Now())
		if err != nil {
			t.Fatal(err)
		}
		held += in.Leased
	}
	clk.Advance(10 * time.Second)
	var during int64
	for i, r := range reps {
		for {
			d, err := r.h.Take(ctx, key, l, 1, clk.Now())
			if err != nil {
				t.Fatal(err)
			}
			if !d.Allowed {
				if d.RetryAfter != block-10*time.Second || d.ResetAfter != block-10*time.Second || d.Remaining != 0 {
					t.Fatalf("replica %d during the block: %+v, want denied for %s", i, d, block-10*time.Second)
				}
				break
			}
			during++
		}
	}
	// What was out on leases when the block began: everything Redis had
	// not seen spent, since the denial found nothing left to lease.
	leased := l.Capacity() - admitted
	t.Logf("%s, idle=%v: %d admitted before the block, %d leased then (%d as Inspect reads it), %d spent during it", l.Algorithm, idle, admitted, leased, held, during)
	if held != leased {
		t.Fatalf("the replicas report %d units leased when the block began; the capacity %d less the %d admitted before it leaves %d", held, l.Capacity(), admitted, leased)
	}
	if during != leased {
		t.Fatalf("%d admitted during the block; the replicas held %d on leases when it began, which they may spend and no more (in all %d admitted of %d)", during, leased, admitted+during, l.Capacity())
	}
	if bound := l.Capacity() / 4; leased > bound {
		t.Fatalf("%d units out on leases when the block began, over a slice per replica (%d in all)", leased, bound)
	}
	if !idle && leased > 3 {
		t.Fatalf("%d units out on leases at the limit; slices should have shrunk to about a request per replica", leased)
	}
	clk.Advance(block - 10*time.Second)
	d, err := reps[0].h.Take(ctx, key, l, 0, clk.Now())
	if err != nil {
		t.Fatal(err)
	}
	// After the block, a bucket has refilled; a window is still spent.
	if want := l.Algorithm == quota.TokenBucket; d.Allowed != want {
		t.Fatalf("a question after the block: %+v, want allowed=%v (the count as the algorithm left it)", d, want)
	}
}
