package tests

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/extauthz/extauthz/tests/internal/testredis"
)

const reloadBase = `
policies:
  - {name: steady, match: {path_prefix: /steady}, limit: 100000000, window: 1s}
  - {name: limited, match: {path_prefix: /limited}, key: [ip], limit: %d, window: %s}
`

// writeAtomically replaces path the way editors and config tools do:
// write a temporary file, then rename it over the old one.
func writeAtomically(t *testing.T, path, content string) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

func limitedReq(ip string) *authv3.CheckRequest {
	return envoyRequest{path: "/limited", sourceIP: ip}.build()
}

// admitted sends n requests and counts the allowed ones.
func (s *sidecar) admitted(n int, req *authv3.CheckRequest) int {
	got := 0
	for i := 0; i < n; i++ {
		if httpStatus(s.check(req)) == 200 {
			got++
		}
	}
	return got
}

func steadyLoad(s *sidecar) *background {
	return startBackground(s, 8, func(int) *authv3.CheckRequest { return envoyRequest{path: "/steady"}.build() })
}

func assertAllAllowed(t *testing.T, samples []sample) {
	t.Helper()
	for i, smp := range samples {
		if smp.err != nil || smp.status != 200 {
			t.Fatalf("background request %d of %d: status %d, error %v", i, len(samples), smp.status, smp.err)
		}
	}
	if len(samples) < 20 {
		t.Fatalf("only %d background requests ran", len(samples))
	}
}

// A changed file takes effect without a restart, under traffic, without
// a failed Check, and without resetting the counts of its policies.
func TestReloadOnFileChangeUnderTraffic(t *testing.T) {
	parallel(t)
	s := startSidecar(t, fmt.Sprintf(reloadBase, 3, "1h"))
	bg := steadyLoad(s)
	ip := "192.0.2.10"
	if got := s.admitted(5, limitedReq(ip)); got != 3 {
		t.Fatalf("before reload: %d admitted, want 3", got)
	}
	cfg, _ := os.ReadFile(s.config)
	writeAtomically(t, s.config, strings.Replace(string(cfg), "limit: 3,", "limit: 6,", 1))
	waitMetric(t, s, 10*time.Second, 1, "extauthz_config_reloads_total", "result", "success")
	waitCount(t, bg, len(bg.snapshot())+20) // traffic flows on across the reload
	// 3 of 6 are used: 3 more, then denied.
	if got := s.admitted(5, limitedReq(ip)); got != 3 {
		t.Fatalf("after raising the limit to 6: %d more admitted, want 3", got)
	}
	assertAllAllowed(t, bg.halt())
}

// An invalid file is refused: the running limits stay, the failure is
// counted, and the log names the field at fault.
func TestInvalidReloadKeepsRunningConfig(t *testing.T) {
	parallel(t)
	s := startSidecar(t, fmt.Sprintf(reloadBase, 2, "1h"))
	bg := steadyLoad(s)
	writeAtomically(t, s.config, "listen: {grpc: 127.0.0.1:0, admin: 127.0.0.1:0}\n"+fmt.Sprintf(reloadBase, 50, "1x"))
	waitMetric(t, s, 10*time.Second, 1, "extauthz_config_reloads_total", "result", "failure")
	if got := s.admitted(5, limitedReq("192.0.2.20")); got != 2 {
		t.Fatalf("after an invalid file: %d admitted, want the running limit of 2", got)
	}
	if log := s.logs.String(); !strings.Contains(log, `policies[1].window: \"1x\" is not a duration`) {
		t.Fatalf("log does not name the field at fault:\n%s", tail(log, 10))
	}
	// SIGHUP re-reads the same bad file: refused again.
	s.cmd.Process.Signal(syscall.SIGHUP)
	waitMetric(t, s, 10*time.Second, 2, "extauthz_config_reloads_total", "result", "failure")
	waitCount(t, bg, len(bg.snapshot())+20)
	assertAllAllowed(t, bg.halt())
}

// A Kubernetes ConfigMap volume updates by swapping a ..data symlink to a
// new directory; the file's own path never changes.
func TestReloadOnConfigMapSymlinkSwap(t *testing.T) {
	parallel(t)
	dir := t.TempDir()
	v1 := filepath.Join(dir, "..2026_11_30_v1")
	v2 := filepath.Join(dir, "..2026_11_30_v2")
	for _, d := range []string{v1, v2} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	listen := "listen: {grpc: 127.0.0.1:0, admin: 127.0.0.1:0}\n"
	os.WriteFile(filepath.Join(v1, "extauthz.yaml"), []byte(listen+fmt.Sprintf(reloadBase, 1, "1h")), 0o644)
	os.WriteFile(filepath.Join(v2, "extauthz.yaml"), []byte(listen+fmt.Sprintf(reloadBase, 4, "1h")), 0o644)
	must(t, os.Symlink(filepath.Base(v1), filepath.Join(dir, "..data")))
	must(t, os.Symlink(filepath.Join("..data", "extauthz.yaml"), filepath.Join(dir, "extauthz.yaml")))
	s := startSidecarFile(t, filepath.Join(dir, "extauthz.yaml"), nil)
	if got := s.admitted(3, limitedReq("192.0.2.30")); got != 1 {
		t.Fatalf("v1: %d admitted, want 1", got)
	}
	// The kubelet's swap: a new symlink renamed over ..data.
	must(t, os.Symlink(filepath.Base(v2), filepath.Join(dir, "..data_tmp")))
	must(t, os.Rename(filepath.Join(dir, "..data_tmp"), filepath.Join(dir, "..data")))
	waitMetric(t, s, 10*time.Second, 1, "extauthz_config_reloads_total", "result", "success")
	if got := s.admitted(5, limitedReq("192.0.2.30")); got != 3 {
		t.Fatalf("v2: %d more admitted, want 3 (4 minus the 1 used)", got)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// SIGTERM under load: health goes NOT_SERVING while the drain delay
// passes and Checks are still answered; in-flight Checks complete; unspent
// hybrid tokens go back to Redis; the process exits 0. The drain delay
// (700ms) is set because the default is 0: with none, NOT_SERVING is
// followed at once by GracefulStop, and no Check can be seen answered
// while the health service says NOT_SERVING (what lets Envoy and the
// kubelet stop sending before the listeners close).
// TestSIGTERMDrainsUnderLoadAtTheDefaults is the twin at the defaults.
func TestSIGTERMDrainsUnderLoad(t *testing.T) {
	serial(t, "health must say NOT_SERVING within 500ms of SIGTERM, and no Check be refused before the 700ms drain delay less 100ms: wall-clock windows")
	testSIGTERMDrains(t, 700*time.Millisecond, "-drain-delay", "700ms")
}

// SIGTERM under load at the defaults (no drain delay, a grace of 10s):
// in-flight Checks complete, a Check is refused only once the server is
// closing (Unavailable, which Envoy retries elsewhere), unspent hybrid
// tokens go back to Redis, the process exits 0.
func TestSIGTERMDrainsUnderLoadAtTheDefaults(t *testing.T) {
	parallel(t)
	testSIGTERMDrains(t, 0)
}

// testSIGTERMDrains sends SIGTERM to a hybrid sidecar under load, started
// with args, whose drain delay is drainDelay.
func testSIGTERMDrains(t *testing.T, drainDelay time.Duration, args ...string) {
	srv := testredis.Start(t)
	path := writeConfig(t, defaultsConfig(srv.Addr, "hybrid", ordersFor("limit: 100000, window: 8000h")))
	s := startSidecarFile(t, path, nil, args...)
	health := healthpb.NewHealthClient(s.conn)
	bg := startBackground(s, 8, adaOrder)
	waitCount(t, bg, 300)

	sent := time.Now()
	must(t, s.cmd.Process.Signal(syscall.SIGTERM))
	if drainDelay > 0 {
		// During the drain delay: NOT_SERVING, yet still answering
		// Checks. Seen within 500ms of the signal, before the delay
		// ends.
		ctx, cancel := context.WithDeadline(context.Background(), sent.Add(500*time.Millisecond))
		for {
			resp, err := health.Check(ctx, &healthpb.HealthCheckRequest{Service: "envoy.service.auth.v3.Authorization"})
			if err == nil && resp.GetStatus() == healthpb.HealthCheckResponse_NOT_SERVING {
				break
			}
			if ctx.Err() != nil {
				cancel()
				t.Fatalf("health did not report NOT_SERVING within 500ms of SIGTERM: %v %v", resp, err)
			}
			time.Sleep(10 * time.Millisecond) // polling the health service
		}
		cancel()
	}
	var exitErr error
	select {
	case exitErr = <-s.done:
		s.done <- exitErr
	case <-time.After(15 * time.Second):
		t.Fatal("extauthz did not exit within 15s of SIGTERM")
	}
	samples := bg.halt()
	if exitErr != nil {
		t.Fatalf("exit: %v", exitErr)
	}
	// A Check may be refused only once the server is closing: after the
	// drain delay, less the 100ms a Check can take to reach the server on
	// a loaded machine (with no drain delay, any time after the signal).
	refusedFrom := sent.Add(max(drainDelay-100*time.Millisecond, 0))
	answered, refused := 0, 0
	for i, smp := range samples {
		switch {
		case smp.err == nil && smp.status == 200:
			answered++
		case smp.err != nil && status.Code(smp.err) == codes.Unavailable && smp.start.After(refusedFrom):
			refused++ // started once the server was closing: Envoy retries elsewhere
		default:
			t.Fatalf("request %d (started %v after SIGTERM): status %d, error %v; want 200, or Unavailable once the server is closing (%v after SIGTERM)", i, smp.start.Sub(sent), smp.status, smp.err, refusedFrom.Sub(sent))
		}
	}
	t.Logf("%d answered, %d refused once the server was closing", answered, refused)
	used, err := srv.Client().HGet(context.Background(), "rl:{orders:client:ada}", "used").Float64()
	if err != nil {
		t.Fatal(err)
	}
	if diff := used - float64(answered); diff < -0.01 || diff > 0.01 {
		t.Fatalf("Redis counts %.2f tokens in use after shutdown for %d admitted: unspent tokens were not returned", used, answered)
	}
}

// After traffic, /metrics exposes every family operators rely on.
func TestMetricsFamilies(t *testing.T) {
	parallel(t)
	srv := testredis.Start(t)
	s := startSidecar(t, defaultsConfig(srv.Addr, "hybrid", ordersFor("limit: 100, window: 1m")))
	results, elapsed := timedDrive(t, []*sidecar{s}, 150, 4, adaOrder)
	counts := tally(t, results)
	assertAdmitted(t, counts[200], 100, 100, time.Minute, elapsed, 1)
	s.cmd.Process.Signal(syscall.SIGHUP)
	waitMetric(t, s, 10*time.Second, 1, "extauthz_config_reloads_total", "result", "success")
	mfs := s.metrics()
	for _, name := range []string{
		"extauthz_decisions_total", "extauthz_checks_total", "extauthz_check_duration_seconds",
		"extauthz_redis_calls_total", "extauthz_redis_call_duration_seconds", "extauthz_redis_up", "extauthz_redis_breaker_opened_total",
		"extauthz_hybrid_slices_leased_total", "extauthz_hybrid_tokens_leased_total",
		"extauthz_peers", "extauthz_cache_entries", "extauthz_cache_capacity", "extauthz_cache_evictions_total",
		"extauthz_config_reloads_total", "extauthz_config_policies", "extauthz_build_info",
		"extauthz_degraded_decisions_total", "extauthz_hybrid_tokens_returned_total",
		"go_goroutines", "process_resident_memory_bytes",
	} {
		if _, ok := mfs[name]; !ok {
			t.Errorf("/metrics lacks %s", name)
		}
	}
	if got := sumMetric(mfs, "extauthz_decisions_total", "policy", "orders", "mode", "hybrid", "result", "denied"); got != float64(counts[429]) {
		t.Errorf("denied decisions = %v, the responses say %d", got, counts[429])
	}
}
