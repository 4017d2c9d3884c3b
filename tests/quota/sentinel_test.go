package quota_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/extauthz/extauthz/internal/quota"
	"github.com/extauthz/extauthz/internal/quota/redisstore"
	"github.com/extauthz/extauthz/tests/internal/testredis"
)

// A master found through Sentinel, killed under load, in process and
// under the race detector, with the clients the sidecar builds
// (redisstore.NewClients with a master name): calls fail at once
// (ErrStoreDown) once the breaker is open, the breaker opens once, and
// once the sentinels name the promoted replica the calls reach it: within
// 1.5s (a probe every 500ms, go-redis's redial once a second) and the
// probe's timeout.
func TestSentinelMasterKilled(t *testing.T) {
	// Sentinel's own timing (its defaults would take 30s to notice):
	// see testredis.SentinelOptions.
	g := testredis.StartSentinels(t, testredis.SentinelOptions{Replicas: 1})
	clients, err := redisstore.NewClients(redisstore.ClientOptions{Addrs: g.Addrs(), MasterName: g.Name, Name: "test"})
	if err != nil {
		t.Fatal(err)
	}
	defer clients.Close()
	m := redisstore.NewMetrics(nil)
	store := redisstore.NewStore(clients.Pipe, clients.StoreOptions(redisstore.StoreOptions{Prefix: "rl:", Metrics: m, Log: quiet}))
	defer store.Close()
	lim := newRedis(t, store)
	l := quota.Limit{Limit: 1_000_000, Window: time.Second}

	type outcome struct {
		at      time.Time
		latency time.Duration
		err     error
	}
	var (
		mu   sync.Mutex
		outs []outcome
		stop atomic.Bool
		wg   sync.WaitGroup
	)
	ctx := context.Background()
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			deadline := time.Now().Add(time.Minute) // bounded whatever happens
			for i := w; !stop.Load() && time.Now().Before(deadline); i += 8 {
				start := time.Now()
				_, err := lim.Take(ctx, fmt.Sprintf("k%d", i%60), l, 1, start)
				mu.Lock()
				outs = append(outs, outcome{start, time.Since(start), err})
				mu.Unlock()
			}
		}()
	}
	count := func() int { mu.Lock(); defer mu.Unlock(); return len(outs) }
	for deadline := time.Now().Add(30 * time.Second); count() < 500; {
		if time.Now().After(deadline) {
			t.Fatalf("%d decisions in 30s, want 500", count())
		}
		time.Sleep(2 * time.Millisecond) // letting the load run
	}
	killed := time.Now()
	g.Master.Kill()
	promoted, _, agreed := g.WaitPromoted(g.Master, 30*time.Second)
	// A second of decisions after the switch, at least, past the return.
	for time.Since(agreed) < 2500*time.Millisecond {
		time.Sleep(10 * time.Millisecond) // letting the load run
	}
	stop.Store(true)
	wg.Wait()

	var opened, lastErr time.Time
	slowAfterOpen := 0
	for _, o := range outs {
		if o.err == nil {
			continue
		}
		// The breaker was open by the time the first call failed with
		// ErrStoreDown returned (calls that had started before, waiting
		// for one of the pool's connections, are abandoned then).
		if done := o.at.Add(o.latency); errors.Is(o.err, redisstore.ErrStoreDown) && (opened.IsZero() || done.Before(opened)) {
			opened = done
		}
		if o.at.After(lastErr) {
			lastErr = o.at
		}
	}
	// A call that waited on Redis after the breaker opened failed with
	// something else than ErrStoreDown, which the store returns before
	// any I/O (under the race detector, with eight goroutines spinning
	// on it, even that return can take 100ms: not a wait on Redis).
	for _, o := range outs {
		if !opened.IsZero() && o.at.After(opened) && o.err != nil && !errors.Is(o.err, redisstore.ErrStoreDown) && o.latency > redisstore.DefaultTimeout/2 {
			slowAfterOpen++
		}
	}
	t.Logf("%d decisions; every sentinel named %s %v after the kill; calls failed until %v after that",
		len(outs), promoted.Addr, agreed.Sub(killed).Round(time.Millisecond), lastErr.Sub(agreed).Round(time.Millisecond))
	if n := testutil.ToFloat64(m.BreakerOpened); n != 1 {
		t.Fatalf("the breaker opened %v times, want once", n)
	}
	if opened.IsZero() {
		t.Fatal("no call failed with ErrStoreDown: the breaker never opened")
	}
	if slowAfterOpen > 0 {
		t.Fatalf("%d calls waited on the dead master after the breaker opened", slowAfterOpen)
	}
	if back := lastErr.Sub(agreed); back > 1750*time.Millisecond {
		t.Fatalf("calls failed until %v after every sentinel named the new master; want within 1.75s", back)
	}
	if up := testutil.ToFloat64(m.Up); up != 1 {
		t.Fatalf("after the switch: redis_up %v, want 1", up)
	}
	okAfter := 0
	for _, o := range outs {
		if o.err == nil && o.at.After(lastErr) {
			okAfter++
		}
	}
	if okAfter == 0 {
		t.Fatal("no call succeeded after the last failure: the new master was never reached")
	}
}
