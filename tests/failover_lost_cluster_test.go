package tests

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/extauthz/extauthz/tests/internal/testredis"
)

// The Sentinel runs' failover that loses writes (failover_lost_test.go)
// on a Redis Cluster: each mode on a Cluster of its own (three masters,
// a replica each, startFailoverCluster's one-second node timeout), three
// sidecars per mode at the shipped defaults, the same requests to both.
// The master of user-0's key is cut off its replica, loaded, and killed;
// the other masters promote the stale replica. The keys spread over the
// three masters as Cluster slots put them: those on the other masters
// lose nothing. The claims are the Sentinel runs' (assertLostFailover),
// the lost calls counted on the killed master. On a Cluster the
// heartbeat reads the run_id of the epoch key's master only: a key on
// another master learns of the loss at its next call, from its lease's
// incarnation and generation (docs/reliability.md, "When Redis
// forgets"). make test-faults runs it.
func TestClusterFailoverLosesWrites(t *testing.T) {
	serial(t, "it kills and promotes Redis Cluster masters and asserts that every breaker closes within the run at the breaker's defaults: other tests' load would stretch the failover past it")
	if !*faultsFull {
		t.Skip("make test-faults")
	}
	for _, c := range lostScenarios {
		if c.quiet {
			// Quiet, no call reaches the killed master's slots before
			// the promotion, so no breaker opens and none closes: the
			// run has no instant to start the load from.
			continue
		}
		t.Run(c.name, func(t *testing.T) {
			ch, cr := startFailoverCluster(t), startFailoverCluster(t)
			victim := clusterVictim(t, ch)
			if v := clusterVictim(t, cr); v != victim {
				t.Fatalf("user-0's key lies on master %d of one cluster and %d of the other", victim, v)
			}
			f := &sideBySide{}
			for range 3 {
				f.hybrid = append(f.hybrid, startFastSidecar(t, clusterConfig(ch, "hybrid", flushPolicy)))
				f.redis = append(f.redis, startFastSidecar(t, clusterConfig(cr, "redis", flushPolicy)))
			}
			waitPeers(t, f.hybrid, 3)
			waitPeers(t, f.redis, 3)
			r := runLostFailover(t, f, clusterLost{t, ch, victim}, clusterLost{t, cr, victim}, c.lost, c.quiet)
			assertLostFailover(t, r, c.quiet, false)
		})
	}
}

// clusterVictim is the index of the master serving user-0's key.
func clusterVictim(t *testing.T, c *testredis.Cluster) int {
	t.Helper()
	slot, err := c.Client(t).ClusterKeySlot(context.Background(), "rl:{a:header:x-user:user-0}").Result()
	must(t, err)
	return slotOwner(t, c, slot)
}

// clusterLost is one master of a Cluster and its replica.
type clusterLost struct {
	t      *testing.T
	c      *testredis.Cluster
	victim int
}

func (g clusterLost) cut() testredis.Replicated  { return g.c.CutReplication(g.t, g.victim) }
func (g clusterLost) kill() testredis.Replicated { return g.c.KillMasterCounted(g.t, g.victim) }
func (g clusterLost) promoted(d time.Duration) (*redis.Client, time.Time) {
	killed := g.c.Masters[g.victim]
	from := g.c.Masters[(g.victim+1)%len(g.c.Masters)]
	at := g.c.WaitPromoted(g.t, killed, from, d)
	return g.c.ReplicaOf(g.t, g.victim).Client(), at
}

func (g clusterLost) oneNode() bool { return false }
