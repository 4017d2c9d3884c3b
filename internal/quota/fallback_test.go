package quota

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/extauthz/extauthz/internal/metrics"
	"github.com/extauthz/extauthz/internal/testredis"
)

// failing is a primary limiter whose store fails with err.
type failing struct{ err error }

func (f failing) Take(context.Context, string, Limit, time.Time) (Decision, error) {
	return Decision{}, f.err
}
func (f failing) Refund(context.Context, string, Limit, time.Time) error { return f.err }

// Each on_redis_error choice, and the fallback bucket's share of the limit.
func TestResilient(t *testing.T) {
	cache, _ := NewCache(100)
	r := NewResilient(failing{ErrStoreDown}, cache, fixedPeers(3), redisUp)
	ctx := context.Background()
	now := t0
	l := Limit{Limit: 90, Window: time.Minute, Burst: 30}
	admitted := 0
	for i := 0; i < 100; i++ {
		d, err := r.Take(ctx, "k", l, now)
		if err != nil || d.Degraded != DegradedFallback || d.Limit != 90 {
			t.Fatalf("fallback: %+v %v", d, err)
		}
		if d.Allowed {
			admitted++
		}
	}
	// limit 90 ÷ 3 peers, burst 30 ÷ 3: 10 at once.
	if admitted != 10 {
		t.Fatalf("fallback admitted %d, want burst 30 ÷ 3 peers = 10", admitted)
	}
	// 30 per minute: one more every 2s.
	if d, _ := r.Take(ctx, "k", l, now.Add(2*time.Second)); !d.Allowed {
		t.Fatalf("after 2s: %+v", d)
	}

	l.OnError = ErrorAllow
	if d, err := r.Take(ctx, "a", l, now); err != nil || !d.Allowed || d.Degraded != DegradedAllow {
		t.Fatalf("allow: %+v %v", d, err)
	}
	l.OnError = ErrorDeny
	if d, err := r.Take(ctx, "d", l, now); err != nil || d.Allowed || d.Degraded != DegradedDeny || d.RetryAfter != time.Second {
		t.Fatalf("deny: %+v %v", d, err)
	}
	// A limit smaller than the peer count still admits one at a time.
	tiny := Limit{Limit: 2, Window: time.Minute}
	if d, _ := r.Take(ctx, "tiny", tiny, now); !d.Allowed {
		t.Fatalf("tiny limit: %+v", d)
	}
	// A caller that gave up gets its context's error, not a decision.
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := NewResilient(failing{context.Canceled}, cache, fixedPeers(1), redisUp).Take(cctx, "c", Limit{Limit: 1, Window: time.Second}, now); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled: %v", err)
	}
}

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
	m := metrics.New("test")
	store := NewStore(srv.Client(), StoreOptions{Prefix: "rl:", Timeout: time.Second, Metrics: m, Log: quiet, Clock: clk.Now})
	defer store.Close()
	cache, err := NewCache(100)
	if err != nil {
		t.Fatal(err)
	}
	const peers = 3
	var r *Resilient
	if mode == "hybrid" {
		h := NewHybrid(cache, store, fixedPeers(peers), HybridOptions{SliceIdle: time.Hour, Metrics: m, Log: quiet, Now: clk.Now})
		r = NewResilient(h, cache, fixedPeers(peers), store)
	} else {
		r = NewResilient(NewRedis(store), cache, fixedPeers(peers), store)
	}
	l := Limit{Limit: 90, Window: time.Minute, OnError: ErrorFallback}
	ctx := context.Background()

	// take admits at the current instant until the first denial and
	// returns how many were admitted from Redis and how many by fallback.
	take := func() (fromRedis, fallback int) {
		for i := 0; i < 200; i++ {
			d, err := r.Take(ctx, "k", l, clk.Now())
			if err != nil {
				t.Fatal(err)
			}
			if !d.Allowed {
				return fromRedis, fallback
			}
			if d.Degraded == DegradedFallback {
				fallback++
			} else {
				fromRedis++
			}
		}
		t.Fatal("never denied")
		return
	}
	for i := 0; i < 60; i++ {
		if d, err := r.Take(ctx, "k", l, clk.Now()); err != nil || !d.Allowed || d.Degraded != 0 {
			t.Fatalf("decision %d with Redis up: %+v %v", i, d, err)
		}
	}
	sh := cache.Lock("k")
	e, ok := sh.Peek("k")
	if !ok {
		sh.Unlock()
		t.Fatal("no view of Redis kept for the key after 60 decisions")
	}
	remote, slice := e.remote, e.tokens
	sh.Unlock()
	if remote+slice != 30 {
		t.Fatalf("Redis holds %d and the slice %d after 60 of 90; want 30 together", remote, slice)
	}
	// Worked by hand: redis mode leaves 30 in Redis, a third is 10. In
	// hybrid mode the first lease is 1 token, the next seven are slices
	// of 7 (a quarter of the bucket over three replicas), then a sixth of
	// what Redis holds as it runs low: 6 of 40, then 5 of 34, leaving 29.
	// The 60th decision spent the fourth of those 5, so one is left in
	// the slice, and a third of 29 is 9.
	wantSlice, wantFallback := int64(0), 10
	if mode == "hybrid" {
		wantSlice, wantFallback = 1, 9
	}
	if remote != 30-wantSlice || slice != wantSlice {
		t.Fatalf("Redis holds %d and the slice %d; want %d and %d", remote, slice, 30-wantSlice, wantSlice)
	}

	srv.Kill()
	fromSlice, fallback := take()
	if fromSlice != int(wantSlice) || fallback != wantFallback {
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
