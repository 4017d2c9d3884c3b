// Package testredis starts real redis-server processes on free loopback
// ports: for tests, standalone servers that can be killed, frozen and
// restarted, and Redis Clusters, each stopped when its test ends; for the
// benchmark and the demo, detached servers and the extauthz processes
// beside them (detached.go). `make test` installs redis-server where it is
// missing.
package testredis

import (
	"context"
	"fmt"
	"net"
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
	port int
	dir  string
	args []string
	tls  *TLSFiles
	cmd  *exec.Cmd
	done chan struct{} // closed when the process has exited
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

// launch starts s on a free port, trying another when one is taken.
func launch(t testing.TB, s *Server) *Server {
	t.Helper()
	var err error
	for attempt := 0; attempt < 5; attempt++ {
		s.port = freePort(t)
		if err = s.start(); err == nil {
			t.Cleanup(s.Kill)
			return s
		}
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

// Revive starts an empty server on the port of a killed one.
func (s *Server) Revive() {
	s.t.Helper()
	var err error
	for attempt := 0; attempt < 50; attempt++ {
		if err = s.start(); err == nil {
			return
		}
		time.Sleep(100 * time.Millisecond) // the port may linger briefly
	}
	s.t.Fatalf("restarting redis-server: %v", err)
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

func freePort(t testing.TB) int {
	t.Helper()
	p, err := FreePort()
	if err != nil {
		t.Fatal(err)
	}
	return p
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

// Cluster is a Redis Cluster of masters only.
type Cluster struct {
	Masters []*Server
}

// Addrs returns the masters' addresses.
func (c *Cluster) Addrs() []string {
	out := make([]string, len(c.Masters))
	for i, m := range c.Masters {
		out[i] = m.Addr
	}
	return out
}

// StartCluster starts n cluster-enabled servers, joins them with
// `redis-cli --cluster create` and waits until the cluster is ok.
func StartCluster(t testing.TB, n int) *Cluster {
	t.Helper()
	c := &Cluster{}
	for i := 0; i < n; i++ {
		dir := t.TempDir()
		c.Masters = append(c.Masters, Start(t, "--cluster-enabled", "yes",
			"--cluster-config-file", filepath.Join(dir, "nodes.conf"), "--cluster-node-timeout", "2000"))
	}
	cli, err := exec.LookPath("redis-cli")
	if err != nil {
		t.Fatal("redis-cli not found (it comes with redis-server; see `make test`)")
	}
	args := append([]string{"--cluster", "create"}, c.Addrs()...)
	args = append(args, "--cluster-replicas", "0", "--cluster-yes")
	if out, err := exec.Command(cli, args...).CombinedOutput(); err != nil {
		t.Fatalf("redis-cli --cluster create: %v\n%s", err, out)
	}
	deadline := time.Now().Add(20 * time.Second)
	for _, m := range c.Masters {
		rc := m.Client()
		for {
			info, _ := rc.ClusterInfo(context.Background()).Result()
			if strings.Contains(info, "cluster_state:ok") {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("cluster did not become ok:\n%s", info)
			}
			time.Sleep(50 * time.Millisecond) // polling cluster convergence
		}
	}
	return c
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
