package tests

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"github.com/redis/go-redis/v9"

	"github.com/extauthz/extauthz/internal/quota/redisstore"
	"github.com/extauthz/extauthz/tests/internal/testredis"
)

// sentinelConfig is defaultsConfig for a master found through Sentinel.
func sentinelConfig(g *testredis.Sentinels, mode, body string) string {
	return fmt.Sprintf("redis:\n  sentinel: {master_name: %s, addrs: [%s]}\ndefault_mode: %s\n%s",
		g.Name, strings.Join(g.Addrs(), ", "), mode, body)
}

// A replication group watched by three sentinels (a master and two
// replicas) losing its master under load, as a user runs it: three
// sidecars at the shipped defaults, 100 keys of 100 per minute (burst
// 100) under 32 concurrent Checks for 10s, and the master killed
// (SIGKILL) 2s in.
//
// Sentinel's down-after-milliseconds is 1000 and failover-timeout 5000
// (Sentinel's defaults, 30s and 3 minutes, would make the run minutes
// long): these are Sentinel's settings, and the degraded window scales
// with down-after-milliseconds (docs/modes.md gives the sum).
//
// The claims (docs/modes.md, "Redis Sentinel"):
//   - every key falls back from the kill until a probe finds the
//     promoted replica (one master at a time: Sentinel has no slots),
//     and only then: no decision is degraded before the kill, none once
//     the probe that follows the promotion has answered;
//   - each replica's breaker opens once and closes once;
//   - the replicas together admit what exact buckets admit, within 2%
//     (the fallback's bound, as for a Cluster master), plus what
//     asynchronous replication may lose: the writing calls the old
//     master answered whose effects had not left for a replica when it
//     died. Redis writes the replication stream in the same event-loop
//     pass as the replies, so on a replica that keeps up only the calls
//     of the last pass can be lost: at most one per Check in flight
//     (sentinelWorkers); where the promoted replica had fallen behind,
//     also the writes in the stream it never applied. Each lost call
//     lets its key admit again the token its request spent at once, in
//     either mode: a hybrid lease the promoted replica lacks is charged
//     back with its key's next call, or stopped by the heartbeat that
//     sees the new run_id (docs/reliability.md, "When Redis forgets"),
//     so its grant is not admitted twice.
const (
	sentinelKeys    = 100
	sentinelLimit   = 100 // per minute
	sentinelBurst   = 100
	sentinelWorkers = 32
	sentinelRun     = 10 * time.Second
	sentinelKillAt  = 2 * time.Second
)

var sentinelPolicy = fmt.Sprintf(`
policies:
  - {name: a, match: {path_prefix: /a}, key: ["header:x-user"], limit: %d, window: 1m, burst: %d}
`, sentinelLimit, sentinelBurst)

func TestSentinelFailoverUnderLoad(t *testing.T) {
	serial(t, "every breaker must close within 1.75s of the sentinels naming the new master, and open only once: the breaker's defaults")
	for _, mode := range []string{"redis", "hybrid"} {
		t.Run(mode, func(t *testing.T) { testSentinelFailover(t, mode) })
	}
}

func testSentinelFailover(t *testing.T, mode string) {
	g := testredis.StartSentinels(t, testredis.SentinelOptions{Replicas: 2})
	// The binary built without the race detector, as users run it: the
	// run is about rates, as TestClusterFailoverUnderLoad's is.
	cfg := sentinelConfig(g, mode, sentinelPolicy)
	replicas := []*sidecar{startFastSidecar(t, cfg), startFastSidecar(t, cfg), startFastSidecar(t, cfg)}
	r := runSentinelFailover(t, g, replicas)
	if r.err != nil {
		t.Fatal(r.err)
	}

	var admitted, lo, hi, decisions int
	for _, as := range r.arrivals {
		decisions += len(as)
		for _, a := range as {
			if a.allowed {
				admitted++
			}
		}
		l, h := exactTokenBucket(as, sentinelBurst, time.Minute/sentinelLimit)
		lo, hi = lo+l, hi+h
	}
	degraded := 0.0
	for _, s := range replicas {
		degraded += s.metric("extauthz_degraded_decisions_total", "policy", "a")
	}
	t.Logf("%s: %d decisions in %v on %d keys; killed at %v; a sentinel named the new master %v later, all %v later (%s -> %s)", mode, decisions,
		r.elapsed.Round(time.Millisecond), sentinelKeys, r.killedAt.Round(time.Millisecond),
		(r.promoted - r.killedAt).Round(time.Millisecond), (r.agreed - r.killedAt).Round(time.Millisecond), g.Master.Addr, r.newMaster)
	t.Logf("%s: degraded window: first breaker open %v after the kill, last closed %v after it (%v after all sentinels switched); %v degraded decisions (%.1f%% of all)",
		mode, (r.firstDown - r.killedAt).Round(time.Millisecond), (r.lastUp - r.killedAt).Round(time.Millisecond),
		(r.lastUp - r.agreed).Round(time.Millisecond), degraded, 100*degraded/float64(decisions))
	t.Logf("%s: admitted %d; exact buckets admit %d to %d: %.4f to %.4f of exact",
		mode, admitted, lo, hi, float64(admitted)/float64(hi), float64(admitted)/float64(lo))
	// Where any excess arose: admitted over exact for the decisions sent
	// before the kill, before the last breaker closed, and in all.
	t.Logf("%s: admitted over exact (highest), decisions sent before the kill: %+d; before the last breaker closed: %+d; all: %+d",
		mode, excessBefore(r.arrivals, r.killedAt), excessBefore(r.arrivals, r.lastUp), admitted-hi)

	for _, b := range r.breakers {
		if b.opened != 1 || b.closed != 1 {
			t.Errorf("replica %s: breaker opened %d and closed %d times, want once each", b.replica, b.opened, b.closed)
		}
	}
	if degraded == 0 {
		t.Fatal("no decision fell back: the test proved nothing")
	}
	if r.degradedBeforeKill != 0 {
		t.Errorf("%v decisions were degraded before the master was killed", r.degradedBeforeKill)
	}
	if r.degradedAfterUp != 0 {
		t.Errorf("%v decisions were degraded after every replica's breaker had closed", r.degradedAfterUp)
	}
	if r.firstDown < r.killedAt {
		t.Errorf("a breaker opened %v before the kill", r.killedAt-r.firstDown)
	}
	// A breaker closes on its first probe that reaches the new master:
	// the probe's connection pool, after failed dials, redials once a
	// second (go-redis's own dial breaker), and the breaker probes every
	// 500ms, so within 1.5s of every sentinel naming the new master; then
	// the probe itself (at most its 150ms timeout) and Warm before the
	// breaker closes (loading the scripts and reading the Redis state:
	// loopback round trips, 100ms allowed): 1.75s, docs/modes.md's figure.
	if back := r.lastUp - r.agreed; back > 1750*time.Millisecond {
		t.Errorf("the last breaker closed %v after every sentinel named the new master; want within 1.75s (docs/modes.md)", back)
	}
	// The heartbeat set lives on the new master, every replica in it:
	// peer counting (what fallback and hybrid shares divide by) goes on.
	if r.peersOnNew != int64(len(replicas)) {
		t.Errorf("the new master's heartbeat set holds %d replicas, want %d", r.peersOnNew, len(replicas))
	}
	if r.elapsed-r.lastUp < 2*time.Second {
		t.Errorf("only %v of the run left after the switch: too short to show the decisions after it", r.elapsed-r.lastUp)
	}
	// What a lost call can have admitted again: the token its request
	// spent at once (a lease's grant is charged back, see above).
	const perCall = 1
	// Calls lost: the Checks in flight at the kill (the last event-loop
	// pass's replies and stream go out together), and, where the promoted
	// replica had fallen behind (a starved process on a busy machine),
	// the writes in the stream it never applied: its bytes over the
	// stream's bytes per writing call before the kill (lease, return and
	// heartbeat calls, counted by the replicas' metrics).
	lostCalls := sentinelWorkers + int(math.Ceil(r.unreplicated/max(r.perWrite, 1)))
	lost := lostCalls * perCall
	t.Logf("%s: the promoted replica lacked %.0f bytes of the stream at the kill (%.0f per writing call before it): up to %d calls lost",
		mode, r.unreplicated, r.perWrite, lostCalls)
	if float64(admitted) > 1.02*float64(hi)+float64(lost) || float64(admitted) < 0.98*float64(lo) {
		t.Errorf("admitted %d; exact buckets admit %d to %d: want within 2%% of them, plus at most %d lost to asynchronous replication (%d calls of %d tokens)",
			admitted, lo, hi, lost, lostCalls, perCall)
	}
}

// excessBefore is what the arrivals sent before until admitted beyond
// what exact buckets fed them admit (the higher of exactTokenBucket's
// counts), over every key.
func excessBefore(arrivals [][]arrival, until time.Duration) int {
	excess := 0
	for _, as := range arrivals {
		var before []arrival
		for _, a := range as {
			if a.sent < until {
				before = append(before, a)
				if a.allowed {
					excess++
				}
			}
		}
		if len(before) > 0 {
			_, hi := exactTokenBucket(before, sentinelBurst, time.Minute/sentinelLimit)
			excess -= hi
		}
	}
	return excess
}

// sentinelBreaker is one replica's breaker history, from its log.
type sentinelBreaker struct {
	replica        string
	opened, closed int
	down, up       time.Time // the first open, the last close
}

type sentinelRunResult struct {
	arrivals  [][]arrival // per key
	killedAt  time.Duration
	promoted  time.Duration // when a sentinel first named the new master
	agreed    time.Duration // when every sentinel named it
	newMaster string
	// firstDown and lastUp bound the degraded window: the first breaker
	// that opened, the last that closed, over the replicas.
	firstDown, lastUp time.Duration
	breakers          []sentinelBreaker
	// degradedBeforeKill and degradedAfterUp are degraded decisions
	// counted before the kill and after lastUp (the counters sampled).
	degradedBeforeKill, degradedAfterUp float64
	peersOnNew                          int64 // the heartbeat set's size on the new master at the end
	// unreplicated is how many bytes of the replication stream the old
	// master had written when it was killed and the promoted replica
	// never applied (the old master's offset read just before the kill,
	// less the new master's offset at promotion); perWrite is the stream's
	// bytes per writing call the replicas made before the kill.
	unreplicated, perWrite float64
	elapsed                time.Duration
	err                    error
}

// runSentinelFailover drives the replicas for sentinelRun, kills the
// master at sentinelKillAt, and records every arrival, the switch and the
// breakers' transitions.
func runSentinelFailover(t *testing.T, g *testredis.Sentinels, replicas []*sidecar) sentinelRunResult {
	t.Helper()
	reqs := make([]*authv3.CheckRequest, sentinelKeys)
	for i := range reqs {
		reqs[i] = envoyRequest{path: "/a", headers: [][2]string{{"x-user", fmt.Sprintf("user-%03d", i)}}}.build()
	}
	var (
		mu     sync.Mutex
		res    = sentinelRunResult{arrivals: make([][]arrival, sentinelKeys)}
		calls  atomic.Int64
		wg     sync.WaitGroup
		failed atomic.Value
		begin  = time.Now()
	)
	ctx, cancel := context.WithTimeout(context.Background(), sentinelRun+time.Minute)
	defer cancel()
	old := g.Client(g.Master.Addr)
	startOffset, startWrites := replInfo(t, old, "master_repl_offset"), writingCalls(replicas)
	for w := 0; w < sentinelWorkers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 27))
			for time.Since(begin) < sentinelRun {
				n := calls.Add(1)
				k := rng.IntN(sentinelKeys)
				a, err := checkArrival(ctx, replicas[int(n)%len(replicas)], reqs[k], k, begin)
				if err != nil {
					failed.Store(err)
					return
				}
				mu.Lock()
				res.arrivals[k] = append(res.arrivals[k], a)
				mu.Unlock()
			}
		}()
	}
	degradedNow := func() float64 {
		var n float64
		for _, s := range replicas {
			n += s.metric("extauthz_degraded_decisions_total", "policy", "a")
		}
		return n
	}

	for time.Since(begin) < sentinelKillAt {
		time.Sleep(5 * time.Millisecond) // waiting for the instant of the kill
	}
	res.degradedBeforeKill = degradedNow()
	killOffset, writesBeforeKill := replInfo(t, old, "master_repl_offset"), writingCalls(replicas)-startWrites
	res.killedAt = time.Since(begin) // Kill returns once the process is gone
	g.Master.Kill()
	promoted, first, all := g.WaitPromoted(g.Master, sentinelRun)
	res.promoted, res.agreed, res.newMaster = first.Sub(begin), all.Sub(begin), promoted.Addr
	// second_repl_offset is the new master's offset at promotion, plus one.
	res.unreplicated = max(killOffset-(replInfo(t, g.Client(promoted.Addr), "second_repl_offset")-1), 0)
	res.perWrite = (killOffset - startOffset) / max(writesBeforeKill, 1)

	// Once every replica's breaker has closed again, the counters must
	// stand still: sample them then, and again at the end.
	var atUp float64
	for {
		res.breakers = sentinelBreakers(t, replicas)
		closed := 0
		for _, b := range res.breakers {
			if b.closed > 0 {
				closed++
			}
		}
		if closed == len(replicas) || time.Since(begin) > sentinelRun {
			atUp = degradedNow()
			break
		}
		time.Sleep(10 * time.Millisecond) // polling the replicas' logs for the breakers closing
	}
	wg.Wait()
	res.elapsed = time.Since(begin)
	res.degradedAfterUp = degradedNow() - atUp
	if n, err := g.Client(promoted.Addr).ZCard(ctx, redisstore.PeersKey("rl:")).Result(); err == nil {
		res.peersOnNew = n
	} else {
		t.Errorf("reading the heartbeat set on the new master: %v", err)
	}
	res.breakers = sentinelBreakers(t, replicas)
	res.firstDown, res.lastUp = res.elapsed, 0
	for _, b := range res.breakers {
		if !b.down.IsZero() {
			res.firstDown = min(res.firstDown, b.down.Sub(begin))
		}
		if !b.up.IsZero() {
			res.lastUp = max(res.lastUp, b.up.Sub(begin))
		}
	}
	if err, _ := failed.Load().(error); err != nil {
		res.err = err
	}
	return res
}

// writingCalls counts the replicas' Redis calls that write to the
// replication stream: decisions' and leases' (op lease), give-backs
// (return) and heartbeats (peers).
func writingCalls(replicas []*sidecar) float64 {
	n := 0.0
	for _, s := range replicas {
		for _, op := range []string{"lease", "return", "peers"} {
			n += s.metric("extauthz_redis_calls_total", "op", op, "result", "ok")
		}
	}
	return n
}

// replInfo reads a number from a server's INFO replication.
func replInfo(t *testing.T, c *redis.Client, field string) float64 {
	t.Helper()
	info, err := c.Info(context.Background(), "replication").Result()
	if err != nil {
		t.Fatalf("INFO replication: %v", err)
	}
	for _, line := range strings.Split(info, "\r\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			n, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatalf("INFO replication %s: %q", field, v)
			}
			return n
		}
	}
	t.Fatalf("INFO replication has no %s:\n%s", field, info)
	return 0
}

// sentinelBreakers reads each replica's breaker transitions from its log.
func sentinelBreakers(t *testing.T, replicas []*sidecar) []sentinelBreaker {
	t.Helper()
	var out []sentinelBreaker
	for _, s := range replicas {
		b := sentinelBreaker{replica: s.GRPC}
		for _, line := range strings.Split(s.logs.String(), "\n") {
			var rec struct {
				Time time.Time `json:"time"`
				Msg  string    `json:"msg"`
			}
			if json.Unmarshal([]byte(line), &rec) != nil {
				continue
			}
			switch rec.Msg {
			case "redis marked down; policies follow on_redis_error":
				b.opened++
				if b.down.IsZero() {
					b.down = rec.Time
				}
			case "redis is back; policies return to their mode":
				b.closed++
				b.up = rec.Time
			}
		}
		out = append(out, b)
	}
	return out
}

// The servers' password and the sentinels' own, each from its
// environment variable: decisions are made in Redis; a wrong sentinel
// password stops start-up naming both variables and printing neither
// password.
func TestSentinelPasswords(t *testing.T) {
	parallel(t)
	g := testredis.StartSentinels(t, testredis.SentinelOptions{Password: "server-pass", SentinelPassword: "sentinel-pass"})
	cfg := fmt.Sprintf("redis:\n  sentinel: {master_name: %s, addrs: [%s], password_env: SENTINEL_PASSWORD}\n  password_env: REDIS_PASSWORD\ndefault_mode: redis\n%s",
		g.Name, strings.Join(g.Addrs(), ", "), seedPolicy)

	code, out := runToExit(t, cfg, "REDIS_PASSWORD=server-pass", "SENTINEL_PASSWORD=wrong-pass")
	if code != 1 || !strings.Contains(out, "refused the credentials") || !strings.Contains(out, "$SENTINEL_PASSWORD") || !strings.Contains(out, "$REDIS_PASSWORD") {
		t.Fatalf("wrong sentinel password: exit %d\n%s", code, out)
	}
	if strings.Contains(out, "wrong-pass") || strings.Contains(out, "server-pass") {
		t.Fatalf("a password appears in the output:\n%s", out)
	}
	code, out = runToExit(t, cfg, "REDIS_PASSWORD=server-pass")
	if code != 1 || !strings.Contains(out, "redis.sentinel.password_env: environment variable SENTINEL_PASSWORD is not set") {
		t.Fatalf("unset sentinel password variable: exit %d\n%s", code, out)
	}

	s := startSidecarFile(t, writeConfig(t, cfg), []string{"REDIS_PASSWORD=server-pass", "SENTINEL_PASSWORD=sentinel-pass"})
	results, elapsed := timedDrive(t, []*sidecar{s}, 150, 8, adaOrder)
	assertAdmitted(t, tally(t, results)[200], 100, 100, time.Minute, elapsed, 1)
	if s.metric("extauthz_degraded_decisions_total") != 0 {
		t.Fatal("decisions fell back: the master was not reached through the sentinels")
	}
	if n, err := g.Client(g.Master.Addr).DBSize(context.Background()).Result(); err != nil || n == 0 {
		t.Fatalf("the master holds %d keys (%v): the decisions were not counted there", n, err)
	}
	logs := s.logs.String()
	if strings.Contains(logs, "sentinel-pass") || strings.Contains(logs, "server-pass") {
		t.Fatal("a password appears in the log")
	}
	if want := fmt.Sprintf(`"redis":"sentinel:%s@%s"`, g.Name, strings.Join(g.Addrs(), ",")); !strings.Contains(logs, want) {
		t.Fatalf("the start-up record lacks %s:\n%s", want, logs)
	}
}
