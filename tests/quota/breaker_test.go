package quota_test

import (
	"context"
	"errors"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/redis/go-redis/v9"

	"github.com/extauthz/extauthz/internal/quota"
	"github.com/extauthz/extauthz/internal/quota/redisstore"
	"github.com/extauthz/extauthz/tests/internal/testredis"
)

// openWithin is the guarantee for a real outage: the store is marked down
// within 250ms of Redis dying or freezing.
const openWithin = 250 * time.Millisecond

// sidecarClient sets the go-redis options the sidecar runs with that the
// breaker relies on: calls end at their context's deadline, one dial
// attempt, no retries (redisstore.NewClients).
func sidecarClient(o *redis.Options) {
	o.ContextTimeoutEnabled = true
	o.DialerRetries = 1
	o.MaxRetries = -1
}

// breakerRig is a store at the default breaker timings on a server, with
// the probe on a client of its own, as the sidecar runs it, and a
// redis-mode limiter deciding through it.
type breakerRig struct {
	store *redisstore.Store
	lim   *redisstore.Redis
	m     *redisstore.Metrics
	wire  wireCounter // on the decision client; the probe has its own
}

func newBreakerRig(t *testing.T, srv *testredis.Server, timeout time.Duration) *breakerRig {
	t.Helper()
	m := redisstore.NewMetrics(nil)
	c := srv.Client(sidecarClient)
	r := &breakerRig{m: m}
	c.AddHook(&r.wire)
	r.store = redisstore.NewStore(c, redisstore.StoreOptions{Prefix: "rl:", Timeout: timeout, Probe: srv.Client(sidecarClient), Metrics: m, Log: quiet})
	t.Cleanup(r.store.Close)
	r.lim = newRedis(t, r.store)
	return r
}

// wireCounter is a go-redis hook counting what a client sends: dials,
// commands and pipelines.
type wireCounter struct{ dials, commands atomic.Int64 }

func (w *wireCounter) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		w.dials.Add(1)
		return next(ctx, network, addr)
	}
}

func (w *wireCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		w.commands.Add(1)
		return next(ctx, cmd)
	}
}

func (w *wireCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		w.commands.Add(int64(len(cmds)))
		return next(ctx, cmds)
	}
}

// sent is how many dials and commands the decision client has made.
func (w *wireCounter) sent() int64 { return w.dials.Load() + w.commands.Load() }

var tenPerSecond = quota.Limit{Limit: 10, Window: time.Second}

// take asks for one unit of key.
func (r *breakerRig) take(ctx context.Context, key string) error {
	_, err := r.lim.Take(ctx, key, tenPerSecond, 1, time.Now())
	return err
}

func (r *breakerRig) up() bool { return testutil.ToFloat64(r.m.Up) == 1 }

// awaitUp waits up to d for the store to be marked up (want) or down, and
// returns when it saw it. The breaker runs on real time: polling it is the
// point.
func (r *breakerRig) awaitUp(t *testing.T, want bool, d time.Duration) time.Time {
	t.Helper()
	deadline := time.Now().Add(d)
	for r.up() != want {
		if time.Now().After(deadline) {
			t.Fatalf("store not marked up=%v within %v", want, d)
		}
		time.Sleep(time.Millisecond)
	}
	return time.Now()
}

func (r *breakerRig) confirms() float64 {
	var n float64
	for _, result := range []string{"ok", "error", "timeout"} {
		n += testutil.ToFloat64(r.m.Calls.WithLabelValues("confirm", result))
	}
	return n
}

// A killed Redis refuses connections: one failed call and one failed probe
// open the breaker; calls then fail at once without touching the network,
// and the store comes back by itself after a restart.
func TestBreakerOpensOnKilledRedis(t *testing.T) {
	srv := testredis.Start(t)
	r := newBreakerRig(t, srv, redisstore.DefaultTimeout)
	ctx := context.Background()
	if err := r.take(ctx, "k"); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	srv.Kill()
	if err := r.take(ctx, "k"); err == nil || errors.Is(err, redisstore.ErrStoreDown) {
		t.Fatalf("first call against a dead Redis: %v, want its connection error", err)
	}
	took := r.awaitUp(t, false, 5*time.Second).Sub(killed)
	t.Logf("marked down %v after the kill", took)
	if took > openWithin {
		t.Fatalf("marked down %v after the kill; want within %v", took, openWithin)
	}
	before := r.wire.sent()
	for i := 0; i < 10; i++ {
		if err := r.take(ctx, "k"); !errors.Is(err, redisstore.ErrStoreDown) {
			t.Fatalf("while down: %v, want ErrStoreDown", err)
		}
	}
	if n := r.wire.sent() - before; n != 0 {
		t.Fatalf("10 calls while down made %d dials and commands on the decision client; want none: calls fail at once without touching the network", n)
	}
	if n := testutil.ToFloat64(r.m.BreakerOpened); n != 1 {
		t.Fatalf("breaker opened %v times, want 1", n)
	}
	srv.Restart()
	r.awaitUp(t, true, 5*time.Second)
	if err := r.take(ctx, "k"); err != nil {
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
	r := newBreakerRig(t, srv, 5*time.Second)
	ctx := context.Background()
	if err := r.take(ctx, "k"); err != nil {
		t.Fatal(err)
	}
	frozen := time.Now()
	srv.Freeze()
	defer srv.Thaw()
	err := r.take(ctx, "k")
	returned := time.Since(frozen)
	if !errors.Is(err, redisstore.ErrStoreDown) {
		t.Fatalf("call in flight when the store went down: %v, want ErrStoreDown", err)
	}
	if r.up() {
		t.Fatal("the call was abandoned but the store is not marked down")
	}
	t.Logf("the stalled call returned %v after the freeze", returned)
	if returned > openWithin {
		t.Fatalf("the stalled call returned %v after the freeze; want the breaker open within %v", returned, openWithin)
	}
	srv.Thaw()
	r.awaitUp(t, true, 5*time.Second)
}

// Redis busy for 70ms (DEBUG SLEEP): calls time out and stall, the probe
// waits for Redis like everything else, and answers: suspicion, no trip.
// This is what a CPU-throttled or overloaded replica looks like from
// inside.
func TestBreakerStaysClosedWhenRedisIsSlow(t *testing.T) {
	srv := testredis.Start(t, "--enable-debug-command", "local")
	// A short call timeout, so that calls do fail during the sleep: the
	// point is that failed calls alone do not open the breaker.
	r := newBreakerRig(t, srv, 20*time.Millisecond)
	ctx := context.Background()
	// The first call dials and loads the script; on a loaded machine that
	// can take longer than the 20ms timeout, which is not the point here.
	var err error
	for i := 0; i < 20; i++ {
		if err = r.take(ctx, "k"); err == nil {
			break
		}
	}
	if err != nil {
		t.Fatalf("20 calls before any sleep: %v", err)
	}
	admin := srv.Client()
	for round := 0; round < 3; round++ {
		sleeping := make(chan error, 1)
		go func() { sleeping <- admin.Do(ctx, "DEBUG", "SLEEP", "0.07").Err() }()
		// Calls until the sleep has ended, so that some overlap it
		// whenever it reached Redis.
		var failed, calls int
		for slept := false; !slept; {
			select {
			case err := <-sleeping:
				if err != nil {
					t.Fatal(err)
				}
				slept = true
				continue
			default:
			}
			if calls++; calls > 1000 {
				t.Fatalf("round %d: the 70ms sleep outlasted 1000 calls", round)
			}
			if err := r.take(ctx, "k"); err != nil {
				if errors.Is(err, redisstore.ErrStoreDown) {
					t.Fatalf("round %d: the store was marked down by a 70ms sleep", round)
				}
				failed++
			}
		}
		if failed == 0 {
			t.Fatalf("round %d: no call failed during the sleep; the test proves nothing", round)
		}
	}
	// Every call has returned, so no suspicion can start now: the
	// verdict of a confirmation still running is the breaker's last word.
	vctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	down := r.store.AwaitVerdict(vctx, "k")
	if vctx.Err() != nil {
		t.Fatal("the confirmation probe gave no verdict within 10s")
	}
	if opened := testutil.ToFloat64(r.m.BreakerOpened); down || !r.up() || opened != 0 {
		t.Fatalf("after the last confirmation: down=%v, up=%v, breaker opened %v times; want a slow Redis never to open the breaker", down, r.up(), opened)
	}
	if ok := testutil.ToFloat64(r.m.Calls.WithLabelValues("confirm", "ok")); ok == 0 {
		t.Fatal("no confirmation probe answered: the failures never raised suspicion")
	}
}

// Neither a caller that went away nor an error about one key (WRONGTYPE)
// says anything about Redis being available: no suspicion at all.
func TestBreakerIgnoresCancelsAndKeyErrors(t *testing.T) {
	srv := testredis.Start(t)
	r := newBreakerRig(t, srv, redisstore.DefaultTimeout)
	ctx := context.Background()
	if err := srv.Client().Set(ctx, "rl:{str}", "not a hash", 0).Err(); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 10; i++ {
		if err := r.take(ctx, "str"); !redis.HasErrorPrefix(err, "WRONGTYPE") {
			t.Fatalf("lease of a string key: %v, want WRONGTYPE", err)
		}
		cctx, cancel := context.WithCancel(ctx)
		cancel()
		if err := r.take(cctx, "k"); !errors.Is(err, context.Canceled) {
			t.Fatalf("canceled call: %v", err)
		}
	}
	if n := r.confirms(); n != 0 || !r.up() {
		t.Fatalf("%v confirmation probes for errors that say nothing about Redis", n)
	}
	if n := testutil.ToFloat64(r.m.Calls.WithLabelValues("lease", "canceled")); n != 10 {
		t.Fatalf("canceled calls counted %v, want 10", n)
	}
}
