package quota_test

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/extauthz/extauthz/internal/quota"
	"github.com/extauthz/extauthz/internal/quota/redisstore"
	"github.com/extauthz/extauthz/tests/internal/testredis"
)

// redis.wait_replicas: a hybrid lease call is followed by WAIT, and a
// lease fewer replicas acknowledge is not spent past the request that
// took it. Against a Redis with no replica every WAIT finds none, so
// each decision makes a lease call of its own, as redis mode calls
// Redis; the twin without WAIT spends one slice. (The failover this
// bounds is tests/, TestSentinelFailoverLosesWritesWithWait.)
func TestHybridWaitReplicasParksUnacknowledgedLeases(t *testing.T) {
	srv := testredis.Start(t)
	const decisions = 20
	for _, c := range []struct {
		name string
		wait int
	}{{"no WAIT", 0}, {"wait_replicas 1, no replica", 1}} {
		t.Run(c.name, func(t *testing.T) {
			clients, err := redisstore.NewClients(redisstore.ClientOptions{Addrs: []string{srv.Addr}, Name: "test"})
			if err != nil {
				t.Fatal(err)
			}
			defer clients.Close()
			m := redisstore.NewMetrics(nil)
			// wait_timeout 1ms, WAIT's resolution: the run waits it out
			// once per decision.
			store := redisstore.NewStore(clients.Pipe, clients.StoreOptions(redisstore.StoreOptions{
				Prefix: "rl:" + c.name + ":", Timeout: time.Second, Metrics: m, Log: quiet,
				WaitReplicas: c.wait, WaitTimeout: time.Millisecond}))
			defer store.Close()
			h := redisstore.NewHybrid(newTable(t), store, fixedPeers(1), redisstore.HybridOptions{SliceIdle: time.Hour, Metrics: m, Log: quiet})
			defer h.Close(context.Background())
			// Far from the limit: a slice is many tokens.
			l := quota.Limit{Algorithm: quota.TokenBucket, Limit: 6000, Window: time.Minute}
			for i := range decisions {
				if d, err := h.Take(context.Background(), "k", l, 1, time.Now()); err != nil || !d.Allowed {
					t.Fatalf("decision %d far from the limit: %+v, %v", i, d, err)
				}
			}
			calls, unreplicated := leaseCalls(m), testutil.ToFloat64(m.LeasesUnreplicated)
			t.Logf("%d decisions: %v lease calls, %v leases unreplicated", decisions, calls, unreplicated)
			if c.wait == 0 {
				if calls >= decisions/2 || unreplicated != 0 {
					t.Fatalf("without WAIT: %v lease calls, %v unreplicated for %d decisions; want a slice spent, none unreplicated", calls, unreplicated, decisions)
				}
				return
			}
			if calls != decisions || unreplicated != decisions {
				t.Fatalf("with wait_replicas 1 and no replica: %v lease calls, %v unreplicated for %d decisions; want one each per decision (no lease spent past its request)",
					calls, unreplicated, decisions)
			}
		})
	}
}
