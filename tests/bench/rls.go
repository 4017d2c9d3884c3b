package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"text/tabwriter"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/extauthz/extauthz/tests/internal/loadgen"
	"github.com/extauthz/extauthz/tests/internal/testredis"
)

// The rate limit service rows: Envoy's ShouldRateLimit against the no-op
// server's rate limit service (the ceiling, in the same process as the
// Check ceiling) and against extauthz serving envoyproxy/ratelimit's
// descriptor files, on one busy descriptor far from its limit:
//
//   - hybrid, token_bucket: the algorithm hybrid mode leases slices of;
//   - hybrid, fixed_window: the default, what envoyproxy/ratelimit users
//     count with today; hybrid decides windows with one exact Redis call
//     each (see internal/quota/redisstore/hybrid.go), so this row is
//     redis mode's cost, shown, not a target;
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

type rlsTarget struct {
	name     string
	addr     string
	p        *testredis.Proc // nil for the ceiling, which main owns
	alg      string          // the descriptor's value: which rate limit
	degraded float64         // decisions made without Redis in measured rounds
	errors   int             // gRPC errors and answers other than OK
	runs     []loadgen.Result
}

// measureRLS runs the rate limit service rows and returns the function
// printing their table and their targets.
func measureRLS(dir, bin, ceiling, redisAddr string, n, c, rounds int) (print func(), checks []targetCheck, err error) {
	domains := filepath.Join(dir, "rls")
	if err := os.MkdirAll(domains, 0o700); err != nil {
		return nil, nil, err
	}
	if err := os.WriteFile(filepath.Join(domains, "bench.yaml"), []byte(rlsDomain), 0o600); err != nil {
		return nil, nil, err
	}
	deadPort, err := testredis.FreePort()
	if err != nil {
		return nil, nil, err
	}
	cfg := func(redis string) string {
		return fmt.Sprintf("listen: {grpc: 127.0.0.1:0, admin: 127.0.0.1:0}\nredis: {addrs: [%s]}\ndefault_mode: hybrid\nrls: {domains: [%s]}\n", redis, domains)
	}
	targets := []*rlsTarget{{name: "rls no-op ceiling", addr: ceiling, alg: "token_bucket"}}
	defer func() {
		for _, t := range targets {
			t.p.Stop()
		}
	}()
	for _, s := range []struct{ name, file, redis, alg string }{
		{"rls hybrid, token_bucket", "rls-hybrid", redisAddr, "token_bucket"},
		{"rls hybrid, fixed_window", "rls-fixed", redisAddr, "fixed_window"},
		{"rls hybrid, Redis down", "rls-down", fmt.Sprintf("127.0.0.1:%d", deadPort), "token_bucket"},
	} {
		p, err := startSidecar(dir, s.file, bin, cfg(s.redis))
		if err != nil {
			return nil, nil, fmt.Errorf("%s: %w", s.name, err)
		}
		targets = append(targets, &rlsTarget{name: s.name, addr: p.Addr, p: p, alg: s.alg})
	}

	drive := func(t *rlsTarget, n int) (loadgen.Result, error) {
		req := &rlsv3.RateLimitRequest{Domain: "bench", Descriptors: []*ratelimitv3.RateLimitDescriptor{{
			Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "generic_key", Value: t.alg}},
		}}}
		return loadgen.Run(context.Background(), loadgen.Options{
			Targets: []string{t.addr}, Requests: n, Concurrency: c, MaxDuration: 2 * time.Minute,
			RateLimit: func(int) *rlsv3.RateLimitRequest { return req }, // read-only: safe to share
		})
	}
	for _, t := range targets { // warm up; the Redis-down sidecar's breaker opens here
		if _, err := drive(t, max(n/10, 2000)); err != nil {
			return nil, nil, fmt.Errorf("%s: %w", t.name, err)
		}
	}
	for r := 0; r < rounds; r++ {
		for _, t := range targets {
			d0, err := degradedAt(t)
			if err != nil {
				return nil, nil, err
			}
			res, err := drive(t, n)
			if err != nil {
				return nil, nil, fmt.Errorf("%s: %w", t.name, err)
			}
			d1, err := degradedAt(t)
			if err != nil {
				return nil, nil, err
			}
			t.degraded += d1 - d0
			t.errors += n - res.Statuses["200"] // gRPC errors included
			t.runs = append(t.runs, res)
		}
	}

	ceil := median(targets[0].runs)
	m := map[string]loadgen.Result{}
	print = func() {
		fmt.Printf("\nEnvoy's rate limit service (ShouldRateLimit), one busy descriptor; %d requests per target per round, %d workers, %d interleaved rounds (median shown)\n\n", n, c, rounds)
		tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "target\tthroughput (calls/s)\tof ceiling\tp50\tp99\tp99 vs ceiling\tdegraded decisions\terrors\t")
		for _, t := range targets {
			r := median(t.runs)
			fmt.Fprintf(tw, "%s\t%.0f\t%.0f%%\t%s\t%s\t%.2f×\t%.0f\t%d\t\n", t.name, r.Throughput, 100*r.Throughput/ceil.Throughput,
				us(r.P50), us(r.P99), float64(r.P99)/float64(ceil.P99), t.degraded, t.errors)
		}
		tw.Flush()
	}
	for _, t := range targets {
		m[t.name] = median(t.runs)
	}
	h, down := m["rls hybrid, token_bucket"], m["rls hybrid, Redis down"]
	byName := map[string]*rlsTarget{}
	for _, t := range targets {
		byName[t.name] = t
	}
	checks = []targetCheck{
		{fmt.Sprintf("rls hybrid ≥ 90%% of the rls ceiling on a busy descriptor (%.0f%%)", 100*h.Throughput/ceil.Throughput), h.Throughput >= 0.9*ceil.Throughput},
		{"rls hybrid: no decision degraded, no error", byName["rls hybrid, token_bucket"].degraded == 0 && byName["rls hybrid, token_bucket"].errors == 0 &&
			byName["rls hybrid, fixed_window"].degraded == 0 && byName["rls hybrid, fixed_window"].errors == 0},
		{fmt.Sprintf("rls with Redis down: 0 errors (%d), every decision by the fallback", byName["rls hybrid, Redis down"].errors),
			byName["rls hybrid, Redis down"].errors == 0 && byName["rls hybrid, Redis down"].degraded == float64(rounds*n)},
		{fmt.Sprintf("rls with Redis down: p99 within 2× of the ceiling's (%.2f×)", float64(down.P99)/float64(ceil.P99)), float64(down.P99) <= 2*float64(ceil.P99)},
	}
	return print, checks, nil
}

// degradedAt reads a sidecar's extauthz_degraded_decisions_total (0 for
// the ceiling).
func degradedAt(t *rlsTarget) (float64, error) {
	if t.p == nil {
		return 0, nil
	}
	return degradedDecisions(&target{name: t.name, p: t.p})
}
