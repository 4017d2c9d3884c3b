package tests

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"

	"github.com/extauthz/extauthz/tests/internal/testredis"
)

// A Redis Cluster losing a master under load, as a user runs it: three
// masters with a replica each, cluster-node-timeout 1000 (the replica is
// promoted about a second after the others agree the master failed),
// three sidecars at the shipped defaults given the three masters, 100
// keys of 100 per minute (burst 100) under 32 concurrent Checks for 8s,
// and one master killed (SIGKILL) 2s in.
//
// The claims (docs/modes.md, "Redis Cluster: one master at a time"):
//   - only the keys whose slots the dead master served fall back; keys on
//     the other masters are decided by Redis throughout;
//   - each master's breaker opens at most once: the dead master's, once;
//   - those keys return to their mode within a second of the promotion;
//   - the replicas together admit what exact buckets admit, within 2%,
//     for the keys of the dead master as a set:
//     a fallback starts from the replica's share of the level the master
//     last reported, and what it admitted is charged to the promoted
//     replica's bucket when the key returns. What async replication may
//     lose (the last decisions the dead master made before its replica
//     saw them) is the bound's remainder.
const (
	failoverKeys    = 100
	failoverLimit   = 100 // per minute
	failoverBurst   = 100
	failoverWorkers = 32
	failoverRun     = 8 * time.Second
	failoverKillAt  = 2 * time.Second
)

// failoverPolicies splits the keys between two identical policies, so
// that each policy's degraded-decision counter tells whose keys fell back:
// "a" holds the keys on the master that is killed, "o" the others.
var failoverPolicies = fmt.Sprintf(`
policies:
  - {name: a, match: {path_prefix: /a}, key: ["header:x-user"], limit: %[1]d, window: 1m, burst: %[2]d}
  - {name: o, match: {path_prefix: /o}, key: ["header:x-user"], limit: %[1]d, window: 1m, burst: %[2]d}
`, failoverLimit, failoverBurst)

// startFailoverCluster starts the cluster above. Every node runs with
// cluster-require-full-coverage no, Redis's setting for a store that
// prefers serving most keys to serving none (docs/modes.md): with Redis's
// default (yes) every master refuses every key with CLUSTERDOWN from the
// moment the others agree a master failed until its replica is promoted
// (0.8s measured here), and every key falls back for that long.
func startFailoverCluster(t *testing.T) *testredis.Cluster {
	t.Helper()
	return testredis.StartClusterWith(t, testredis.ClusterOptions{
		Masters: 3, Replicas: 1, NodeTimeout: time.Second,
		Extra: []string{"--cluster-require-full-coverage", "no"},
	})
}

// failoverUser is one key of the run: the user, its policy's path, and
// whether the killed master serves it.
type failoverUser struct {
	name     string
	path     string
	onVictim bool
}

// failoverUsers assigns users to the policies: a user whose key under
// policy "a" lies on the victim master goes to "a"; one whose key under
// "o" lies elsewhere goes to "o"; about a third of the keys land on the
// victim, as Cluster slots spread them.
func failoverUsers(t *testing.T, c *testredis.Cluster, victim int) []failoverUser {
	t.Helper()
	cc := c.Client(t)
	ctx := context.Background()
	owner := func(policy, user string) int {
		slot, err := cc.ClusterKeySlot(ctx, "rl:{"+policy+":header:x-user:"+user+"}").Result()
		must(t, err)
		return slotOwner(t, c, slot)
	}
	var users []failoverUser
	for i := 0; len(users) < failoverKeys; i++ {
		name := fmt.Sprintf("user-%03d", i)
		switch {
		case owner("a", name) == victim:
			users = append(users, failoverUser{name, "/a", true})
		case owner("o", name) != victim:
			users = append(users, failoverUser{name, "/o", false})
		}
	}
	return users
}

// failoverRunResult is what one failover run measured.
type failoverRunResult struct {
	arrivals  [][]arrival // per user
	killedAt  time.Duration
	promoted  time.Duration // when a surviving master first named the new owner
	returned  time.Duration // the last instant a replica's "a" fallback count rose
	elapsed   time.Duration
	statusErr error
	lostBytes int64 // of the replication stream, the killed master's the promoted replica never got
}

func TestClusterFailoverUnderLoad(t *testing.T) {
	serial(t, "live masters must never be marked down (a 100ms probe) and the dead one's keys return within 1s of the promotion: the breaker's defaults")
	for _, mode := range []string{"hybrid", "redis"} {
		t.Run(mode, func(t *testing.T) { testClusterFailover(t, mode) })
	}
}

func testClusterFailover(t *testing.T, mode string) {
	cluster := startFailoverCluster(t)
	// The victim is the master serving the heartbeat set: its failure
	// also stops every replica's peer count from refreshing.
	cc := cluster.Client(t)
	peersSlot, err := cc.ClusterKeySlot(context.Background(), "rl:{peers}").Result()
	must(t, err)
	victim := slotOwner(t, cluster, peersSlot)
	users := failoverUsers(t, cluster, victim)
	// The binary built without the race detector, as users run it: the
	// run is about rates (how far over their limits 32 workers push the
	// keys in 8s), and the race detector slows the sidecars several times
	// over. TestClusterMasterKilled in tests/quota runs the same breaker
	// under the race detector.
	cfg := clusterConfig(cluster, mode, failoverPolicies)
	replicas := []*sidecar{startFastSidecar(t, cfg), startFastSidecar(t, cfg), startFastSidecar(t, cfg)}

	r := runFailover(t, cluster, victim, replicas, users)
	if r.statusErr != nil {
		t.Fatal(r.statusErr)
	}

	// Exactness: each key against an exact token bucket fed the same
	// arrivals (see exactTokenBucket).
	var admitted, loSum, hiSum, onVictim int
	var split [2]struct{ admitted, lo, hi int } // keys elsewhere, keys on the victim
	for u, as := range r.arrivals {
		got := 0
		for _, a := range as {
			if a.allowed {
				got++
			}
		}
		lo, hi := exactTokenBucket(as, failoverBurst, time.Minute/failoverLimit)
		admitted, loSum, hiSum = admitted+got, loSum+lo, hiSum+hi
		v := 0
		if users[u].onVictim {
			onVictim, v = onVictim+1, 1
		}
		split[v].admitted, split[v].lo, split[v].hi = split[v].admitted+got, split[v].lo+lo, split[v].hi+hi
	}
	t.Logf("%s: keys on the killed master admitted %d of exact %d-%d; the others %d of %d-%d", mode,
		split[1].admitted, split[1].lo, split[1].hi, split[0].admitted, split[0].lo, split[0].hi)
	degradedA, degradedO := 0.0, 0.0
	for _, s := range replicas {
		degradedA += s.metric("extauthz_degraded_decisions_total", "policy", "a")
		degradedO += s.metric("extauthz_degraded_decisions_total", "policy", "o")
	}
	decisions := 0
	for _, as := range r.arrivals {
		decisions += len(as)
	}
	t.Logf("%s: %d decisions in %v on %d keys (%d on the killed master); killed at %v, promoted %v later, keys back %v after the promotion",
		mode, decisions, r.elapsed.Round(time.Millisecond), failoverKeys, onVictim, r.killedAt.Round(time.Millisecond),
		(r.promoted - r.killedAt).Round(time.Millisecond), (r.returned - r.promoted).Round(time.Millisecond))
	if r.lostBytes != 0 {
		t.Fatalf("%s: the promoted replica lacked %d bytes of the killed master's replication stream; want none", mode, r.lostBytes)
	}
	t.Logf("%s: admitted %d; exact buckets admit %d to %d: %.4f to %.4f of exact; degraded decisions: %v on the killed master's keys, %v elsewhere",
		mode, admitted, loSum, hiSum, float64(admitted)/float64(hiSum), float64(admitted)/float64(loSum), degradedA, degradedO)

	transitions := breakerTransitions(t, replicas)
	t.Logf("%s: breaker transitions per node: %v", mode, transitions)
	victimAddr := cluster.Masters[victim].Addr
	for node, n := range transitions {
		if n > 1 {
			t.Errorf("node %s: %d breaker transitions on one replica, want at most 1", node, n)
		}
		if node != victimAddr {
			t.Errorf("node %s (alive) was marked down", node)
		}
	}
	if degradedO != 0 {
		t.Errorf("%v decisions for keys on live masters were made without Redis", degradedO)
	}
	if degradedA == 0 {
		t.Errorf("no decision for the killed master's keys fell back: the test proved nothing")
	}
	if back := r.returned - r.promoted; back > time.Second {
		t.Errorf("the killed master's keys fell back until %v after the promotion; want within 1s", back)
	}
	// Within 2% of exact buckets (docs/modes.md), per key set: the keys whose
	// master failed, which alone fell back, against their own exact
	// buckets (over all 100 keys, the two thirds that never fell back
	// would dilute their error by three), and the keys elsewhere, which
	// Redis decided throughout, never over theirs.
	victimSet, others := split[1], split[0]
	if float64(victimSet.admitted) > 1.02*float64(victimSet.hi) || float64(victimSet.admitted) < 0.98*float64(victimSet.lo) {
		t.Errorf("the killed master's %d keys admitted %d; their exact buckets admit %d to %d: want within 2%%", onVictim, victimSet.admitted, victimSet.lo, victimSet.hi)
	}
	if others.admitted > others.hi || float64(others.admitted) < 0.98*float64(others.lo) {
		t.Errorf("the %d keys on live masters admitted %d; their exact buckets admit %d to %d: want none over, within 2%% under", failoverKeys-onVictim, others.admitted, others.lo, others.hi)
	}
}

// runFailover drives the replicas for failoverRun, kills the victim master
// at failoverKillAt, and records every arrival, the promotion and when
// the victim's keys stopped falling back.
func runFailover(t *testing.T, c *testredis.Cluster, victim int, replicas []*sidecar, users []failoverUser) failoverRunResult {
	t.Helper()
	reqs := make([]*authv3.CheckRequest, len(users))
	for i, u := range users {
		reqs[i] = envoyRequest{path: u.path, headers: [][2]string{{"x-user", u.name}}}.build()
	}
	var (
		mu       sync.Mutex
		res      = failoverRunResult{arrivals: make([][]arrival, len(users))}
		calls    atomic.Int64
		wg       sync.WaitGroup
		failed   atomic.Value
		begin    = time.Now()
		stopPoll = make(chan struct{})
	)
	ctx, cancel := context.WithTimeout(context.Background(), failoverRun+time.Minute)
	defer cancel()
	for w := 0; w < failoverWorkers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 20))
			for time.Since(begin) < failoverRun {
				n := calls.Add(1)
				k := rng.IntN(len(users))
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

	// The victim's keys' fallback count, polled: the last instant it rose
	// is when they were last decided without Redis.
	var pollWG sync.WaitGroup
	pollWG.Add(1)
	go func() {
		defer pollWG.Done()
		var last float64
		for {
			select {
			case <-stopPoll:
				return
			case <-time.After(25 * time.Millisecond): // a sampling period, not synchronisation
			}
			var n float64
			for _, s := range replicas {
				n += s.metric("extauthz_degraded_decisions_total", "policy", "a")
			}
			if n > last {
				last = n
				mu.Lock()
				res.returned = time.Since(begin)
				mu.Unlock()
			}
		}
	}()

	// The kill, 2s in, and the promotion as a surviving master sees it.
	for time.Since(begin) < failoverKillAt {
		time.Sleep(5 * time.Millisecond) // waiting for the instant of the kill
	}
	// Killed once its replica holds every write it ran: this run is
	// about the fallback through a failover that loses nothing (one
	// crashed mid-stream loses what it had not sent, a token per call
	// lost in redis mode: TestClusterFailoverLosesWrites).
	atKill := c.KillMasterReplicated(t, victim)
	res.killedAt = time.Since(begin)
	survivor := c.Masters[(victim+1)%len(c.Masters)]
	res.promoted = c.WaitPromoted(t, c.Masters[victim], survivor, failoverRun).Sub(begin)
	// second_repl_offset is the new master's offset at promotion, plus one.
	res.lostBytes = atKill.Offset - (int64(replInfo(t, c.ReplicaOf(t, victim).Client(), "second_repl_offset")) - 1)

	wg.Wait()
	res.elapsed = time.Since(begin)
	close(stopPoll)
	pollWG.Wait()
	if err, _ := failed.Load().(error); err != nil {
		res.statusErr = err
	}
	return res
}

// exactTokenBucket is what one exact token bucket (capacity burst, a
// token every interval, full at the key's first decision) admits for a
// key's arrivals, fed once at the instants the requests were sent and
// once at the instants their answers came back. Each decision happened
// somewhere in between, so the exact count is within a token or so of
// both: decisions take milliseconds and a token comes every 600ms. The
// lower and the higher count are returned.
func exactTokenBucket(as []arrival, burst int, interval time.Duration) (lo, hi int) {
	count := func(at func(arrival) time.Duration) int {
		ts := make([]time.Duration, len(as))
		for i, a := range as {
			ts[i] = at(a)
		}
		slices.Sort(ts)
		tokens, admitted := float64(burst), 0
		for i, t := range ts {
			if i > 0 {
				tokens = min(float64(burst), tokens+float64(t-ts[i-1])/float64(interval))
			}
			if tokens >= 1 {
				tokens--
				admitted++
			}
		}
		return admitted
	}
	a, b := count(func(a arrival) time.Duration { return a.sent }), count(func(a arrival) time.Duration { return a.back })
	return min(a, b), max(a, b)
}

// breakerTransitions counts, per node and replica, the times a replica's
// breaker opened, from its log ("redis marked down" records name the
// node), and returns the highest count per node over the replicas.
func breakerTransitions(t *testing.T, replicas []*sidecar) map[string]int {
	t.Helper()
	out := map[string]int{}
	for _, s := range replicas {
		per := map[string]int{}
		for _, line := range strings.Split(s.logs.String(), "\n") {
			var rec struct {
				Time  time.Time `json:"time"`
				Msg   string    `json:"msg"`
				Node  string    `json:"node"`
				Error string    `json:"error"`
				Probe string    `json:"probe"`
			}
			if json.Unmarshal([]byte(line), &rec) != nil || rec.Msg != "redis marked down; policies follow on_redis_error" {
				continue
			}
			t.Logf("replica %s marked %s down at %s: %s; probe: %s", s.GRPC, rec.Node, rec.Time.Format("15:04:05.000"), rec.Error, rec.Probe)
			node := rec.Node
			if node == "" {
				node = "(the whole cluster)"
			}
			per[node]++
		}
		for node, n := range per {
			out[node] = max(out[node], n)
		}
	}
	return out
}
