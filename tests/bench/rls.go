package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/extauthz/extauthz/tests/internal/testredis"
)

// The rate limit service rows: Envoy's ShouldRateLimit against the no-op
// server's rate limit service (the ceiling, in the same process as the
// Check ceiling) and against extauthz serving envoyproxy/ratelimit's
// descriptor files, on one busy descriptor far from its limit:
//
//   - hybrid, token_bucket: the algorithm hybrid mode leases slices of;
//   - hybrid, fixed_window: the default, what envoyproxy/ratelimit users
//     count with today;
//   - hybrid, Redis down: the token_bucket sidecar's twin started against
//     a port where no Redis listens: every decision falls back.

const rlsDomain = `
domain: bench
descriptors:
  - key: generic_key
    value: token_bucket
    rate_limit: {unit: minute, requests_per_unit: 1000000000, algorithm: token_bucket}
  - key: generic_key
    value: fixed_window
    rate_limit: {unit: minute, requests_per_unit: 1000000000}
`

// rlsRequest asks for one descriptor of rlsDomain.
func rlsRequest(value string) *rlsv3.RateLimitRequest {
	return &rlsv3.RateLimitRequest{Domain: "bench", Descriptors: []*ratelimitv3.RateLimitDescriptor{{
		Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "generic_key", Value: value}},
	}}}
}

// writeDomains writes rlsDomain into a directory of its own under dir.
func writeDomains(dir string) (string, error) {
	domains := filepath.Join(dir, "rls")
	if err := os.MkdirAll(domains, 0o700); err != nil {
		return "", err
	}
	return domains, os.WriteFile(filepath.Join(domains, "bench.yaml"), []byte(rlsDomain), 0o600)
}

// rlsRows are the measured rate limit service rows.
type rlsRows struct {
	targets []*target
	rounds  int
	n       int
}

// measureRLS starts the rows' sidecars and measures them; noop is the
// ceiling's process (main's, left running).
func measureRLS(b *bench, noop *testredis.Proc) (rlsRows, error) {
	domains, err := writeDomains(b.dir)
	if err != nil {
		return rlsRows{}, err
	}
	deadPort, err := testredis.FreePort()
	if err != nil {
		return rlsRows{}, err
	}
	cfg := func(redis string) string {
		return fmt.Sprintf("listen: {grpc: 127.0.0.1:0, admin: 127.0.0.1:0}\nredis: {addrs: [%s]}\ndefault_mode: hybrid\nrls: {domains: [%s]}\n", redis, domains)
	}
	rows := rlsRows{targets: []*target{b.grpcTarget("rls no-op ceiling", noop, false, nil, rlsRequest("token_bucket"))}, rounds: b.o.rounds, n: b.o.n}
	defer func() {
		for _, t := range rows.targets {
			if t.owns {
				t.p.Stop()
			}
		}
	}()
	for _, s := range []struct{ name, file, redis, alg string }{
		{"rls hybrid, token_bucket", "rls-hybrid", b.rds.Addr, "token_bucket"},
		{"rls hybrid, fixed_window", "rls-fixed", b.rds.Addr, "fixed_window"},
		{"rls hybrid, Redis down", "rls-down", fmt.Sprintf("127.0.0.1:%d", deadPort), "token_bucket"},
	} {
		p, err := startSidecar(b.dir, s.file, b.bin, cfg(s.redis))
		if err != nil {
			return rows, fmt.Errorf("%s: %w", s.name, err)
		}
		t := b.grpcTarget(s.name, p, s.redis == b.rds.Addr, nil, rlsRequest(s.alg))
		t.owns = true
		rows.targets = append(rows.targets, t)
	}
	// The warm-up opens the Redis-down sidecar's breaker.
	return rows, measureRounds(context.Background(), rows.targets, b.rdb, b.o.n, b.o.rounds)
}

// print prints the rows' table and returns their targets.
func (rows rlsRows) print(b *bench) []targetCheck {
	fmt.Printf("\nEnvoy's rate limit service (ShouldRateLimit), one busy descriptor; %d requests per target per round and load generator, %d workers, %d interleaved rounds (median shown)\n\n", rows.n, b.o.c, rows.rounds)
	printRows(rows.targets, func(*target) *target { return rows.targets[0] })
	by := map[string]*target{}
	for _, t := range rows.targets {
		by[t.name] = t
	}
	top, h := by["rls no-op ceiling"], by["rls hybrid, token_bucket"]
	for _, g := range []string{byGhz, inProcess} {
		if a, c := h.summary(g), top.summary(g); a.ok && c.ok {
			fmt.Printf("  printed, not gated: rls hybrid, token_bucket / rls ceiling, %s: %.0f%% of the throughput\n", g, 100*a.res.Throughput/c.res.Throughput)
		}
	}
	var bad float64
	for _, name := range []string{"rls hybrid, token_bucket", "rls hybrid, fixed_window"} {
		for g := range by[name].samples {
			s := by[name].summary(g)
			bad += s.degraded + float64(s.errors)
		}
	}
	down, downTop := by["rls hybrid, Redis down"].summary(inProcess), top.summary(inProcess)
	var downAll, downDegraded float64
	var downErrors int
	for g := range by["rls hybrid, Redis down"].samples {
		s := by["rls hybrid, Redis down"].summary(g)
		downAll += float64(s.decided)
		downDegraded += s.degraded
		downErrors += s.errors
	}
	return []targetCheck{
		{"rls hybrid: no decision degraded, no error", bad == 0},
		{fmt.Sprintf("rls with Redis down: 0 errors (%d), every decision by the fallback (%.0f of %.0f)", downErrors, downDegraded, downAll),
			downErrors == 0 && downDegraded == downAll},
		{fmt.Sprintf("rls with Redis down: p99 within 2× of the ceiling's, in-process generator (%.2f×)", float64(down.res.P99)/float64(downTop.res.P99)),
			float64(down.res.P99) <= 2*float64(downTop.res.P99)},
	}
}
