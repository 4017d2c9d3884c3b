package tests

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/extauthz/extauthz/tests/internal/testredis"
)

// The anchor under the same network faults: envoyproxy/ratelimit, built
// at the version tools/bench/go.mod pins (as `make bench-compare` builds
// it; never committed), three replicas behind a toxiproxy proxy to a
// redis-server of their own, beside three extauthz replicas in redis mode
// serving the same descriptor file through the rate limit service door,
// behind a proxy of theirs with the same toxics at the same instants.
// envoyproxy/ratelimit has fixed windows only, so both sides run one: 3
// per second per user. Its rows are reported, not held to our contract;
// ours are held to no gRPC error and at most one exact window per key.

const anchorDomain = `
domain: faults
descriptors:
  - key: user
    rate_limit: {unit: second, requests_per_unit: 3}
`

const anchorLimit = 3

// windowExact is one exact fixed window of a second per key: the limit
// in every second the run touched.
func windowExact(keys int, start, end time.Time) int {
	windows := int(end.Truncate(time.Second).Sub(start.Truncate(time.Second))/time.Second) + 1
	return keys * anchorLimit * windows
}

// anchorRequest is what Envoy's ratelimit filter sends for a route whose
// rate_limits entry is [request_headers x-user → user].
func anchorRequest(ctx context.Context, key int) *rlsv3.RateLimitRequest {
	return &rlsv3.RateLimitRequest{Domain: "faults", Descriptors: []*ratelimitv3.RateLimitDescriptor{{
		Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "user", Value: fmt.Sprintf("u%d-%d", sourceNet(ctx), key)}},
	}}}
}

func anchorStatus(resp *rlsv3.RateLimitResponse) int {
	if resp.GetOverallCode() == rlsv3.RateLimitResponse_OK {
		return 200
	}
	return 429
}

// decidedWindow is the start of the one-second window a reply was
// decided in, from the time it left until the window resets, as it
// arrives (within the call's latency of the decision); zero when the
// reply does not say.
func decidedWindow(resp *rlsv3.RateLimitResponse) time.Time {
	for _, st := range resp.GetStatuses() {
		if r := st.GetDurationUntilReset(); r != nil {
			return time.Now().Add(r.AsDuration()).Round(time.Second).Add(-time.Second)
		}
	}
	return time.Time{}
}

// rlsMode makes calls to the rate limit service at addrs, round robin.
func rlsMode(t *testing.T, name, proxy string, addrs []string) *modeUnderFault {
	t.Helper()
	var clients []rlsv3.RateLimitServiceClient
	for _, a := range addrs {
		conn, err := grpc.NewClient("passthrough:///"+a, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		clients = append(clients, rlsv3.NewRateLimitServiceClient(conn))
	}
	return &modeUnderFault{mode: name, proxy: proxy, exact: windowExact,
		call: func(ctx context.Context, i, key int) (int, time.Time, error) {
			resp, err := clients[i%len(clients)].ShouldRateLimit(ctx, anchorRequest(ctx, key))
			return anchorStatus(resp), decidedWindow(resp), err
		}}
}

// startAnchor builds envoyproxy/ratelimit and runs three replicas of it,
// at its defaults but for where to listen and find Redis and its files,
// talking to Redis at redisAddr; it returns their gRPC addresses.
func startAnchor(t *testing.T, redisAddr string) []string {
	t.Helper()
	dir := t.TempDir()
	bin := buildAnchor(t, dir)
	appDir := filepath.Join(dir, "runtime", "ratelimit", "config")
	must(t, os.MkdirAll(appDir, 0o700))
	must(t, os.WriteFile(filepath.Join(appDir, "faults.yaml"), []byte(anchorDomain), 0o600))
	var addrs []string
	for range 3 {
		// Statistics counted in process (USE_STATSD=false), no
		// pipelining window, its pool of 10 connections: its defaults.
		addrs = append(addrs, runAnchor(t, bin, "REDIS_SOCKET_TYPE=tcp", "REDIS_URL="+redisAddr,
			"RUNTIME_ROOT="+filepath.Join(dir, "runtime"), "RUNTIME_SUBDIRECTORY=ratelimit", "RUNTIME_WATCH_ROOT=false", "RUNTIME_IGNOREDOTFILES=true"))
	}
	return addrs
}

// runAnchor starts the anchor's binary bin on loopback ports of its own
// (HTTP, gRPC, debug), statistics in process and warnings only, with env
// on top; killed at the test's end. It returns the gRPC address once the
// health check answers SERVING.
func runAnchor(t *testing.T, bin string, env ...string) string {
	t.Helper()
	ports := make([]string, 3)
	for i := range ports {
		p, err := testredis.FreePort()
		must(t, err)
		ports[i] = strconv.Itoa(p)
	}
	cmd := exec.Command(bin)
	cmd.Env = append(os.Environ(), "USE_STATSD=false", "LOG_LEVEL=warn",
		"HOST=127.0.0.1", "PORT="+ports[0], "GRPC_HOST=127.0.0.1", "GRPC_PORT="+ports[1], "DEBUG_HOST=127.0.0.1", "DEBUG_PORT="+ports[2])
	cmd.Env = append(cmd.Env, env...)
	logs := &testredis.LogBuffer{}
	cmd.Stdout, cmd.Stderr = logs, logs
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	must(t, cmd.Start())
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-done
	})
	addr := net.JoinHostPort("127.0.0.1", ports[1])
	awaitHealthy(t, addr, done, logs)
	return addr
}

// buildAnchor builds envoyproxy/ratelimit at the version tools/bench/go.mod
// pins, through the Go module proxy (as `make bench-compare` does; never
// committed), into dir, and returns the binary's path.
func buildAnchor(t *testing.T, dir string) string {
	t.Helper()
	bin := filepath.Join(dir, "ratelimit")
	build := exec.Command("go", "build", "-o", bin, "github.com/envoyproxy/ratelimit/src/service_cmd")
	build.Dir = "../tools/bench"
	build.Env = append(os.Environ(), "GOFLAGS=-buildvcs=false")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("envoyproxy/ratelimit could not be built in tools/bench (the anchor is not run): %v\n%s", err, out)
	}
	return bin
}

// awaitHealthy waits up to 30s for the gRPC health check at addr to
// answer SERVING.
func awaitHealthy(t *testing.T, addr string, done chan struct{}, logs *testredis.LogBuffer) {
	t.Helper()
	conn, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	hc := healthpb.NewHealthClient(conn)
	for deadline := time.Now().Add(30 * time.Second); ; {
		select {
		case <-done:
			t.Fatalf("envoyproxy/ratelimit exited:\n%s", logs)
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		resp, err := hc.Check(ctx, &healthpb.HealthCheckRequest{})
		cancel()
		if err == nil && resp.GetStatus() == healthpb.HealthCheckResponse_SERVING {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("envoyproxy/ratelimit did not serve within 30s: %v\n%s", err, logs)
		}
		time.Sleep(50 * time.Millisecond) // the service starting
	}
}

// TestAnchorUnderNetworkFaults runs every fault of the matrix at
// envoyproxy/ratelimit and at extauthz's redis mode through the rate limit
// service door, side by side (make test-faults only).
func TestAnchorUnderNetworkFaults(t *testing.T) {
	serial(t, "it measures decisions through injected network faults beside envoyproxy/ratelimit's under the same: other tests' load would add faults of its own")
	if !*faultsFull {
		t.Skip("the anchor runs with the full matrix: make test-faults")
	}
	x := startToxiproxy(t)
	anchorRedis := testredis.Start(t)
	anchor := rlsMode(t, "envoyproxy/ratelimit", "anchor", startAnchor(t, x.proxy("anchor", anchorRedis.Addr)))

	oursRedis := testredis.Start(t)
	section, _ := domainDir(t, map[string]string{"faults.yaml": anchorDomain})
	oursAddr := x.proxy("ours", oursRedis.Addr)
	var replicas []*sidecar
	var addrs []string
	for range 3 {
		r := startProcess(t, faultBinary(), writeConfig(t, defaultsConfig(oursAddr, "redis", section)), nil)
		replicas = append(replicas, r)
		addrs = append(addrs, r.GRPC)
	}
	waitPeers(t, replicas, 3)
	ours := rlsMode(t, "extauthz redis mode (rate limit service door)", "ours", addrs)
	ours.replicas = replicas
	ours.server = ours.serverSideOf("rls")
	ours.degraded = degradedOf(replicas)

	faultSuite{
		sourceNet: 200,
		header:    "| fault | service | gRPC errors | admitted / one exact window | vs extauthz | p50 / p99 | degraded | back to Redis after the fault |\n|---|---|---|---|---|---|---|---|",
		check: func(t *testing.T, runs []*faultRun, _ faultPlan) {
			if o := runs[0]; o.errors > 0 {
				t.Errorf("extauthz: %d gRPC errors of %d decisions (first: %v); want none", o.errors, o.decisions, o.firstError)
			}
			if o := runs[0]; o.allowed > o.exact {
				t.Errorf("extauthz admitted %d; one exact window per key allows at most %d", o.allowed, o.exact)
			}
		},
	}.run(t, x, []*modeUnderFault{ours, anchor})
}
