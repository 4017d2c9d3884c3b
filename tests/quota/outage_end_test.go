package quota_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/extauthz/extauthz/internal/quota"
	"github.com/extauthz/extauthz/internal/quota/redisstore"
	"github.com/extauthz/extauthz/tests/internal/testredis"
)

// The window in which an outage ends is not paid for twice, nor admitted
// twice. Replica A falls back while Redis is frozen and admits its share
// of two keys' window; B and C had no traffic then. As A comes back
// it charges what its fallback admitted to the window's Redis count
// (Store.chargeFellBack), and its calls hold the others' shares out of
// the window's room only until DownUntil (a probe round after its
// return), the last instant another replica could still be falling back.
// So the window admits its limit, exactly, through A alone and through B
// and C. Before, A's calls held the others' shares for the rest of the
// window, and through A the window admitted 10 of 30 (A's fallback 4, the
// window's part left then, and 6 from Redis); and Redis had counted none
// of A's admissions, so B and C admitted the whole limit on top of them:
// 34 of 30. Three replicas at the shipped breaker timings over one real
// Redis, each its own store; the windows and the outage are real time,
// which is the point.
func TestOutageEndsWithoutPayingTwice(t *testing.T) {
	t.Parallel() // its waits are real time, and its bounds hold on a loaded machine (run beside three busy loops)
	for _, mode := range []string{"redis", "hybrid"} {
		t.Run(mode, func(t *testing.T) {
			srv := testredis.Start(t)
			outageEndsWithoutPayingTwice(t, mode, outageSite{
				addrs:  []string{srv.Addr},
				freeze: srv.Freeze,
				thaw:   srv.Thaw,
				keyOn:  func(string) bool { return true },
			})
		})
	}
}

// The same on a Redis Cluster, one master frozen: each replica charges
// its fallback's units of the keys on a master as that master comes back
// (Store.back), and the others' shares are held until DownUntil there
// too. (Before, a Cluster's calls held them until the window ended, and
// a Cluster charged nothing: through A 10 of 30, through B and C 36 of 30
// in one run.)
func TestOutageEndsWithoutPayingTwiceOnACluster(t *testing.T) {
	t.Parallel() // as TestOutageEndsWithoutPayingTwice
	for _, mode := range []string{"redis", "hybrid"} {
		t.Run(mode, func(t *testing.T) {
			// cluster-require-full-coverage no: the other masters serve
			// their keys while one is frozen (tests/failover_test.go).
			c := testredis.StartClusterWith(t, testredis.ClusterOptions{Masters: 3, NodeTimeout: time.Second,
				Extra: []string{"--cluster-require-full-coverage", "no"}})
			cc := c.Client(t)
			victim := c.Masters[0]
			outageEndsWithoutPayingTwice(t, mode, outageSite{
				addrs:  c.Addrs(),
				freeze: victim.Freeze,
				thaw:   victim.Thaw,
				keyOn: func(key string) bool {
					m, err := cc.MasterForKey(context.Background(), "rl:{"+key+"}")
					if err != nil {
						t.Fatal(err)
					}
					return m.Options().Addr == victim.Addr
				},
			})
		})
	}
}

// outageSite is where outageEndsWithoutPayingTwice runs: the Redis
// addresses, how the outage begins and ends, and which keys it takes.
type outageSite struct {
	addrs        []string
	freeze, thaw func()
	keyOn        func(key string) bool // the key is on what freeze takes away
}

// keyNamed is the first key base-0, base-1, ... the outage takes.
func (o outageSite) keyNamed(base string) string {
	for i := 0; ; i++ {
		if k := fmt.Sprintf("%s-%d", base, i); o.keyOn(k) {
			return k
		}
	}
}

func outageEndsWithoutPayingTwice(t *testing.T, mode string, site outageSite) {
	var replicas []*redisstore.Resilient
	var metrics []*redisstore.Metrics
	for i := range 3 {
		store, m := pipeStore(t, site.addrs, fmt.Sprintf("replica-%d", i), nil)
		table := newTable(t)
		store.ChargeDebtsOf(table) // as redisstore.Open wires it: what a replica's fallback admitted is charged as Redis comes back
		replicas = append(replicas, resilientStackOn(t, mode, store, table, m, time.Now, 3, redisstore.HybridOptions{}))
		metrics = append(metrics, m)
	}
	a := replicas[0]
	const limit = 30 // a share of 10 a replica
	// The window is real time (Redis TIME), which is the point. The run
	// (a few seconds) must fit in one window, and the outage must begin
	// with two thirds of it left: A's fallback share is a third of the
	// limit's part of the window left when the outage began (6 or more
	// here). (The test had an hour's window and waited only for the run
	// to fit: in an hour's last 6 minutes A's fallback admitted nothing
	// and the test failed.)
	const window = 30 * time.Second
	l := quota.Limit{Algorithm: quota.FixedWindow, Limit: limit, Window: window, OnError: quota.ErrorFallback}
	if left := time.Until(time.Now().Truncate(window).Add(window)); left < 2*window/3 {
		time.Sleep(left + 10*time.Millisecond)
	}
	ctx := context.Background()
	take := func(r *redisstore.Resilient, key string) quota.Decision {
		t.Helper()
		d, err := r.Take(ctx, key, l, 1, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	probe, throughA, throughOthers := site.keyNamed("probe"), site.keyNamed("through-a"), site.keyNamed("through-others")
	for _, r := range replicas {
		if d := take(r, site.keyNamed("warm")); !d.Allowed || d.Degraded != 0 {
			t.Fatalf("Redis healthy: %+v", d)
		}
	}

	// Redis frozen: A's breaker opens (its call stalls), and its
	// fallback admits its share of each key.
	site.freeze()
	thawed := false
	t.Cleanup(func() {
		if !thawed {
			site.thaw()
		}
	})
	for deadline := time.Now().Add(3 * time.Second); take(a, probe).Degraded == 0; {
		if time.Now().After(deadline) {
			t.Fatal("Redis frozen 3s: A still decides through it")
		}
	}
	fell := map[string]int{}
	for _, key := range []string{throughA, throughOthers} {
		for range limit {
			d := take(a, key)
			if d.Degraded != quota.DegradedFallback {
				t.Fatalf("Redis frozen, A's breaker open: %+v", d)
			}
			if d.Allowed {
				fell[key]++
			}
		}
		if fell[key] == 0 || fell[key] > limit/3 {
			t.Fatalf("A's fallback admitted %d of %s; want some, its share (%d) at most", fell[key], key, limit/3)
		}
	}

	// Redis back: A returns within a probe round, then a request every
	// 10ms for 2s (past A's DownUntil, a probe round after its return):
	// throughA through A, throughOthers through B and C in turn.
	site.thaw()
	thawed = true
	for deadline := time.Now().Add(5 * time.Second); take(a, probe).Degraded != 0; {
		if time.Now().After(deadline) {
			t.Fatal("Redis back 5s: A still falls back")
		}
		time.Sleep(10 * time.Millisecond) // the breaker probes every 500ms while down
	}
	admitted := map[string]int{}
	for i, end := 0, time.Now().Add(2*time.Second); time.Now().Before(end); i++ {
		for _, ask := range []struct {
			key string
			r   *redisstore.Resilient
		}{{throughA, a}, {throughOthers, replicas[1+i%2]}} {
			d := take(ask.r, ask.key)
			if d.Degraded != 0 {
				t.Fatalf("Redis back: %s: %+v", ask.key, d)
			}
			if d.Allowed {
				admitted[ask.key]++
			}
		}
		time.Sleep(10 * time.Millisecond) // a request every 10ms, for 2s of real time
	}
	for _, key := range []string{throughA, throughOthers} {
		if total := fell[key] + admitted[key]; total != limit {
			t.Errorf("%s: the window admitted %d by A's fallback and %d from Redis after: %d; want its limit, %d", key, fell[key], admitted[key], total, limit)
		}
	}
	if charged := testutil.ToFloat64(metrics[0].Calls.WithLabelValues("fell_back", "ok")); charged != 3 {
		t.Errorf("A charged %v windows as it came back; want the 3 its fallback admitted in (%s, %s, %s)", charged, probe, throughA, throughOthers)
	}
}
