package quota

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/redis/go-redis/v9"

	"github.com/extauthz/extauthz/internal/metrics"
	"github.com/extauthz/extauthz/internal/testredis"
)

// openWithin is the guarantee for a real outage: the store is marked down
// within 250ms of Redis dying or freezing.
const openWithin = 250 * time.Millisecond

// sidecarClient sets the go-redis options the sidecar runs with that the
// breaker relies on: calls end at their context's deadline, one dial
// attempt, no retries (cmd/extauthz/redis.go).
func sidecarClient(o *redis.Options) {
	o.ContextTimeoutEnabled = true
	o.DialerRetries = 1
	o.MaxRetries = -1
}

// breakerStore is a store at the default breaker timings on srv, with the
// probe on a client of its own, as the sidecar runs it, and a channel of
// its up/down transitions.
func breakerStore(t *testing.T, srv *testredis.Server, timeout time.Duration) (*Store, *metrics.Metrics, chan bool) {
	t.Helper()
	m := metrics.New("test")
	s := NewStore(srv.Client(sidecarClient), StoreOptions{Prefix: "rl:", Timeout: timeout, Probe: srv.Client(sidecarClient), Metrics: m, Log: quiet})
	t.Cleanup(s.Close)
	changes := make(chan bool, 8)
	s.OnChange(func(up bool) { changes <- up })
	return s, m, changes
}

// awaitChange waits for the store's next transition, up to d.
func awaitChange(t *testing.T, changes chan bool, d time.Duration) (bool, time.Duration) {
	t.Helper()
	start := time.Now()
	select {
	case up := <-changes:
		return up, time.Since(start)
	case <-time.After(d):
		t.Fatalf("no store transition within %v", d)
		return false, 0
	}
}

var tenPerSecond = Limit{Limit: 10, Window: time.Second}

// A killed Redis refuses connections: one failed call and one failed probe
// open the breaker; calls then fail at once without touching the network,
// and the store comes back by itself after a restart.
func TestBreakerOpensOnKilledRedis(t *testing.T) {
	srv := testredis.Start(t)
	s, m, changes := breakerStore(t, srv, DefaultTimeout)
	ctx := context.Background()
	if _, err := s.lease(ctx, "k", tenPerSecond, 1); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	srv.Kill()
	if _, err := s.lease(ctx, "k", tenPerSecond, 1); err == nil || errors.Is(err, ErrStoreDown) {
		t.Fatalf("first call against a dead Redis: %v, want its connection error", err)
	}
	if up, _ := awaitChange(t, changes, 5*time.Second); up {
		t.Fatal("the first transition after the kill was up")
	}
	took := time.Since(killed)
	t.Logf("marked down %v after the kill", took)
	if took > openWithin {
		t.Fatalf("marked down %v after the kill; want within %v", took, openWithin)
	}
	start := time.Now()
	if _, err := s.lease(ctx, "k", tenPerSecond, 1); !errors.Is(err, ErrStoreDown) {
		t.Fatalf("while down: %v, want ErrStoreDown", err)
	}
	if d := time.Since(start); d > 10*time.Millisecond {
		t.Fatalf("a call while down took %v: it must not touch the network", d)
	}
	if n := testutil.ToFloat64(m.BreakerOpened); n != 1 {
		t.Fatalf("breaker opened %v times, want 1", n)
	}
	srv.Restart()
	if up, _ := awaitChange(t, changes, 5*time.Second); !up || !s.Up() {
		t.Fatal("the probe should mark the store up")
	}
	if _, err := s.lease(ctx, "k", tenPerSecond, 1); err != nil {
		t.Fatalf("after recovery: %v", err)
	}
}

// A frozen Redis (SIGSTOP: connections open, no answers) fails nothing; the
// calls stall. The breaker opens within StallAfter + a watch tick +
// ProbeTimeout, and the call in flight is abandoned then rather than
// waiting out its timeout.
func TestBreakerOpensOnFrozenRedis(t *testing.T) {
	srv := testredis.Start(t)
	// A long call timeout, so that only the breaker can end the call
	// early: the point is that it does.
	s, _, changes := breakerStore(t, srv, 5*time.Second)
	ctx := context.Background()
	if _, err := s.lease(ctx, "k", tenPerSecond, 1); err != nil {
		t.Fatal(err)
	}
	frozen := time.Now()
	srv.Freeze()
	defer srv.Thaw()
	_, err := s.lease(ctx, "k", tenPerSecond, 1)
	returned := time.Since(frozen)
	if !errors.Is(err, ErrStoreDown) {
		t.Fatalf("call in flight when the store went down: %v, want ErrStoreDown", err)
	}
	if up, _ := awaitChange(t, changes, time.Second); up {
		t.Fatal("the first transition after the freeze was up")
	}
	t.Logf("the stalled call returned %v after the freeze", returned)
	if returned > openWithin {
		t.Fatalf("the stalled call returned %v after the freeze; want the breaker open within %v", returned, openWithin)
	}
	srv.Thaw()
	if up, _ := awaitChange(t, changes, 5*time.Second); !up {
		t.Fatal("the store did not come back after the thaw")
	}
}

// Redis busy for 70ms (DEBUG SLEEP): calls time out and stall, the probe
// waits for Redis like everything else, and answers: suspicion, no trip.
// This is what a CPU-throttled or overloaded replica looks like from
// inside.
func TestBreakerStaysClosedWhenRedisIsSlow(t *testing.T) {
	srv := testredis.Start(t, "--enable-debug-command", "local")
	// A short call timeout, so that calls do fail during the sleep: the
	// point is that failed calls alone do not open the breaker.
	s, m, _ := breakerStore(t, srv, 20*time.Millisecond)
	ctx := context.Background()
	if _, err := s.lease(ctx, "k", tenPerSecond, 1); err != nil {
		t.Fatal(err)
	}
	admin := srv.Client()
	for round := 0; round < 3; round++ {
		sleeping := make(chan error, 1)
		go func() { sleeping <- admin.Do(ctx, "DEBUG", "SLEEP", "0.07").Err() }()
		time.Sleep(5 * time.Millisecond) // let the sleep reach Redis first
		var failed int
		for i := 0; i < 5; i++ {
			if _, err := s.lease(ctx, "k", tenPerSecond, 1); err != nil {
				if errors.Is(err, ErrStoreDown) {
					t.Fatalf("round %d: the store was marked down by a 70ms sleep", round)
				}
				failed++
			}
		}
		if err := <-sleeping; err != nil {
			t.Fatal(err)
		}
		if failed == 0 {
			t.Fatalf("round %d: no call failed during the sleep; the test proves nothing", round)
		}
	}
	// The last round's confirmation may still be in flight.
	deadline := time.Now().Add(time.Second)
	for s.confirming() && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond) // waiting out a real-time probe
	}
	if !s.Up() || testutil.ToFloat64(m.BreakerOpened) != 0 {
		t.Fatal("a slow Redis opened the breaker")
	}
	if ok := testutil.ToFloat64(m.RedisCalls.WithLabelValues("confirm", "ok")); ok == 0 {
		t.Fatal("no confirmation probe answered: the failures never raised suspicion")
	}
}

// Neither a caller that went away nor an error about one key (WRONGTYPE)
// says anything about Redis being available: no suspicion at all.
func TestBreakerIgnoresCancelsAndKeyErrors(t *testing.T) {
	srv := testredis.Start(t)
	s, m, _ := breakerStore(t, srv, DefaultTimeout)
	ctx := context.Background()
	must := func(err error) {
		if err != nil {
			t.Fatal(err)
		}
	}
	must(srv.Client().Set(ctx, s.Key("str"), "not a hash", 0).Err())
	for i := 0; i < 10; i++ {
		if _, err := s.lease(ctx, "str", tenPerSecond, 1); !redis.HasErrorPrefix(err, "WRONGTYPE") {
			t.Fatalf("lease of a string key: %v, want WRONGTYPE", err)
		}
		cctx, cancel := context.WithCancel(ctx)
		cancel()
		if _, err := s.lease(cctx, "k", tenPerSecond, 1); !errors.Is(err, context.Canceled) {
			t.Fatalf("canceled call: %v", err)
		}
	}
	confirms := testutil.ToFloat64(m.RedisCalls.WithLabelValues("confirm", "ok")) +
		testutil.ToFloat64(m.RedisCalls.WithLabelValues("confirm", "error")) +
		testutil.ToFloat64(m.RedisCalls.WithLabelValues("confirm", "timeout"))
	if confirms != 0 || !s.Up() {
		t.Fatalf("%v confirmation probes for errors that say nothing about Redis", confirms)
	}
	if n := testutil.ToFloat64(m.RedisCalls.WithLabelValues("lease", "canceled")); n != 10 {
		t.Fatalf("canceled calls counted %v, want 10", n)
	}
}
