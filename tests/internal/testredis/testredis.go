// Package testredis starts real redis-server processes on reserved loopback
// ports: for tests, standalone servers that can be killed, frozen and
// restarted, Redis Clusters, and replication groups watched by Redis
// Sentinel (sentinel.go), each stopped when its test ends; for the
// benchmark and the demo, detached servers and the extauthz processes
// beside them (detached.go). `make test` installs redis-server and
// redis-sentinel where they are missing.
package testredis

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Server is one redis-server process.
type Server struct {
	Addr string // 127.0.0.1:port
	t    testing.TB

	adminOnce sync.Once
	adminC    *redis.Client // for polling loops, one client for all
	port      int
	// reserved holds port (and its Cluster bus port) for the server's
	// whole life, so that Restart and Revive find it free (ports.go).
	reserved *Port
	dir      string
	args     []string
	tls      *TLSFiles
	// sentinelConf is a sentinel's configuration file; "": a server.
	sentinelConf string
	cmd          *exec.Cmd
	done         chan struct{} // closed when the process has exited
}

// Binary returns the path of redis-server or fails the test with how to
// get it.
func Binary(t testing.TB) string {
	t.Helper()
	p, err := exec.LookPath("redis-server")
	if err != nil {
		t.Fatalf("redis-server not found: run `make test` (it installs it) or `apt-get install -y redis-server`")
	}
	return p
}

// Start runs a standalone redis-server on a free 127.0.0.1 port, with no
// persistence, and stops it when the test ends. extra are further
// redis-server arguments, such as "--requirepass", "secret".
func Start(t testing.TB, extra ...string) *Server {
	t.Helper()
	return launch(t, &Server{t: t, dir: t.TempDir(), args: extra})
}

// launch starts s on a reserved port (ports.go), held until the test
// ends, trying another when the server cannot start on one.
func launch(t testing.TB, s *Server) *Server {
	t.Helper()
	var err error
	for attempt := 0; attempt < 5; attempt++ {
		s.reserved, err = Reserve()
		if err != nil {
			t.Fatal(err)
		}
		s.port = s.reserved.N
		if err = s.start(); err == nil {
			t.Cleanup(func() { s.Kill(); s.reserved.Release() })
			return s
		}
		s.reserved.Release()
	}
	t.Fatalf("starting redis-server: %v", err)
	return nil
}

// TLSFiles are the PEM files of a TLS-only server.
type TLSFiles struct {
	Cert, Key, CA string
	AuthClients   bool // require a client certificate signed by CA
}

// StartTLS is Start for a server that speaks only TLS on its port.
func StartTLS(t testing.TB, files TLSFiles, extra ...string) *Server {
	t.Helper()
	return launch(t, &Server{t: t, dir: t.TempDir(), args: extra, tls: &files})
}

func (s *Server) start() error {
	s.Addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port))
	port := []string{"--port", strconv.Itoa(s.port)}
	if f := s.tls; f != nil {
		auth := "no"
		if f.AuthClients {
			auth = "yes"
		}
		port = []string{"--port", "0", "--tls-port", strconv.Itoa(s.port), "--tls-cert-file", f.Cert,
			"--tls-key-file", f.Key, "--tls-ca-cert-file", f.CA, "--tls-auth-clients", auth}
	}
	args := append(append(port, "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--daemonize", "no",
		"--dir", s.dir, "--loglevel", "warning"), s.args...)
	s.cmd = exec.Command(Binary(s.t), args...)
	if s.sentinelConf != "" {
		argv := s.sentinelArgs()
		s.cmd = exec.Command(argv[0], argv[1:]...)
	}
	s.cmd.Stdout = &prefixWriter{}
	s.cmd.Stderr = s.cmd.Stdout
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := s.cmd.Start(); err != nil {
		return err
	}
	done := make(chan struct{})
	s.done = done
	go func() { s.cmd.Wait(); close(done) }()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case <-done:
			return fmt.Errorf("redis-server on port %d exited: %s", s.port, s.cmd.Stdout.(*prefixWriter).String())
		default:
		}
		c, err := net.DialTimeout("tcp", s.Addr, 100*time.Millisecond)
		if err == nil {
			c.Close()
			return nil
		}
		time.Sleep(10 * time.Millisecond) // polling a child process for readiness
	}
	s.cmd.Process.Kill()
	return fmt.Errorf("redis-server on port %d did not listen within 10s", s.port)
}

// Client returns a client for the server, closed when the test ends.
func (s *Server) Client(opts ...func(*redis.Options)) *redis.Client {
	o := &redis.Options{Addr: s.Addr}
	for _, f := range opts {
		f(o)
	}
	c := redis.NewClient(o)
	s.t.Cleanup(func() { c.Close() })
	return c
}

// admin returns one client of the server's, for helpers that poll it.
func (s *Server) admin() *redis.Client {
	s.adminOnce.Do(func() { s.adminC = s.Client() })
	return s.adminC
}

// Kill stops the server with SIGKILL (a crash) and waits for it to go.
func (s *Server) Kill() {
	if s.cmd == nil || s.cmd.Process == nil {
		return
	}
	s.cmd.Process.Kill()
	select {
	case <-s.done:
	case <-time.After(10 * time.Second):
		s.t.Errorf("redis-server on %s did not exit after SIGKILL", s.Addr)
	}
}

// Freeze stops the process with SIGSTOP: connections stay open and calls
// hang, as with a stuck server or a network partition.
func (s *Server) Freeze() { s.cmd.Process.Signal(syscall.SIGSTOP) }

// Thaw resumes a frozen server.
func (s *Server) Thaw() { s.cmd.Process.Signal(syscall.SIGCONT) }

// Restart kills the server and starts an empty one on the same port.
func (s *Server) Restart() {
	s.t.Helper()
	s.Kill()
	s.Revive()
}

// Revive starts an empty server on the port of a killed one. The port
// stayed reserved meanwhile (ports.go): no other server can have taken it.
func (s *Server) Revive() {
	s.t.Helper()
	if err := s.start(); err != nil {
		s.t.Fatalf("restarting redis-server on its reserved port: %v", err)
	}
}

// CommandCalls returns how many times each command ran, from INFO
// commandstats, such as {"evalsha": 12, "eval": 1}.
func (s *Server) CommandCalls(ctx context.Context, c redis.UniversalClient) map[string]int64 {
	return commandCalls(ctx, c)
}

func commandCalls(ctx context.Context, c redis.UniversalClient) map[string]int64 {
	out := map[string]int64{}
	var infos []string
	if cc, ok := c.(*redis.ClusterClient); ok {
		var mu sync.Mutex // ForEachMaster runs the masters concurrently
		cc.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
			info := m.Info(ctx, "commandstats").Val()
			mu.Lock()
			infos = append(infos, info)
			mu.Unlock()
			return nil
		})
	} else {
		infos = append(infos, c.Info(ctx, "commandstats").Val())
	}
	for _, info := range infos {
		for _, line := range strings.Split(info, "\n") {
			// cmdstat_evalsha:calls=12,usec=345,...
			name, rest, ok := strings.Cut(strings.TrimSpace(line), ":")
			if !ok || !strings.HasPrefix(name, "cmdstat_") {
				continue
			}
			for _, kv := range strings.Split(rest, ",") {
				if v, ok := strings.CutPrefix(kv, "calls="); ok {
					n, _ := strconv.ParseInt(v, 10, 64)
					out[strings.TrimPrefix(name, "cmdstat_")] += n
				}
			}
		}
	}
	return out
}

// prefixWriter keeps the server's output for error messages.
type prefixWriter struct{ b strings.Builder }

func (w *prefixWriter) Write(p []byte) (int, error) {
	if w.b.Len() < 1<<16 {
		w.b.Write(p)
	}
	return len(p), nil
}
func (w *prefixWriter) String() string { return w.b.String() }

// Cluster is a Redis Cluster: its masters and, when started with
// replicas, their replicas (Replicas[i] replicates Masters[i] at start).
type Cluster struct {
	Masters  []*Server
	Replicas []*Server
}

// Addrs returns the masters' addresses.
func (c *Cluster) Addrs() []string {
	out := make([]string, len(c.Masters))
	for i, m := range c.Masters {
		out[i] = m.Addr
	}
	return out
}

// Nodes returns every server of the cluster, masters first.
func (c *Cluster) Nodes() []*Server {
	return append(append([]*Server(nil), c.Masters...), c.Replicas...)
}

// ClusterOptions describes a cluster for StartClusterWith.
type ClusterOptions struct {
	Masters  int
	Replicas int // per master (redis-cli --cluster-replicas)
	// NodeTimeout is cluster-node-timeout: how long a master may be
	// unreachable before the others agree it failed and its replica takes
	// over. Zero: 2s.
	NodeTimeout time.Duration
	// Extra are further redis-server arguments for every node, such as
	// "--cluster-require-full-coverage", "no".
	Extra []string
}

// StartCluster starts n cluster-enabled masters, joins them with
// `redis-cli --cluster create` and waits until the cluster is ok.
func StartCluster(t testing.TB, n int) *Cluster {
	t.Helper()
	return StartClusterWith(t, ClusterOptions{Masters: n})
}

// StartClusterWith starts a cluster of o.Masters masters with o.Replicas
// replicas each and waits until every node says the cluster is ok and
// every replica is attached to its master.
func StartClusterWith(t testing.TB, o ClusterOptions) *Cluster {
	t.Helper()
	if o.NodeTimeout <= 0 {
		o.NodeTimeout = 2 * time.Second
	}
	var all []*Server
	for i := 0; i < o.Masters*(1+o.Replicas); i++ {
		dir := configDir(t)
		// A replica's first full sync starts at once rather than after
		// Redis's default 5s wait for more replicas to share it.
		args := append([]string{"--cluster-enabled", "yes",
			"--cluster-config-file", filepath.Join(dir, "nodes.conf"),
			"--cluster-node-timeout", strconv.FormatInt(o.NodeTimeout.Milliseconds(), 10),
			"--repl-diskless-sync-delay", "0"}, o.Extra...)
		all = append(all, Start(t, args...))
	}
	addrs := make([]string, len(all))
	for i, s := range all {
		addrs[i] = s.Addr
	}
	args := append([]string{"--cluster", "create"}, addrs...)
	args = append(args, "--cluster-replicas", strconv.Itoa(o.Replicas), "--cluster-yes")
	if out, err := exec.Command(cli(t), args...).CombinedOutput(); err != nil {
		t.Fatalf("redis-cli --cluster create: %v\n%s", err, out)
	}
	// redis-cli makes the first Masters addresses masters; which master
	// each replica follows is its choice: read it back.
	c := &Cluster{Masters: all[:o.Masters]}
	ctx := context.Background()
	deadline := time.Now().Add(30 * time.Second)
	for _, m := range c.Masters {
		id, err := m.Client().ClusterMyID(ctx).Result()
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range all[o.Masters:] {
			for {
				master, _ := r.replicaOf(ctx)
				if master != "" || time.Now().After(deadline) {
					if master == id {
						c.Replicas = append(c.Replicas, r)
					}
					break
				}
				time.Sleep(20 * time.Millisecond) // polling the replica joining
			}
		}
	}
	if len(c.Replicas) != o.Masters*o.Replicas {
		t.Fatalf("found %d replicas attached, want %d", len(c.Replicas), o.Masters*o.Replicas)
	}
	// Only a replica that has synchronised can be promoted.
	c.WaitHealthy(t, time.Until(deadline))
	return c
}

// replicaOf returns the node id of the master s replicates, from CLUSTER
// NODES ("myself,slave <master-id>").
func (s *Server) replicaOf(ctx context.Context) (string, error) {
	nodes, err := s.admin().ClusterNodes(ctx).Result()
	if err != nil {
		return "", err
	}
	for _, line := range strings.Split(nodes, "\n") {
		f := strings.Fields(line)
		if len(f) > 3 && strings.Contains(f[2], "myself") && strings.Contains(f[2], "slave") {
			return f[3], nil
		}
	}
	return "", nil
}

// WaitHealthy waits until every live node reports cluster_state:ok, every
// slot is served by a master that is not flagged as failing, and every
// replica reports its link to its master up.
func (c *Cluster) WaitHealthy(t testing.TB, d time.Duration) {
	t.Helper()
	deadline := time.Now().Add(d)
	ctx := context.Background()
	for _, s := range c.Nodes() {
		if s.Dead() {
			continue
		}
		rc := s.admin()
		for {
			info, _ := rc.ClusterInfo(ctx).Result()
			repl, _ := rc.Info(ctx, "replication").Result()
			if strings.Contains(info, "cluster_state:ok") && strings.Contains(info, "cluster_slots_ok:16384") &&
				(!strings.Contains(repl, "role:slave") || strings.Contains(repl, "master_link_status:up")) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("cluster node %s not healthy within %v:\n%s\n%s", s.Addr, d, info, repl)
			}
			time.Sleep(50 * time.Millisecond) // polling cluster convergence
		}
	}
}

// Dead reports whether the server's process has exited.
func (s *Server) Dead() bool {
	if s.done == nil {
		return true
	}
	select {
	case <-s.done:
		return true
	default:
		return false
	}
}

// SlotOwners returns, for each master address that serves slots, how
// many slots it serves, as node s sees it (CLUSTER SLOTS).
func (s *Server) SlotOwners(ctx context.Context) (map[string]int, error) {
	slots, err := s.admin().ClusterSlots(ctx).Result()
	if err != nil {
		return nil, err
	}
	out := map[string]int{}
	for _, r := range slots {
		if len(r.Nodes) > 0 {
			out[r.Nodes[0].Addr] += int(r.End - r.Start + 1)
		}
	}
	return out, nil
}

// WaitPromoted waits until node `from` sees every slot of the killed
// master served by another node, and returns when it first saw it.
func (c *Cluster) WaitPromoted(t testing.TB, killed, from *Server, d time.Duration) time.Time {
	t.Helper()
	deadline := time.Now().Add(d)
	ctx := context.Background()
	for {
		owners, err := from.SlotOwners(ctx)
		if err == nil && owners[killed.Addr] == 0 {
			total := 0
			for _, n := range owners {
				total += n
			}
			if total == 16384 {
				return time.Now()
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the slots of %s were not taken over within %v (as %s sees it: %v, %v)", killed.Addr, d, from.Addr, owners, err)
		}
		time.Sleep(5 * time.Millisecond) // polling the cluster's own failover
	}
}

// CutReplication makes master i's first replica miss every write the
// master runs from now on (Sentinels.CutReplication). A Cluster replica
// whose link has been down for less than cluster-replica-validity-factor
// (10) node timeouts may still be promoted.
func (c *Cluster) CutReplication(t testing.TB, i int) Replicated {
	t.Helper()
	m, r := c.Masters[i], c.ReplicaOf(t, i)
	return cutReplication(t, m.admin(), r.admin(), r.Addr)
}

// KillMasterCounted kills master i with its writes paused first, and
// returns what it had run by then (Sentinels.KillMasterCounted).
func (c *Cluster) KillMasterCounted(t testing.TB, i int) Replicated {
	t.Helper()
	return killCounted(t, c.Masters[i].admin(), c.Masters[i])
}

// KillMasterReplicated kills master i once its first replica holds every
// write it ran: writes are paused, the replica catches up, then the kill.
// A failover from it loses nothing (CutReplication makes one that does).
func (c *Cluster) KillMasterReplicated(t testing.TB, i int) Replicated {
	t.Helper()
	r := c.ReplicaOf(t, i)
	at := caughtUp(t, c.Masters[i].admin(), r.admin(), r.Addr, 10000)
	c.Masters[i].Kill()
	return at
}

// ReplicaOf returns master i's first replica.
func (c *Cluster) ReplicaOf(t testing.TB, i int) *Server {
	t.Helper()
	per := len(c.Replicas) / len(c.Masters)
	if per == 0 {
		t.Fatalf("the cluster has no replicas")
	}
	return c.Replicas[i*per]
}

// Reshard moves n slots from master src to master dst with `redis-cli
// --cluster reshard`, keys and all, the way an operator does, and returns
// what redis-cli printed.
func (c *Cluster) Reshard(t testing.TB, src, dst *Server, n int) string {
	t.Helper()
	ctx := context.Background()
	srcID, err := src.Client().ClusterMyID(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	dstID, err := dst.Client().ClusterMyID(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(cli(t), "--cluster", "reshard", src.Addr, "--cluster-from", srcID, "--cluster-to", dstID,
		"--cluster-slots", strconv.Itoa(n), "--cluster-yes", "--cluster-pipeline", "10").CombinedOutput()
	if err != nil {
		t.Fatalf("redis-cli --cluster reshard: %v\n%s", err, out)
	}
	return string(out)
}

// configDir is a directory for a cluster node's nodes.conf, on tmpfs
// when the machine has one. A node rewrites and fsyncs that file on
// every change of the cluster's configuration (each slot a reshard
// moves, a failover), in its main thread: on a disk shared with other
// work one fsync took 36ms in a sample of fifty here, and a node that
// does not answer for 100ms is, to the sidecar's breaker, down. A
// production node on its own disk fsyncs in about a millisecond.
func configDir(t testing.TB) string {
	t.Helper()
	if fi, err := os.Stat("/dev/shm"); err == nil && fi.IsDir() {
		dir, err := os.MkdirTemp("/dev/shm", "testredis-")
		if err == nil {
			t.Cleanup(func() { os.RemoveAll(dir) })
			return dir
		}
	}
	return t.TempDir()
}

func cli(t testing.TB) string {
	t.Helper()
	p, err := exec.LookPath("redis-cli")
	if err != nil {
		t.Fatal("redis-cli not found (it comes with redis-server; see `make test`)")
	}
	return p
}

// Client returns a cluster client, closed when the test ends.
func (c *Cluster) Client(t testing.TB) *redis.ClusterClient {
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs()})
	t.Cleanup(func() { cc.Close() })
	return cc
}

// CommandCalls sums INFO commandstats over the masters.
func (c *Cluster) CommandCalls(ctx context.Context, cc *redis.ClusterClient) map[string]int64 {
	return commandCalls(ctx, cc)
}

// Log returns what the server printed (the first 64 KiB), for failure
// reports.
func (s *Server) Log() string {
	if w, ok := s.cmd.Stdout.(*prefixWriter); ok {
		return w.String()
	}
	return ""
}
