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

// A Cluster master killed under load, in process and under the race
// detector, with the clients the sidecar builds (redisstore.NewClients):
// only the calls for keys on the dead master fail, and they fail at once
// (ErrStoreDown) once its breaker is open; the breaker opens once; once
// the replica has taken the slots over, those keys are decided by Redis
// again within a second, with no breaker left open.
func TestClusterMasterKilled(t *testing.T) {
	// cluster-require-full-coverage no: with Redis's default the other
	// masters refuse every key until the promotion (see
	// tests/failover_test.go).
	c := testredis.StartClusterWith(t, testredis.ClusterOptions{Masters: 3, Replicas: 1, NodeTimeout: time.Second,
		Extra: []string{"--cluster-require-full-coverage", "no"}})
	clients, err := redisstore.NewClients(redisstore.ClientOptions{Addrs: c.Addrs(), Name: "test"})
	if err != nil {
		t.Fatal(err)
	}
	defer clients.Close()
	m := redisstore.NewMetrics(nil)
	store := redisstore.NewStore(clients.Pipe, clients.StoreOptions(redisstore.StoreOptions{Prefix: "rl:", Metrics: m, Log: quiet}))
	defer store.Close()
	lim := newRedis(t, store)
	l := quota.Limit{Limit: 1_000_000, Window: time.Second}

	ctx := context.Background()
	cc := c.Client(t)
	const keys = 60
	onVictim := make([]bool, keys)
	victims := 0
	for k := range onVictim {
		m, err := cc.MasterForKey(ctx, fmt.Sprintf("rl:{k%d}", k))
		if err != nil {
			t.Fatal(err)
		}
		if m.Options().Addr == c.Masters[0].Addr {
			onVictim[k], victims = true, victims+1
		}
	}
	if victims == 0 || victims == keys {
		t.Fatalf("%d of %d keys on the victim: the test needs both kinds", victims, keys)
	}

	type outcome struct {
		at      time.Time
		key     int
		latency time.Duration
		err     error
	}
	var (
		mu   sync.Mutex
		outs []outcome
		stop atomic.Bool
		wg   sync.WaitGroup
	)
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			deadline := time.Now().Add(time.Minute) // bounded whatever happens
			for i := w; !stop.Load() && time.Now().Before(deadline); i += 8 {
				k := i % keys
				start := time.Now()
				_, err := lim.Take(ctx, fmt.Sprintf("k%d", k), l, 1, start)
				mu.Lock()
				outs = append(outs, outcome{start, k, time.Since(start), err})
				mu.Unlock()
			}
		}()
	}
	count := func() int { mu.Lock(); defer mu.Unlock(); return len(outs) }
	waitFor := func(n int) {
		deadline := time.Now().Add(30 * time.Second)
		for count() < n {
			if time.Now().After(deadline) {
				t.Fatalf("%d decisions in 30s, want %d", count(), n)
			}
			time.Sleep(2 * time.Millisecond) // letting the load run
		}
	}
	waitFor(500)
	killed := time.Now()
	c.Masters[0].Kill()
	promoted := c.WaitPromoted(t, c.Masters[0], c.Masters[1], 30*time.Second)
	// A second of decisions after the promotion, at least.
	for time.Since(promoted) < 1500*time.Millisecond {
		time.Sleep(10 * time.Millisecond) // letting the load run
	}
	stop.Store(true)
	wg.Wait()

	var opened time.Time
	var lastVictimErr time.Time
	slowAfterOpen := 0
	for _, o := range outs {
		if o.err == nil {
			continue
		}
		if !onVictim[o.key] {
			t.Fatalf("key %d on a live master failed %v after the kill: %v", o.key, o.at.Sub(killed), o.err)
		}
		if errors.Is(o.err, redisstore.ErrStoreDown) && opened.IsZero() {
			opened = o.at
		}
		if o.at.After(lastVictimErr) {
			lastVictimErr = o.at
		}
	}
	for _, o := range outs {
		if !opened.IsZero() && o.at.After(opened.Add(10*time.Millisecond)) && onVictim[o.key] && o.err != nil && o.latency > redisstore.DefaultTimeout/2 {
			slowAfterOpen++
		}
	}
	t.Logf("%d decisions; %d keys of %d on the killed master; promoted %v after the kill; its keys failed until %v after the promotion",
		len(outs), victims, keys, promoted.Sub(killed).Round(time.Millisecond), lastVictimErr.Sub(promoted).Round(time.Millisecond))
	if n := testutil.ToFloat64(m.BreakerOpened); n != 1 {
		t.Fatalf("breakers opened %v times, want once (the dead master's)", n)
	}
	if opened.IsZero() {
		t.Fatal("no call failed with ErrStoreDown: the dead master's breaker never opened")
	}
	if slowAfterOpen > 0 {
		t.Fatalf("%d calls for the dead master's keys waited on it after its breaker opened", slowAfterOpen)
	}
	if back := lastVictimErr.Sub(promoted); back > time.Second {
		t.Fatalf("the dead master's keys failed until %v after the promotion; want within 1s", back)
	}
	if up, down := testutil.ToFloat64(m.Up), testutil.ToFloat64(m.NodesDown); up != 1 || down != 0 {
		t.Fatalf("after the promotion: redis_up %v, nodes down %v; want 1 and 0 (the dead master forgotten)", up, down)
	}
}
