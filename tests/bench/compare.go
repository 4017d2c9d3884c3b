package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/extauthz/extauthz/tests/internal/testredis"
)

// `make bench-compare`: envoyproxy/ratelimit, the service extauthz's rate
// limit door is a drop-in for, measured in the same run as extauthz in
// redis mode: each against a redis-server of its own on loopback, the
// same descriptor file (one fixed-window descriptor far from its limit),
// driven by ghz and by the in-process generator alike. It is built at
// the version pinned in tools/bench/go.mod through the Go module proxy,
// never vendored; where it cannot be built the comparison says why and
// counts as not met.

// ratelimitConfig is rlsDomain's fixed-window descriptor in
// envoyproxy/ratelimit's own file format (which has no algorithm field:
// every limit is a fixed window there).
const ratelimitConfig = `
domain: bench
descriptors:
  - key: generic_key
    value: fixed_window
    rate_limit: {unit: minute, requests_per_unit: 1000000000}
`

func runCompare(o options) error {
	b, cleanup, err := setup(o)
	if err != nil {
		return err
	}
	defer cleanup()
	fmt.Printf("extauthz against envoyproxy/ratelimit: %s, %d requests per target per round and load generator, %d workers, %d interleaved rounds (median shown)\n\n",
		time.Now().Format("2006-01-02"), o.n, o.c, o.rounds)
	domains, err := writeDomains(b.dir)
	if err != nil {
		return err
	}
	cfg := fmt.Sprintf("listen: {grpc: 127.0.0.1:0, admin: 127.0.0.1:0}\nredis: {addrs: [%s]}\ndefault_mode: redis\nrls: {domains: [%s]}\n", b.rds.Addr, domains)
	ours, err := startSidecar(b.dir, "compare-redis", b.bin, cfg)
	if err != nil {
		return err
	}
	defer ours.Stop()
	targets := []*target{b.grpcTarget("extauthz redis mode, rls fixed_window", ours, true, nil, rlsRequest("fixed_window"))}

	anchor, why := startRatelimit(b)
	if anchor != nil {
		defer anchor.stop()
		targets = append(targets, b.grpcTarget("envoyproxy/ratelimit", anchor.proc, true, nil, rlsRequest("fixed_window")))
		targets[1].meter = cpuMeter{anchor.proc, anchor.redis}
	}
	if err := measureRounds(context.Background(), targets, b.rdb, o.n, o.rounds); err != nil {
		return err
	}
	printRows(targets, func(*target) *target { return targets[0] })
	fmt.Println(cpuNote)
	fmt.Println("(\"of ceiling\" and \"vs ceiling\" are against extauthz's row here)")

	var gate targetCheck
	switch {
	case anchor == nil:
		gate = targetCheck{"redis mode's CPU per decision below envoyproxy/ratelimit's: not measured (" + why + ")", false}
	case b.ghz == nil:
		gate = targetCheck{"redis mode's CPU per decision below envoyproxy/ratelimit's: not measured (" + b.noGhz + ")", false}
	default:
		m, a := targets[0].summary(byGhz), targets[1].summary(byGhz)
		gate = targetCheck{fmt.Sprintf("redis mode's CPU per decision (sidecar + Redis) below envoyproxy/ratelimit's (process + Redis), ghz: %s vs %s (%.2f×)",
			cpuText(m.cpu), cpuText(a.cpu), float64(m.cpu)/float64(a.cpu)), m.cpu > 0 && m.cpu < a.cpu}
		fmt.Printf("\nprinted, not gated: throughput, extauthz redis mode / envoyproxy/ratelimit, ghz: %.2f×\n", m.res.Throughput/a.res.Throughput)
	}
	var bad float64
	for _, t := range targets {
		for g := range t.samples {
			s := t.summary(g)
			bad += s.degraded + float64(s.errors)
		}
	}
	return report([]targetCheck{gate, {"no decision degraded, no error", bad == 0}})
}

// ratelimit is a running envoyproxy/ratelimit and its redis-server.
type ratelimit struct {
	proc  *testredis.Proc // Name and Cmd only: whose CPU to read
	redis *testredis.Proc
	done  chan struct{}
}

// startRatelimit builds and starts envoyproxy/ratelimit, or says why it
// could not.
func startRatelimit(b *bench) (*ratelimit, string) {
	bin := filepath.Join(b.dir, "ratelimit")
	build := exec.Command("go", "build", "-o", bin, "github.com/envoyproxy/ratelimit/src/service_cmd")
	build.Dir = "tools/bench"
	build.Env = append(os.Environ(), "GOFLAGS=-buildvcs=false")
	if out, err := build.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "bench: envoyproxy/ratelimit skipped: building it in tools/bench: %v\n%s", err, out)
		return nil, "envoyproxy/ratelimit could not be built: " + err.Error()
	}
	rdir := filepath.Join(b.dir, "ratelimit-redis")
	appDir := filepath.Join(b.dir, "ratelimit-runtime", "ratelimit", "config")
	if err := os.MkdirAll(rdir, 0o700); err != nil {
		return nil, err.Error()
	}
	if err := os.MkdirAll(appDir, 0o700); err != nil {
		return nil, err.Error()
	}
	if err := os.WriteFile(filepath.Join(appDir, "bench.yaml"), []byte(ratelimitConfig), 0o600); err != nil {
		return nil, err.Error()
	}
	rds, err := testredis.StartDetached(rdir)
	if err != nil {
		return nil, "its redis-server: " + err.Error()
	}
	ports := make([]int, 3)
	for i := range ports {
		if ports[i], err = testredis.FreePort(); err != nil {
			rds.Stop()
			return nil, err.Error()
		}
	}
	cmd := exec.Command(bin)
	// Its defaults, but for where to listen and find Redis and its
	// files: statistics counted in process and flushed to stdout every
	// 10s (USE_STATSD=false), no pipelining window (REDIS_PIPELINE_WINDOW
	// 0), a pool of 10 connections.
	cmd.Env = append(os.Environ(),
		"USE_STATSD=false", "LOG_LEVEL=warn",
		"REDIS_SOCKET_TYPE=tcp", "REDIS_URL="+rds.Addr,
		"RUNTIME_ROOT="+filepath.Join(b.dir, "ratelimit-runtime"), "RUNTIME_SUBDIRECTORY=ratelimit", "RUNTIME_WATCH_ROOT=false", "RUNTIME_IGNOREDOTFILES=true",
		"HOST=127.0.0.1", "PORT="+strconv.Itoa(ports[0]),
		"GRPC_HOST=127.0.0.1", "GRPC_PORT="+strconv.Itoa(ports[1]),
		"DEBUG_HOST=127.0.0.1", "DEBUG_PORT="+strconv.Itoa(ports[2]))
	logs := &testredis.LogBuffer{}
	cmd.Stdout, cmd.Stderr = logs, logs
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		rds.Stop()
		return nil, "starting envoyproxy/ratelimit: " + err.Error()
	}
	r := &ratelimit{proc: &testredis.Proc{Name: "envoyproxy/ratelimit", Cmd: cmd, Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[1]))}, redis: rds, done: make(chan struct{})}
	go func() { cmd.Wait(); close(r.done) }()
	if err := r.awaitServing(); err != nil {
		r.stop()
		return nil, fmt.Sprintf("envoyproxy/ratelimit did not serve: %v: %s", err, logs.String())
	}
	return r, ""
}

// awaitServing waits up to 30s for the service's gRPC health check to
// answer SERVING.
func (r *ratelimit) awaitServing() error {
	conn, err := grpc.NewClient("passthrough:///"+r.proc.Addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	hc := healthpb.NewHealthClient(conn)
	for deadline := time.Now().Add(30 * time.Second); ; {
		select {
		case <-r.done:
			return fmt.Errorf("exited")
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		resp, err := hc.Check(ctx, &healthpb.HealthCheckRequest{})
		cancel()
		if err == nil && resp.GetStatus() == healthpb.HealthCheckResponse_SERVING {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("no SERVING health check within 30s (last: %v)", err)
		}
		time.Sleep(100 * time.Millisecond) // polling a child process for readiness
	}
}

func (r *ratelimit) stop() {
	r.proc.Cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-r.done:
	case <-time.After(10 * time.Second):
		r.proc.Cmd.Process.Kill()
		<-r.done
	}
	r.redis.Stop()
}
