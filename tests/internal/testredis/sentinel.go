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
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Sentinels is a replication group watched by Redis Sentinel: a master,
// its replicas and the sentinels that promote a replica when the master
// fails, each a process on a free loopback port, stopped when the test
// ends.
type Sentinels struct {
	Name     string    // the name the sentinels monitor the master by
	Master   *Server   // the master at start
	Replicas []*Server // its replicas at start
	Watchers []*Server // the redis-sentinel processes

	t       testing.TB
	o       SentinelOptions
	clients []*redis.Client // of Watchers, for polling loops
}

// SentinelOptions describe a group for StartSentinels. The timings are
// Sentinel's own settings (sentinel.conf), not the sidecar's.
type SentinelOptions struct {
	Replicas  int // replicas of the master; zero: 1
	Sentinels int // zero: 3 (a quorum of 2)
	// DownAfter is down-after-milliseconds: how long the master must
	// fail to answer before a sentinel believes it down. Zero: 1s
	// (Sentinel's default is 30s).
	DownAfter time.Duration
	// FailoverTimeout is failover-timeout: how long a failed failover
	// blocks the next attempt, among other things. Zero: 5s (Sentinel's
	// default is 3 minutes).
	FailoverTimeout time.Duration
	// Password is the servers' requirepass (the sentinels get it as
	// auth-pass); SentinelPassword the sentinels' own. "": none.
	Password         string
	SentinelPassword string
}

// SentinelBinary returns the command that starts a sentinel:
// redis-sentinel, or redis-server --sentinel where only that is
// installed, or fails the test with how to get it.
func SentinelBinary(t testing.TB) []string {
	t.Helper()
	if p, err := exec.LookPath("redis-sentinel"); err == nil {
		return []string{p}
	}
	if p, err := exec.LookPath("redis-server"); err == nil {
		// redis-server --help exits 1, its usage on stderr.
		if out, _ := exec.Command(p, "--help").CombinedOutput(); strings.Contains(string(out), "--sentinel") {
			return []string{p, "--sentinel"}
		}
	}
	t.Fatalf("redis-sentinel not found: run `make test` (it installs it) or `apt-get install -y redis-sentinel`")
	return nil
}

// StartSentinels starts a master, o.Replicas replicas of it and
// o.Sentinels sentinels monitoring it, and waits until every replica has
// synchronised and every sentinel knows the replicas and the other
// sentinels: until a failover can happen.
func StartSentinels(t testing.TB, o SentinelOptions) *Sentinels {
	t.Helper()
	if o.Replicas <= 0 {
		o.Replicas = 1
	}
	if o.Sentinels <= 0 {
		o.Sentinels = 3
	}
	if o.DownAfter <= 0 {
		o.DownAfter = time.Second
	}
	if o.FailoverTimeout <= 0 {
		o.FailoverTimeout = 5 * time.Second
	}
	g := &Sentinels{Name: "extauthz", t: t, o: o}
	// A replica's first full sync starts at once rather than after
	// Redis's default 5s wait for more replicas to share it.
	data := []string{"--repl-diskless-sync-delay", "0"}
	if o.Password != "" {
		// masterauth too: a replica, and a master demoted to one,
		// authenticate to whichever master they follow.
		data = append(data, "--requirepass", o.Password, "--masterauth", o.Password)
	}
	g.Master = Start(t, data...)
	_, mport, _ := net.SplitHostPort(g.Master.Addr)
	for range o.Replicas {
		g.Replicas = append(g.Replicas, Start(t, append([]string{"--replicaof", "127.0.0.1", mport}, data...)...))
	}
	for range o.Sentinels {
		w := g.startSentinel(mport)
		g.Watchers = append(g.Watchers, w)
		c := redis.NewClient(&redis.Options{Addr: w.Addr, Password: o.SentinelPassword})
		t.Cleanup(func() { c.Close() })
		g.clients = append(g.clients, c)
	}
	g.waitReady(30 * time.Second)
	return g
}

// startSentinel runs one sentinel monitoring the master on mport, with
// a quorum of a majority of the sentinels.
func (g *Sentinels) startSentinel(mport string) *Server {
	t := g.t
	t.Helper()
	dir := t.TempDir()
	conf := filepath.Join(dir, "sentinel.conf") // Sentinel rewrites it as it learns the group
	lines := []string{
		"sentinel resolve-hostnames no",
		fmt.Sprintf("sentinel monitor %s 127.0.0.1 %s %d", g.Name, mport, g.o.Sentinels/2+1),
		fmt.Sprintf("sentinel down-after-milliseconds %s %d", g.Name, g.o.DownAfter.Milliseconds()),
		fmt.Sprintf("sentinel failover-timeout %s %d", g.Name, g.o.FailoverTimeout.Milliseconds()),
		fmt.Sprintf("sentinel parallel-syncs %s 1", g.Name),
	}
	if g.o.Password != "" {
		lines = append(lines, fmt.Sprintf("sentinel auth-pass %s %s", g.Name, g.o.Password))
	}
	if g.o.SentinelPassword != "" {
		// requirepass for clients, and the same for the other sentinels,
		// which connect to this one to vote and to share what they saw.
		lines = append(lines, "requirepass "+g.o.SentinelPassword, "sentinel sentinel-pass "+g.o.SentinelPassword)
	}
	if err := os.WriteFile(conf, []byte(strings.Join(lines, "\n")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return launch(t, &Server{t: t, dir: dir, sentinelConf: conf})
}

// sentinelArgs is the command line of a sentinel on s.port: the
// configuration file first, as redis-server wants it, then
// redis-server's --sentinel where that is how a sentinel starts.
func (s *Server) sentinelArgs() []string {
	bin := SentinelBinary(s.t)
	args := append([]string{bin[0], s.sentinelConf}, bin[1:]...)
	return append(args, "--port", strconv.Itoa(s.port),
		"--bind", "127.0.0.1", "--dir", s.dir, "--loglevel", "warning", "--daemonize", "no")
}

// Addrs returns the sentinels' addresses.
func (g *Sentinels) Addrs() []string {
	out := make([]string, len(g.Watchers))
	for i, w := range g.Watchers {
		out[i] = w.Addr
	}
	return out
}

// Servers returns the master and the replicas as started.
func (g *Sentinels) Servers() []*Server {
	return append([]*Server{g.Master}, g.Replicas...)
}

// Client returns a client of the master at addr (authenticated as the
// group's servers are), closed when the test ends.
func (g *Sentinels) Client(addr string) *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: addr, Password: g.o.Password})
	g.t.Cleanup(func() { c.Close() })
	return c
}

// Server returns the server of the group at addr, nil if none is.
func (g *Sentinels) Server(addr string) *Server {
	for _, s := range g.Servers() {
		if s.Addr == addr {
			return s
		}
	}
	return nil
}

// MasterAddr returns the master's address as the first sentinel that
// answers names it.
func (g *Sentinels) MasterAddr(ctx context.Context) (string, error) {
	var err error
	for i, w := range g.Watchers {
		if w.Dead() {
			continue
		}
		var hp []string
		hp, err = g.clients[i].Do(ctx, "SENTINEL", "get-master-addr-by-name", g.Name).StringSlice()
		if err == nil && len(hp) == 2 {
			return net.JoinHostPort(hp[0], hp[1]), nil
		}
	}
	return "", fmt.Errorf("no sentinel named the master: %v", err)
}

// waitReady waits until every replica's link to the master is up and
// every sentinel sees the master, its replicas and the other sentinels
// (INFO sentinel: "master0:name=…,status=ok,…,slaves=N,sentinels=M"):
// a sentinel that has not yet heard the others cannot win the vote a
// failover needs.
func (g *Sentinels) waitReady(d time.Duration) {
	t := g.t
	t.Helper()
	deadline := time.Now().Add(d)
	ctx := context.Background()
	for _, r := range g.Replicas {
		c := g.Client(r.Addr)
		for {
			repl, _ := c.Info(ctx, "replication").Result()
			if strings.Contains(repl, "master_link_status:up") {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("replica %s not synchronised within %v:\n%s", r.Addr, d, repl)
			}
			time.Sleep(20 * time.Millisecond) // polling the replica's first sync
		}
	}
	want := fmt.Sprintf("status=ok,address=%s,slaves=%d,sentinels=%d", g.Master.Addr, len(g.Replicas), len(g.Watchers))
	for i, w := range g.Watchers {
		c := g.clients[i]
		for {
			info, _ := c.Info(ctx, "sentinel").Result()
			if strings.Contains(info, want) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("sentinel %s does not see the group within %v (want %q):\n%s\n%s", w.Addr, d, want, info, w.Log())
			}
			time.Sleep(20 * time.Millisecond) // polling the sentinels' discovery (hello messages every 2s)
		}
	}
}

// WaitPromoted waits until every live sentinel names a master other
// than killed, and returns it, the instant one sentinel was first seen
// naming it (the leader, which switches once the replica it chose has
// taken the master's role) and the instant all did (the others learn it
// from the leader's hello messages).
func (g *Sentinels) WaitPromoted(killed *Server, d time.Duration) (promoted *Server, first, all time.Time) {
	t := g.t
	t.Helper()
	deadline := time.Now().Add(d)
	ctx := context.Background()
	for {
		named, live := map[string]int{}, 0
		for i, w := range g.Watchers {
			if w.Dead() {
				continue
			}
			live++
			hp, err := g.clients[i].Do(ctx, "SENTINEL", "get-master-addr-by-name", g.Name).StringSlice()
			if err == nil && len(hp) == 2 {
				named[net.JoinHostPort(hp[0], hp[1])]++
			}
		}
		now := time.Now()
		for addr, n := range named {
			if addr == killed.Addr {
				continue
			}
			if first.IsZero() {
				first = now
				if promoted = g.Server(addr); promoted == nil {
					t.Fatalf("the sentinels name %s, no server of the group", addr)
				}
			}
			if addr == promoted.Addr && n == live {
				return promoted, first, now
			}
		}
		if now.After(deadline) {
			t.Fatalf("the sentinels did not all name a new master within %v after %s died: %v", d, killed.Addr, named)
		}
		time.Sleep(5 * time.Millisecond) // polling Sentinel's own failover
	}
}

// Replicated is what a master had run and written at one instant: its
// replication offset and its script calls (EVAL and EVALSHA, from INFO
// commandstats).
type Replicated struct {
	Offset  int64
	Scripts int64
}

// CutReplication makes replica r miss every write its master runs from
// now on, and returns what the master had run when r stopped following
// it: r holds every byte of the stream up to then and none after. Writes
// are paused on the master (CLIENT PAUSE WRITE: scripts wait, the
// replication stream stands still) until r has applied the whole stream;
// then r's link is dropped (CLIENT KILL TYPE master on r) and its
// reconnections refused: r's masterauth is set to a password, and the
// master, which has none, answers its AUTH with an error, so r retries
// every second and never syncs. Writes resume. r stays up and answers
// the sentinels, so a failover may promote it, as it promotes a replica
// partitioned from its master (Sentinel skips a replica whose link has
// been down longer than ten times down-after-milliseconds, 10s here).
func (g *Sentinels) CutReplication(r *Server) Replicated {
	g.t.Helper()
	return cutReplication(g.t, g.Client(g.Master.Addr), g.Client(r.Addr), r.Addr)
}

// cutReplication is CutReplication for master m and replica rc (at addr).
func cutReplication(t testing.TB, m, rc *redis.Client, addr string) Replicated {
	t.Helper()
	ctx := context.Background()
	at := caughtUp(t, m, rc, addr, 5000)
	defer m.Do(ctx, "CLIENT", "UNPAUSE")
	deadline := time.Now().Add(3 * time.Second)
	if err := rc.ConfigSet(ctx, "masterauth", "cut-by-test").Err(); err != nil {
		t.Fatalf("CONFIG SET masterauth on the replica: %v", err)
	}
	if err := rc.Do(ctx, "CLIENT", "KILL", "TYPE", "master").Err(); err != nil {
		t.Fatalf("CLIENT KILL TYPE master on the replica: %v", err)
	}
	for !strings.Contains(rc.Info(ctx, "replication").Val(), "master_link_status:down") {
		if time.Now().After(deadline) {
			t.Fatalf("replica %s still linked to its master after CLIENT KILL", addr)
		}
		time.Sleep(time.Millisecond) // polling the replica's link
	}
	return at
}

// caughtUp pauses master m's writes for pauseMs (CLIENT PAUSE WRITE:
// scripts wait, the replication stream stands still), waits until replica
// rc (at addr) has applied the whole stream, and returns what m had run.
func caughtUp(t testing.TB, m, rc *redis.Client, addr string, pauseMs int) Replicated {
	t.Helper()
	ctx := context.Background()
	if err := m.Do(ctx, "CLIENT", "PAUSE", strconv.Itoa(pauseMs), "WRITE").Err(); err != nil {
		t.Fatalf("CLIENT PAUSE on the master: %v", err)
	}
	at := Replicated{Offset: infoInt(t, m, "replication", "master_repl_offset"), Scripts: scriptCalls(ctx, m)}
	deadline := time.Now().Add(3 * time.Second)
	for infoInt(t, rc, "replication", "slave_repl_offset") < at.Offset {
		if time.Now().After(deadline) {
			t.Fatalf("replica %s did not reach the master's offset %d within 3s", addr, at.Offset)
		}
		time.Sleep(time.Millisecond) // polling the replica's offset while writes are paused
	}
	return at
}

// KillMasterCounted kills the master (SIGKILL) with its writes paused
// first, and returns what it had run by then: no script runs between the
// count and the kill.
func (g *Sentinels) KillMasterCounted() Replicated {
	g.t.Helper()
	return killCounted(g.t, g.Client(g.Master.Addr), g.Master)
}

// killCounted kills server s, whose client is m, with its writes paused
// first, and returns what it had run by then.
func killCounted(t testing.TB, m *redis.Client, s *Server) Replicated {
	t.Helper()
	ctx := context.Background()
	if err := m.Do(ctx, "CLIENT", "PAUSE", "10000", "WRITE").Err(); err != nil {
		t.Fatalf("CLIENT PAUSE on the master: %v", err)
	}
	at := Replicated{Offset: infoInt(t, m, "replication", "master_repl_offset"), Scripts: scriptCalls(ctx, m)}
	s.Kill()
	return at
}

// scriptCalls is how many scripts c's server has run.
func scriptCalls(ctx context.Context, c *redis.Client) int64 {
	calls := commandCalls(ctx, c)
	return calls["eval"] + calls["evalsha"]
}

// infoInt reads an integer field of an INFO section.
func infoInt(t testing.TB, c *redis.Client, section, field string) int64 {
	t.Helper()
	info, err := c.Info(context.Background(), section).Result()
	if err != nil {
		t.Fatalf("INFO %s: %v", section, err)
	}
	for _, line := range strings.Split(info, "\r\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				t.Fatalf("INFO %s %s: %q", section, field, v)
			}
			return n
		}
	}
	t.Fatalf("INFO %s has no %s", section, field)
	return 0
}
