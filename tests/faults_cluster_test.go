package tests

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/extauthz/extauthz/tests/internal/testredis"
)

// A network fault on one master of a Redis Cluster only: toxiproxy in
// front of that master, which announces the proxy's port as its own
// (cluster-announce-port), so every client the cluster's slot map sends
// to it goes through the proxy, while the other masters are reached
// directly. Redis mode and hybrid share the cluster under key prefixes of
// their own (so each mode's keys and heartbeats are its own), three
// replicas each, the contract of TestNetworkFaults checked per fault
// (make test-faults only).

// clusterFaults are the faults run on one master.
var clusterFaults = []string{"latency 80ms ±40ms", "blackhole (timeout toxic)", "reset_peer on half the connections"}

func TestNetworkFaultsOnOneClusterMaster(t *testing.T) {
	serial(t, "it measures decisions through injected network faults at the breaker's defaults: other tests' load would add faults of its own")
	if !*faultsFull {
		t.Skip("the Cluster runs with the full matrix: make test-faults")
	}
	c := testredis.StartCluster(t, 3)
	x := startToxiproxy(t)
	victim := c.Masters[0]
	proxied := x.proxy("master0", victim.Addr)
	_, proxyPort, _ := net.SplitHostPort(proxied)
	_, realPort, _ := net.SplitHostPort(victim.Addr)
	rp, _ := strconv.Atoi(realPort)
	ctx := context.Background()
	admin := victim.Client()
	defer admin.Close()
	// The bus port stays the real one: only clients go through the proxy.
	must(t, admin.ConfigSet(ctx, "cluster-announce-bus-port", strconv.Itoa(rp+10000)).Err())
	must(t, admin.ConfigSet(ctx, "cluster-announce-port", proxyPort).Err())
	for _, n := range c.Masters {
		nc := n.Client()
		for deadline := time.Now().Add(15 * time.Second); ; {
			nodes, _ := nc.ClusterNodes(ctx).Result()
			if strings.Contains(nodes, "127.0.0.1:"+proxyPort+"@") {
				break
			}
			if time.Now().After(deadline) {
				nc.Close()
				t.Fatalf("node %s does not announce the proxy for %s within 15s:\n%s", n.Addr, victim.Addr, nodes)
			}
			time.Sleep(50 * time.Millisecond) // gossip spreading the new port
		}
		nc.Close()
	}
	seeds := strings.Join(c.Addrs()[1:], ", ") // the victim is found through the others' slot maps
	var modes []*modeUnderFault
	for _, mode := range []string{"redis", "hybrid"} {
		// key_prefix: the two modes share the cluster; each keeps its
		// own keys and its own heartbeat set (three peers, not six).
		cfg := fmt.Sprintf("redis: {addrs: [%s], key_prefix: %q}\ndefault_mode: %s\n%s", seeds, mode+":", mode, faultPolicy)
		var replicas []*sidecar
		for range 3 {
			replicas = append(replicas, startProcess(t, faultBinary(), writeConfig(t, cfg), nil))
		}
		waitPeers(t, replicas, 3)
		modes = append(modes, checkMode(mode, "master0", replicas))
	}
	faultSuite{
		faults:    clusterFaults,
		label:     ", one Cluster master",
		sourceNet: 150,
		check:     func(t *testing.T, runs []*faultRun, plan faultPlan) { checkNetFault(t, runs, plan.keys) },
	}.run(t, x, modes)
}
