package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/extauthz/extauthz/tests/internal/testredis"
)

// redisServer is a redis-server without persistence on a fixed loopback
// port, so that a restart comes back empty at the address the replicas
// were given.
type redisServer struct {
	dir  string
	port int
	proc *exec.Cmd
	done chan struct{}
}

func (r *redisServer) addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(r.port)) }

// start runs redis-server and waits (at most 10 s) until it accepts
// connections.
func (r *redisServer) start() error {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return fmt.Errorf("redis-server is not on PATH: `make redis-server` installs it")
	}
	cmd := exec.Command(bin, "--port", strconv.Itoa(r.port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", r.dir, "--loglevel", "warning")
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	cmd.Stdout, cmd.Stderr = nil, nil
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("starting redis-server: %w", err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	r.proc, r.done = cmd, done
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); {
		select {
		case <-done:
			return fmt.Errorf("redis-server on %s exited at start-up", r.addr())
		default:
		}
		if c, err := net.DialTimeout("tcp", r.addr(), 100*time.Millisecond); err == nil {
			c.Close()
			return nil
		}
		time.Sleep(10 * time.Millisecond) // polling a child process for readiness
	}
	r.stop()
	return fmt.Errorf("redis-server did not listen on %s within 10s", r.addr())
}

// stop ends redis-server: SIGTERM (with no save configured it writes
// nothing), then SIGKILL after 10 s.
func (r *redisServer) stop() {
	if r.proc == nil {
		return
	}
	r.proc.Process.Signal(syscall.SIGTERM)
	select {
	case <-r.done:
	case <-time.After(10 * time.Second):
		r.proc.Process.Kill()
		<-r.done
	}
	r.proc = nil
}

// replica is one extauthz process on fixed loopback ports (so a restart
// serves where the load generator and the sampler look), with the gRPC
// connection the load uses and the count of its calls in flight.
type replica struct {
	index           int
	bin, config     string
	grpcAddr, admin string
	mu              sync.Mutex
	proc            *testredis.Proc
	conn            *grpc.ClientConn
	serving         atomic.Bool  // the load may send to it
	inFlight        atomic.Int64 // calls sent and not yet answered
	hups            atomic.Int64 // SIGHUPs sent to the running process
	starts          int
}

// writeConfig writes the replica's configuration: the shipped defaults
// except what a hybrid deployment must say (its Redis, hybrid mode) and
// the soak's two policies, one per traffic class, each keyed by a header
// the load sets. Ports are fixed so that a restarted replica serves at
// the same addresses.
func writeConfig(path, grpcAddr, admin, redisAddr string, hot, churn policy) error {
	cfg := fmt.Sprintf(`listen: {grpc: %s, admin: %s}
redis: {addrs: [%s]}
default_mode: hybrid
policies:
  - {name: hot, match: {path_prefix: /hot/}, key: ["header:x-soak-key"], limit: %d, window: %s}
  - {name: churn, match: {path_prefix: /churn/}, key: ["header:x-soak-key"], limit: %d, window: %s}
`, grpcAddr, admin, redisAddr, hot.limit, hot.window, churn.limit, churn.window)
	return os.WriteFile(path, []byte(cfg), 0o600)
}

type policy struct {
	limit  int
	window time.Duration
}

func newReplica(bin, dir string, i int, redisAddr string, hot, churn policy) (*replica, error) {
	gp, err := testredis.FreePort()
	if err != nil {
		return nil, err
	}
	ap, err := testredis.FreePort()
	if err != nil {
		return nil, err
	}
	r := &replica{index: i, bin: bin, config: filepath.Join(dir, fmt.Sprintf("replica-%d.yaml", i)),
		grpcAddr: net.JoinHostPort("127.0.0.1", strconv.Itoa(gp)), admin: net.JoinHostPort("127.0.0.1", strconv.Itoa(ap))}
	if err := writeConfig(r.config, r.grpcAddr, r.admin, redisAddr, hot, churn); err != nil {
		return nil, err
	}
	return r, nil
}

// start runs the binary, waits until it serves, dials it and opens it to
// the load.
func (r *replica) start(ctx context.Context) error {
	p, err := testredis.Serve(fmt.Sprintf("replica %d", r.index), []string{fmt.Sprintf("EXTAUTHZ_REPLICA_ID=soak-%d", r.index)},
		r.bin, "serve", "-config", r.config, "-log-format", "json")
	if err != nil {
		return err
	}
	conn, err := grpc.NewClient("passthrough:///"+r.grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		p.Stop()
		return err
	}
	// A fresh connection for each process: the old one may sit in its
	// reconnect backoff for a second after the restart.
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	conn.Connect()
	for s := conn.GetState(); s != connectivity.Ready; s = conn.GetState() {
		if !conn.WaitForStateChange(cctx, s) {
			conn.Close()
			p.Stop()
			return fmt.Errorf("replica %d: gRPC connection not ready within 10s (%v)", r.index, s)
		}
	}
	r.mu.Lock()
	r.proc, r.conn = p, conn
	r.starts++
	r.mu.Unlock()
	r.hups.Store(0)
	r.serving.Store(true)
	return nil
}

// stop closes the replica to the load, waits (at most 5 s) for its calls
// in flight, as a load balancer drains an endpoint before the pod is
// sent SIGTERM, then stops the process.
func (r *replica) stop() {
	r.serving.Store(false)
	for deadline := time.Now().Add(5 * time.Second); r.inFlight.Load() > 0 && time.Now().Before(deadline); {
		time.Sleep(5 * time.Millisecond) // polling the calls in flight to finish
	}
	r.mu.Lock()
	p, conn := r.proc, r.conn
	r.proc = nil
	r.mu.Unlock()
	if p != nil {
		p.Stop()
	}
	if conn != nil {
		conn.Close()
	}
}

// exited reports whether the running process has exited by itself.
func (r *replica) exited() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	// Signal 0 delivers nothing; it fails once the process has been
	// waited for.
	return r.proc != nil && r.proc.Cmd.Process.Signal(syscall.Signal(0)) != nil
}

func (r *replica) hup() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.proc == nil {
		return nil
	}
	if err := r.proc.Cmd.Process.Signal(syscall.SIGHUP); err != nil {
		return err
	}
	r.hups.Add(1)
	return nil
}

func (r *replica) connection() *grpc.ClientConn {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.conn
}
