package quota

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/extauthz/extauthz/internal/metrics"
	"github.com/extauthz/extauthz/internal/testredis"
)

func TestStoreBreaker(t *testing.T) {
	srv := testredis.Start(t)
	m := metrics.New("test")
	store := NewStore(srv.Client(), StoreOptions{Prefix: "rl:", Timeout: 100 * time.Millisecond, Metrics: m, Log: quiet, ProbeEvery: 20 * time.Millisecond})
	defer store.Close()
	changes := make(chan bool, 4)
	store.OnChange(func(up bool) { changes <- up })
	ctx := context.Background()
	l := Limit{Limit: 10, Window: time.Second}
	if _, err := store.lease(ctx, "k", l, 1); err != nil {
		t.Fatal(err)
	}
	srv.Kill()
	for i := 0; i < 3; i++ {
		if _, err := store.lease(ctx, "k", l, 1); err == nil || errors.Is(err, ErrStoreDown) {
			t.Fatalf("call %d against a dead Redis: %v, want a connection error", i, err)
		}
	}
	if store.Up() || <-changes != false {
		t.Fatal("three consecutive failures should mark the store down")
	}
	start := time.Now()
	if _, err := store.lease(ctx, "k", l, 1); !errors.Is(err, ErrStoreDown) {
		t.Fatalf("while down: %v, want ErrStoreDown", err)
	}
	if d := time.Since(start); d > 10*time.Millisecond {
		t.Fatalf("a call while down took %v: it must not touch the network", d)
	}
	srv.Restart()
	select {
	case up := <-changes:
		if !up || !store.Up() {
			t.Fatal("the probe should mark the store up")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("store not marked up within 5s of Redis coming back")
	}
	if _, err := store.lease(ctx, "k", l, 1); err != nil {
		t.Fatalf("after recovery: %v", err)
	}
}

// failing is a primary limiter whose store fails with err.
type failing struct{ err error }

func (f failing) Take(context.Context, string, Limit, time.Time) (Decision, error) {
	return Decision{}, f.err
}
func (f failing) Refund(context.Context, string, Limit, time.Time) error { return f.err }

// Each on_redis_error choice, and the fallback bucket's share of the limit.
func TestResilient(t *testing.T) {
	cache, _ := NewCache(100)
	r := NewResilient(failing{ErrStoreDown}, cache, fixedPeers(3))
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
	if _, err := NewResilient(failing{context.Canceled}, cache, fixedPeers(1)).Take(cctx, "c", Limit{Limit: 1, Window: time.Second}, now); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled: %v", err)
	}
}
