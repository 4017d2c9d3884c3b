package tests

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"github.com/redis/go-redis/v9"

	"github.com/extauthz/extauthz/internal/config"
	"github.com/extauthz/extauthz/internal/quota/redisstore"
	"github.com/extauthz/extauthz/tests/internal/testredis"
)

// The Redis call timeout at the defaults: a decision that waited on Redis
// takes at least this long.
const defaultRedisTimeout = config.DefaultTimeout

// openWithin is the guarantee for a real outage: the breaker opens within
// 250ms of Redis dying or freezing.
const openWithin = 250 * time.Millisecond

// waitMetric polls a replica's metric until it equals want, for up to d.
func waitMetric(t *testing.T, s *sidecar, d time.Duration, want float64, name string, labels ...string) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		got := s.metric(name, labels...)
		if got == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s%v = %v after %v, want %v", name, labels, got, d, want)
		}
		time.Sleep(20 * time.Millisecond) // the store probes once a second
	}
}

// background drives requests until stop is closed, recording each
// decision's start, latency and status. gRPC errors are recorded, not
// fatal, so the test can report them all.
type background struct {
	mu      sync.Mutex
	samples []sample
	stop    chan struct{}
	wg      sync.WaitGroup
}

type sample struct {
	start   time.Time
	latency time.Duration
	status  int
	err     error
}

func startBackground(s *sidecar, workers int, req func(i int) *authv3.CheckRequest) *background {
	return startCalls(workers, func(ctx context.Context, i int) (int, error) {
		resp, err := s.Client.Check(ctx, req(i))
		return httpStatus(resp), err
	})
}

// startCalls runs call from workers goroutines until halted (or for a
// minute at most), recording each call's start, latency and status (the
// HTTP status Envoy would send).
func startCalls(workers int, call func(ctx context.Context, i int) (status int, err error)) *background {
	b := &background{stop: make(chan struct{})}
	var next atomic.Int64
	for w := 0; w < workers; w++ {
		b.wg.Add(1)
		go func() {
			defer b.wg.Done()
			deadline := time.Now().Add(time.Minute) // bounded whatever happens
			for time.Now().Before(deadline) {
				select {
				case <-b.stop:
					return
				default:
				}
				i := int(next.Add(1))
				start := time.Now()
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				status, err := call(ctx, i)
				cancel()
				smp := sample{start: start, latency: time.Since(start), err: err}
				if err == nil {
					smp.status = status
				}
				b.mu.Lock()
				b.samples = append(b.samples, smp)
				b.mu.Unlock()
			}
		}()
	}
	return b
}

func (b *background) halt() []sample {
	close(b.stop)
	b.wg.Wait()
	return b.samples
}

// checkOutage asserts the guarantees of an outage: no gRPC errors, only the
// statuses the policies allow, and decisions started after the store was
// marked down answered without Redis (docs/modes.md: "afterwards no decision
// waits on Redis ..., every one under the 150 ms call timeout"): every
// one under the Redis call timeout, which a decision that waited on a
// frozen Redis would take at least, and the median and the 99th
// percentile under half of it. (That no such decision called Redis at
// all is breakUnderLoad's exact check.)
func checkOutage(t *testing.T, samples []sample, downAt time.Time, allowed ...int) {
	t.Helper()
	ok := map[int]bool{}
	for _, s := range allowed {
		ok[s] = true
	}
	var after []time.Duration
	for i, s := range samples {
		if s.err != nil {
			t.Fatalf("sample %d: gRPC error %v", i, s.err)
		}
		if !ok[s.status] {
			t.Fatalf("sample %d: status %d, want one of %v", i, s.status, allowed)
		}
		if s.start.After(downAt) {
			after = append(after, s.latency)
		}
	}
	if len(after) < 50 {
		t.Fatalf("only %d decisions after the store was marked down", len(after))
	}
	slices.Sort(after)
	p50, p99, worst := after[len(after)/2], after[len(after)*99/100], after[len(after)-1]
	t.Logf("%d decisions after the store was marked down: p50 %v, p99 %v, max %v", len(after), p50, p99, worst)
	if p50 >= defaultRedisTimeout/2 {
		t.Fatalf("decisions took %v (median) while the store was down: half a Redis call's timeout (%v) or more", p50, defaultRedisTimeout)
	}
	if p99 >= defaultRedisTimeout/2 {
		t.Fatalf("decisions took %v (99th percentile) while the store was down: half a Redis call's timeout (%v) or more", p99, defaultRedisTimeout)
	}
	if worst >= defaultRedisTimeout {
		t.Fatalf("a decision took %v while the store was down; want every one under the Redis call timeout (%v): no decision waits on Redis", worst, defaultRedisTimeout)
	}
}

// markedDown waits up to d for the replica's log to record the breaker
// opening, and returns when it did (the log's own timestamp).
func (s *sidecar) markedDown(d time.Duration) time.Time {
	s.t.Helper()
	return s.logged("redis marked down; policies follow on_redis_error", d)
}

// logged waits up to d for a JSON log record with message msg and returns
// its timestamp.
func (s *sidecar) logged(msg string, d time.Duration) time.Time {
	s.t.Helper()
	deadline := time.Now().Add(d)
	for {
		for _, line := range strings.Split(s.logs.String(), "\n") {
			var rec struct {
				Time time.Time `json:"time"`
				Msg  string    `json:"msg"`
			}
			if json.Unmarshal([]byte(line), &rec) == nil && rec.Msg == msg {
				return rec.Time
			}
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("no %q in the log within %v:\n%s", msg, d, tail(s.logs.String(), 20))
		}
		time.Sleep(5 * time.Millisecond) // polling the child's log
	}
}

// logShows waits up to d for text to appear in the replica's log: the
// child writes its log through a pipe that the harness copies, so a line
// written before a reply can reach the buffer after the reply is read.
func (s *sidecar) logShows(text string, d time.Duration) bool {
	s.t.Helper()
	for deadline := time.Now().Add(d); !strings.Contains(s.logs.String(), text); {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(5 * time.Millisecond) // polling the child's log
	}
	return true
}

// decisionCalls counts the Redis calls decisions made (every operation but
// the breaker's probes), leaving out those abandoned when the store went
// down: while it is down the count must not move.
func (s *sidecar) decisionCalls() float64 {
	var n float64
	for _, m := range s.metrics()["extauthz_redis_calls_total"].GetMetric() {
		var op, result string
		for _, lp := range m.GetLabel() {
			switch lp.GetName() {
			case "op":
				op = lp.GetValue()
			case "result":
				result = lp.GetValue()
			}
		}
		if op != "probe" && op != "confirm" && result != "abandoned" {
			n += m.GetCounter().GetValue()
		}
	}
	return n
}

// perIPPolicy gives every source address its own bucket, far from its
// limit: the outage tests' load is always admitted, so any status but 200
// comes from how the sidecar handled the store failing.
const perIPPolicy = `
policies:
  - {name: per-ip, key: [ip], limit: 1000000, window: 1s}
`

// perIPRequest builds the i-th request from its own source address in
// 10.<net>.0.0/16, so each decision touches a bucket of its own; each test
// passes its own net so no two tests send from the same addresses.
func perIPRequest(net int) func(int) *authv3.CheckRequest {
	return func(i int) *authv3.CheckRequest {
		return envoyRequest{sourceIP: fmt.Sprintf("10.%d.%d.%d", net, i>>8&255, i&255)}.build()
	}
}

// breakUnderLoad is the outage scenario the kill and freeze tests share: 16
// workers send req to s; after warm decisions with the store healthy, brk
// breaks Redis. The breaker must open within openWithin of the break (the
// replica's log says when); then 500 more decisions run, every one a 200,
// none waiting on Redis and none making a Redis call.
func breakUnderLoad(t *testing.T, s *sidecar, req func(int) *authv3.CheckRequest, warm int, brk func()) {
	t.Helper()
	breakLoaded(t, s, startBackground(s, 16, req), warm, brk)
}

// breakLoaded is breakUnderLoad for any background load bg on s.
func breakLoaded(t *testing.T, s *sidecar, bg *background, warm int, brk func()) {
	t.Helper()
	waitCount(t, bg, warm)
	broke := time.Now()
	brk()
	downAt := s.markedDown(5 * time.Second)
	took := downAt.Sub(broke)
	t.Logf("breaker opened %v after Redis broke", took.Round(time.Millisecond))
	if took > openWithin {
		bg.halt()
		t.Fatalf("breaker opened %v after Redis broke; want within %v", took, openWithin)
	}
	calls := s.decisionCalls()
	waitCount(t, bg, len(bg.snapshot())+500)
	checkOutage(t, bg.halt(), downAt, 200)
	if after := s.decisionCalls(); after != calls {
		t.Fatalf("%v Redis calls made by decisions while the store was down", after-calls)
	}
	if n := s.metric("extauthz_redis_breaker_opened_total"); n != 1 {
		t.Fatalf("breaker opened %v times, want 1", n)
	}
}

// Redis killed under load, at the defaults: no gRPC error, every decision
// by on_redis_error, the breaker open within 250ms, and once it is open no
// decision waits on Redis.
func TestRedisKilledUnderLoad(t *testing.T) {
	serial(t, "the breaker must open within 250ms of the kill and no later decision take half a call timeout (75ms): milliseconds at the breaker's defaults")
	for _, mode := range []string{"redis", "hybrid"} {
		t.Run(mode, func(t *testing.T) {
			srv := testredis.Start(t)
			s := startSidecar(t, defaultsConfig(srv.Addr, mode, perIPPolicy))
			breakUnderLoad(t, s, perIPRequest(0), 200, srv.Kill)
			if n := s.metric("extauthz_degraded_decisions_total", "action", "fallback"); n == 0 {
				t.Fatal("no fallback decisions counted")
			}
		})
	}
}

func (b *background) snapshot() []sample {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]sample(nil), b.samples...)
}

// waitCount waits until the background load has made n decisions.
func waitCount(t *testing.T, b *background, n int) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for len(b.snapshot()) < n {
		if time.Now().After(deadline) {
			t.Fatalf("background load made %d decisions in 30s, want %d", len(b.snapshot()), n)
		}
		time.Sleep(5 * time.Millisecond) // letting the load run
	}
}

// Three replicas that saw each other, Redis gone: each falls back to a
// third of the limit, so together they admit about the limit, not 3×.
// The replicas wait until each counts the others (one heartbeat, a second
// after start-up): the point is the split by the count a replica has
// observed. TestFallbackRightAfterStartUp is the twin at the defaults.
func TestFallbackSplitsTheLimitAcrossPeers(t *testing.T) {
	parallel(t)
	srv := testredis.Start(t)
	replicas := startReplicas(t, 3, defaultsConfig(srv.Addr, "hybrid", ordersFor("match: {path_prefix: /orders}, limit: 90, window: 1m")))
	waitPeers(t, replicas, 3)
	srv.Kill()
	results, elapsed := timedDrive(t, replicas, 600, 32, adaOrder)
	counts := tally(t, results)
	perReplica := map[int]int{}
	for _, r := range results {
		if httpStatus(r.resp) == 200 {
			perReplica[r.replica]++
		}
	}
	t.Logf("Redis down: %v, per replica %v", counts, perReplica)
	// Each replica's share is 30 per minute (burst 30): 90 in all, plus
	// what 3 buckets of 30/min refill during the run.
	assertAdmitted(t, counts[200], 90, 90, time.Minute, elapsed, 1)
	for i := 0; i < 3; i++ {
		assertAdmitted(t, perReplica[i], 30, 30, time.Minute, elapsed, 1)
	}
}

// The same outage right after a rollout, at the defaults: Redis dies as
// soon as the third replica serves. A replica's first heartbeat hears only
// the replicas that started before it, so until its second each assumes at
// least min_peers (2): the first replica takes half the limit, not all of
// it. Bound: each replica's share by the count its metrics report.
func TestFallbackRightAfterStartUp(t *testing.T) {
	parallel(t)
	srv := testredis.Start(t)
	replicas := startReplicas(t, 3, defaultsConfig(srv.Addr, "hybrid", ordersFor("match: {path_prefix: /orders}, limit: 90, window: 1m")))
	srv.Kill()
	results, elapsed := timedDrive(t, replicas, 600, 32, adaOrder)
	counts := tally(t, results)
	perReplica := map[int]int{}
	for _, r := range results {
		if httpStatus(r.resp) == 200 {
			perReplica[r.replica]++
		}
	}
	bound := 0
	for i, r := range replicas {
		peers := int(r.metric("extauthz_peers"))
		if peers < 2 {
			t.Fatalf("replica %d assumed %d peers during the outage; min_peers is 2", i, peers)
		}
		share := 90 / peers
		assertAdmitted(t, perReplica[i], share, share, time.Minute, elapsed, 1)
		bound += share
	}
	t.Logf("Redis down right after start-up: %v, per replica %v; shares sum to %d of 90", counts, perReplica, bound)
	if bound > 135 {
		t.Fatalf("shares sum to %d: more than half the limit per replica", bound)
	}
}

// Three replicas that spent most of the limit through Redis, then lost it:
// each falls back from its share of what Redis last said remained, not
// from a fresh third of the limit, so the outage does not hand out the
// limit again on top of what was spent. In hybrid mode a replica's view is
// as old as its last lease; in redis mode, as its last decision.
func TestFallbackNearTheLimitStaysNearIt(t *testing.T) {
	parallel(t)
	for _, mode := range []string{"hybrid", "redis"} {
		t.Run(mode, func(t *testing.T) { testFallbackNearTheLimit(t, mode) })
	}
}

func testFallbackNearTheLimit(t *testing.T, mode string) {
	srv := testredis.Start(t)
	replicas := startReplicas(t, 3, defaultsConfig(srv.Addr, mode, ordersFor("match: {path_prefix: /orders}, limit: 90, window: 1m")))
	// Waiting until each replica counts the others: the bound below is
	// about shares of three (TestFallbackRightAfterStartUp covers the
	// first second after start-up).
	waitPeers(t, replicas, 3)
	start := time.Now()
	before := tally(t, drive(t, replicas, 60, 6, adaOrder))
	if before[200] != 60 {
		t.Fatalf("with Redis up: %v, want 60 allowed", before)
	}
	srv.Kill()
	during := tally(t, drive(t, replicas, 600, 32, adaOrder))
	elapsed := time.Since(start)
	total := before[200] + during[200]
	t.Logf("60 admitted with Redis up, %d after it died: %v in %v", during[200], total, elapsed.Round(time.Millisecond))
	// Lower bound: Redis held at least the 30 the limit has left after
	// 60 (more, with what refilled), and each replica's view of it is
	// no lower (a view is as old as the replica's last call, and the
	// level only fell after it but for refill, which the fallback brings
	// forward), so each falls back to at least ⌊30/3⌋: 30 in all. In
	// hybrid mode, of those 30 (+ refill) U tokens were out on leases at
	// the kill, which their replicas spend as before; Redis held the
	// rest, 30 − U, and a replica's view of it is taken down by the
	// others' possible leases since its own, a slice each (a quarter of
	// the bucket over three replicas, 7; hybrid_level.go): a share of at
	// least ⌊(30 − U − 14)/3⌋ each, U + 16 − U − 2 = 14 in all whatever U.
	// The fallback's own refill (30 a minute per replica) only adds to it.
	least := 3 * (30 / 3)
	if mode == "hybrid" {
		least = 30 - 2*7 - 2
	}
	if during[200] < least {
		t.Fatalf("%d admitted during the outage; want at least %d: each replica's share (a third) of what Redis last said remained", during[200], least)
	}
	// Bound: the limit, what refills at the limit's rate during the run,
	// and the replicas' stale views. Each replica knows what Redis held
	// at its own last lease; the two others may have leased after that,
	// at most a slice each (a quarter of the bucket over three replicas:
	// 7 tokens), so each view overstates what remained by at most 14 and
	// each replica's share (a third) by at most 14/3: 14 in all. In redis
	// mode the views are a few decisions old, well inside that. Without
	// starting from the share, every replica fell back to a full third of
	// the limit: 156 of 600 admitted in hybrid mode.
	refill := int(elapsed/(time.Minute/90)) + 1
	if bound := 90 + refill + 14; total > bound {
		t.Fatalf("%d admitted in all; want at most %d (the limit 90, %d refilled, 14 for the replicas' stale views)", total, bound, refill)
	}
}

// Redis frozen with SIGSTOP (a hang, not a refusal), at the defaults: the
// same guarantees as killed; after SIGCONT the policy returns to its mode
// by itself.
func TestRedisFrozenAndThawed(t *testing.T) {
	serial(t, "the breaker must open within 250ms of the freeze and no later decision take half a call timeout (75ms): milliseconds at the breaker's defaults")
	for _, mode := range []string{"redis", "hybrid"} {
		t.Run(mode, func(t *testing.T) {
			srv := testredis.Start(t)
			s := startSidecar(t, defaultsConfig(srv.Addr, mode, perIPPolicy))
			req := perIPRequest(1)
			breakUnderLoad(t, s, req, 200, srv.Freeze)

			srv.Thaw()
			waitMetric(t, s, 5*time.Second, 1, "extauthz_redis_up")
			degraded := s.metric("extauthz_degraded_decisions_total")
			counts := tally(t, drive(t, []*sidecar{s}, 500, 8, func(i int) *authv3.CheckRequest { return req(i + 100_000) }))
			if counts[200] != 500 {
				t.Fatalf("after thaw: %v", counts)
			}
			if d := s.metric("extauthz_degraded_decisions_total") - degraded; d != 0 {
				t.Fatalf("%v degraded decisions after Redis came back", d)
			}
		})
	}
}

// Redis frozen while the replica itself is CPU-throttled (frozen 40ms of
// every 100ms): a confirmation probe whose deadline passes while the
// replica is not running is asked again rather than trusted, and yet the
// breaker opens. Bound: the first round takes 50ms of stall, a 25ms tick
// and the 100ms probe; each round asked again takes at most 100ms plus a
// 40ms freeze, and a shorter deadline moves the next round's deadline off
// the freeze, so three more rounds at most: 175ms + 3 × 140ms, under 600ms.
func TestRedisFrozenWhileThrottled(t *testing.T) {
	serial(t, "its replica is throttled with SIGSTOP on purpose, and the breaker must open within 600ms of the freeze")
	srv := testredis.Start(t)
	s := startSidecar(t, defaultsConfig(srv.Addr, "redis", perIPPolicy))
	stop := throttle(t, []*sidecar{s}, 40*time.Millisecond, 100*time.Millisecond)
	defer stop()
	bg := startBackground(s, 8, perIPRequest(5))
	waitCount(t, bg, 100)
	frozen := time.Now()
	srv.Freeze()
	defer srv.Thaw()
	downAt := s.markedDown(10 * time.Second)
	samples := bg.halt()
	took := downAt.Sub(frozen)
	t.Logf("breaker opened %v after Redis froze, the replica throttled; %d decisions", took.Round(time.Millisecond), len(samples))
	if took > 600*time.Millisecond {
		t.Fatalf("breaker opened %v after Redis froze; want within 600ms", took)
	}
	for i, smp := range samples {
		if smp.err != nil || smp.status != 200 {
			t.Fatalf("sample %d: status %d, error %v", i, smp.status, smp.err)
		}
	}
}

// Redis busy for tens of milliseconds at a time (DEBUG SLEEP, CLIENT
// PAUSE), a quarter second apart, under load, at the defaults: calls stall, but Redis answers the
// breaker's probe, so it never opens and no decision is degraded. Redis
// 7.0 ends a CLIENT PAUSE on its own clock tick, so a 30ms pause lasts
// 50-90ms: like the 70ms DEBUG SLEEP it stalls calls past StallAfter
// (50ms) and the probe runs. The 30ms sleeps do not even raise suspicion.
func TestSlowRedisKeepsTheBreakerClosed(t *testing.T) {
	serial(t, "Redis stalls of 30-70ms must not open the breaker, whose probe times out at 100ms: other tests' load would add stalls of its own")
	for _, mode := range []string{"redis", "hybrid"} {
		t.Run(mode, func(t *testing.T) {
			srv := testredis.Start(t, "--enable-debug-command", "local")
			s := startSidecar(t, defaultsConfig(srv.Addr, mode, perIPPolicy))
			admin := srv.Client()
			ctx := context.Background()
			bg := startBackground(s, 16, perIPRequest(3))
			waitCount(t, bg, 200)
			var pausedAt []time.Time
			for _, pause := range []func() error{
				func() error { return admin.Do(ctx, "DEBUG", "SLEEP", "0.03").Err() },
				func() error { return admin.Do(ctx, "CLIENT", "PAUSE", "30").Err() },
				func() error { return admin.Do(ctx, "DEBUG", "SLEEP", "0.07").Err() },
			} {
				for i := 0; i < 5; i++ {
					pausedAt = append(pausedAt, time.Now())
					must(t, pause())
					n := len(bg.snapshot())
					waitCount(t, bg, n+50) // decisions flow again
					// Slow moments, not a Redis that is paused most of
					// the time: a quarter second between them.
					time.Sleep(250 * time.Millisecond)
				}
			}
			samples := bg.halt()
			for i, smp := range samples {
				if smp.err != nil || smp.status != 200 {
					for k, p := range pausedAt {
						t.Logf("pause %d at %v", k, smp.start.Sub(p))
					}
					t.Fatalf("sample %d: status %d, error %v, latency %v", i, smp.status, smp.err, smp.latency)
				}
			}
			if n := s.metric("extauthz_redis_breaker_opened_total"); n != 0 {
				t.Fatalf("a slow Redis opened the breaker %v times", n)
			}
			if d := s.metric("extauthz_degraded_decisions_total"); d != 0 {
				t.Fatalf("%v decisions degraded while Redis was merely slow", d)
			}
			confirms := s.metric("extauthz_redis_calls_total", "op", "confirm")
			t.Logf("%d decisions through 15 pauses; %v confirmation probes, all answered", len(samples), confirms)
			if confirms == 0 {
				t.Fatal("no confirmation probe ran: the 70ms pauses did not stall calls, so the test proved nothing")
			}
		})
	}
}

// Redis restarted empty under load, at the defaults: the replica under
// load marks it down within 250ms of the kill; once it is back, buckets
// are recreated on first use and the seed scenario holds again, decided by
// Redis. The replicas wait until each counts the others before the kill:
// the test checks that they keep that count while the set is rebuilt.
func TestRedisRestartedSeedHoldsAgain(t *testing.T) {
	serial(t, "the breaker must open within 250ms of the kill: milliseconds at the breaker's defaults")
	srv := testredis.Start(t)
	replicas := startReplicas(t, 3, defaultsConfig(srv.Addr, "hybrid", seedPolicy+`
  - {name: warm, match: {path_prefix: /warm}, key: [client], limit: 1000000, window: 1m}
  - {name: per-ip, match: {path_prefix: /ip}, key: [ip], limit: 1000000, window: 1s}
`))
	waitPeers(t, replicas, 3)
	warm := func(int) *authv3.CheckRequest {
		return envoyRequest{path: "/warm", headers: [][2]string{{"x-api-key", "key-ada"}}}.build()
	}
	tally(t, drive(t, replicas, 300, 8, warm)) // slices held for the old Redis
	// Load that reaches Redis: a new bucket (a lease) per request.
	bg := startBackground(replicas[0], 8, func(i int) *authv3.CheckRequest {
		return envoyRequest{path: "/ip", sourceIP: fmt.Sprintf("10.4.%d.%d", i>>8&255, i&255)}.build()
	})
	waitCount(t, bg, 100)
	killed := time.Now()
	srv.Kill()
	downAt := replicas[0].markedDown(5 * time.Second)
	t.Logf("breaker opened %v after the kill", downAt.Sub(killed).Round(time.Millisecond))
	if took := downAt.Sub(killed); took > openWithin {
		t.Fatalf("breaker opened %v after the kill; want within %v", took, openWithin)
	}
	srv.Revive()
	bg.halt()
	// The new Redis starts empty, so every replica's heartbeat in it
	// proves that replica talks to it. Whether or not a replica noticed
	// the outage, it must be back within a couple of seconds.
	waitHeartbeats(t, srv.Client(), 3, 5*time.Second)
	for _, r := range replicas {
		// Each found its entry gone and kept the highest count of the
		// last peer_ttl rather than the 1 or 2 of a set being rebuilt.
		if n := r.metric("extauthz_peers"); n != 3 {
			t.Errorf("replica %s counts %v peers after the restart, want the last count 3", r.GRPC, n)
		}
	}
	for _, r := range replicas {
		waitMetric(t, r, 5*time.Second, 1, "extauthz_redis_up")
	}
	degraded := make([]float64, len(replicas))
	for i, r := range replicas {
		degraded[i] = r.metric("extauthz_degraded_decisions_total")
	}
	results, elapsed := timedDrive(t, replicas, seedBurst, seedConcurrency, adaOrder)
	counts := tally(t, results)
	for i, r := range replicas {
		if d := r.metric("extauthz_degraded_decisions_total") - degraded[i]; d != 0 {
			t.Fatalf("replica %s made %v seed decisions without Redis after the restart", r.GRPC, d)
		}
	}
	assertAdmitted(t, counts[200], 100, 100, time.Minute, elapsed, 1)
}

// waitHeartbeats waits until n replicas have heartbeated into the Redis
// rdb talks to.
func waitHeartbeats(t *testing.T, rdb *redis.Client, n int64, d time.Duration) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		got, err := rdb.ZCard(context.Background(), redisstore.PeersKey("rl:")).Result()
		if err == nil && got == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d replicas heartbeated into the restarted Redis after %v (err %v), want %d", got, d, err, n)
		}
		time.Sleep(20 * time.Millisecond) // heartbeats run once a second
	}
}

// on_redis_error: allow admits and deny answers 503 during the outage.
func TestOnRedisErrorAllowAndDeny(t *testing.T) {
	parallel(t)
	srv := testredis.Start(t)
	s := startSidecar(t, defaultsConfig(srv.Addr, "redis", `
policies:
  - {name: open, match: {path_prefix: /open}, limit: 1, window: 1h, on_redis_error: allow}
  - {name: closed, match: {path_prefix: /closed}, limit: 1000, window: 1h, on_redis_error: deny}
`))
	srv.Kill()
	for i := 0; i < 20; i++ {
		if st := httpStatus(s.check(envoyRequest{path: "/open"}.build())); st != 200 {
			t.Fatalf("allow policy during outage: %d", st)
		}
	}
	resp := s.check(envoyRequest{path: "/closed"}.build())
	if httpStatus(resp) != 503 {
		t.Fatalf("deny policy during outage: %d", httpStatus(resp))
	}
	h := deniedHeaders(resp)
	if h["retry-after"] != "1" || h["content-type"] != "application/problem+json" {
		t.Fatalf("503 headers = %v", h)
	}
	var body map[string]any
	json.Unmarshal([]byte(resp.GetDeniedResponse().GetBody()), &body)
	if body["type"] != "https://iana.org/assignments/http-problem-types#temporary-reduced-capacity" || body["status"] != 503.0 {
		t.Fatalf("503 body = %s", resp.GetDeniedResponse().GetBody())
	}
	if got := s.metric("extauthz_checks_total", "outcome", "unavailable"); got != 1 {
		t.Fatalf("unavailable checks = %v", got)
	}
	if got := s.metric("extauthz_degraded_decisions_total", "policy", "open", "action", "allow"); got != 20 {
		t.Fatalf("allow decisions = %v", got)
	}
	// The outage is in the structured log (marked down), and nothing
	// else the process wrote is unstructured: go-redis's own per-call
	// complaints go through slog, at debug level.
	for _, line := range strings.Split(strings.TrimSpace(s.logs.String()), "\n") {
		if !json.Valid([]byte(line)) {
			t.Errorf("log line is not JSON: %s", line)
		}
	}
	if !s.logShows("redis marked down", 10*time.Second) {
		t.Errorf("no store transition in the log:\n%s", s.logs)
	}
}

// A Redis call takes at most 90% of what is left of the caller's gRPC
// deadline (docs/modes.md, "When Redis is unreachable"), and the decision keeps
// the rest for answering, so that a Check whose deadline is shorter than
// the call timeout is still answered, by on_redis_error, before its
// deadline. Redis refuses nothing and answers reads (CLIENT PAUSE WRITE:
// the breaker's probe, EXISTS, gets through) but holds every script, so
// each call runs into its deadline and the breaker stays closed.
//
// At the defaults (a 150ms call timeout) with a 160ms deadline, a call
// gets 144ms and 16ms are kept for answering: what a first call that ran
// into its share leaves is not spent asking again. (A shorter deadline
// leaves less than a loaded 2-core machine can spend descheduled.) The
// scaled twin sets redis.timeout to 1s, so that a deadline of 500ms is
// shorter than the call timeout: a call given all of it (or all that is
// left) would leave the caller with DeadlineExceeded; 50ms are kept.
func TestRedisCallKeepsInsideTheCallersDeadline(t *testing.T) {
	serial(t, "a Check must be answered within the 16ms its deadline keeps beyond the Redis call: milliseconds")
	for _, c := range []struct {
		name     string
		redis    string
		timeout  time.Duration // the call timeout in effect
		deadline time.Duration // the Check's
	}{
		{"defaults", "", defaultRedisTimeout, 160 * time.Millisecond},
		// Knob: redis.timeout 1s, so that the Check's deadline (500ms)
		// is shorter than the call timeout, which the defaults' 150ms
		// cannot show without a deadline under a loaded machine's
		// scheduling delay; the claim's twin at the defaults is the row
		// above.
		{"scaled", "timeout: 1s, ", time.Second, 500 * time.Millisecond},
	} {
		t.Run(c.name, func(t *testing.T) { testCallInsideDeadline(t, c.redis, c.timeout, c.deadline) })
	}
}

func testCallInsideDeadline(t *testing.T, redisOpts string, timeout, deadline time.Duration) {
	if deadline-deadline/10 >= timeout {
		t.Fatalf("90%% of the deadline (%v) must be shorter than the call timeout (%v), or the caller's deadline decides nothing", deadline, timeout)
	}
	srv := testredis.Start(t)
	// The binary built without the race detector, as users run it: the
	// point is milliseconds.
	s := startFastSidecar(t, fmt.Sprintf(`redis: {%saddrs: [%s]}
default_mode: redis
policies:
  - {name: closed, key: [ip], limit: 1000000, window: 1s, on_redis_error: deny}
`, redisOpts, srv.Addr))
	req := perIPRequest(4)
	// Warm: the script is loaded and the connections are open.
	for i := 0; i < 20; i++ {
		if st := httpStatus(s.check(req(i))); st != 200 {
			t.Fatalf("with Redis up: status %d", st)
		}
	}
	admin := srv.Client()
	ctx := context.Background()
	must(t, admin.Do(ctx, "CLIENT", "PAUSE", "20000", "WRITE").Err())
	defer admin.Do(ctx, "CLIENT", "UNPAUSE")
	var slowest time.Duration
	for i := 0; i < 5; i++ {
		cctx, cancel := context.WithTimeout(ctx, deadline)
		start := time.Now()
		resp, err := s.Client.Check(cctx, req(1000+i))
		took := time.Since(start)
		cancel()
		slowest = max(slowest, took)
		if err != nil {
			t.Fatalf("Check %d with a %v deadline while Redis holds every script: %v after %v; want a decision before the deadline (a Redis call takes at most 90%% of what is left of it)", i, deadline, err, took.Round(time.Millisecond))
		}
		if st := httpStatus(resp); st != 503 {
			t.Fatalf("Check %d while Redis holds every script: status %d; want 503, on_redis_error: deny", i, st)
		}
	}
	t.Logf("5 Checks with a %v deadline, a %v call timeout, Redis holding every script: each a 503 by on_redis_error, the slowest in %v", deadline, timeout, slowest.Round(time.Millisecond))
	if n := s.metric("extauthz_degraded_decisions_total", "policy", "closed", "action", "deny"); n != 5 {
		t.Fatalf("%v decisions by on_redis_error: deny, want 5", n)
	}
	if n := s.metric("extauthz_redis_breaker_opened_total"); n != 0 {
		t.Fatalf("the breaker opened %v times: Redis answered the probe, so the decisions were not an outage's", n)
	}
}
