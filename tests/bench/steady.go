package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/extauthz/extauthz/internal/check"
	"github.com/extauthz/extauthz/internal/config"
	"github.com/extauthz/extauthz/tests/internal/loadgen"
	"github.com/extauthz/extauthz/tests/internal/testredis"
)

// The key distributions in steady state (SPEC §9): how a real
// gateway's callers spread, each over three replicas sharing one Redis,
// requests round robin over them. Hybrid's replicas warm up for two lease
// lifetimes first, so that every key has been seen by every replica and
// the leases have reached what they hold for good; then each mode is
// measured, hybrid first (on the many-key rows for longer: fittedMeasure),
// redis mode right after.
//
// Each row prints the Redis calls per 1,000 decisions (the replicas'
// extauthz_redis_calls_total: every call that reached Redis), throughput
// against redis mode's same row, CPU per decision (the three replicas and
// Redis), and under-use: every key is far from its limit, so every
// decision denied is one that a single exact bucket would have allowed.

// steadyWarmup is two lease lifetimes at the shipped default of
// `local.lease_ttl`: every key has then been seen by every replica, and
// every lease has been renewed at least once.
const steadyWarmup = 2 * config.DefaultLeaseTTL

// steadyRow is one key distribution and its targets.
type steadyRow struct {
	name string
	// policy is the sidecars' configuration below listen and redis: the
	// policy (or rate limit service domains) the requests meet.
	policy string
	check  func(i int) *authv3.CheckRequest // one of check and rls
	rls    func(i int) *rlsv3.RateLimitRequest
	// The targets: hybrid's Redis calls per 1,000 decisions at most, and
	// its throughput at least speedup × redis mode's (0: not a target).
	callsPerK, speedup float64
	// measure, when set, is how long hybrid is measured on the row unless
	// -measure says (redis mode, leasing nothing, is measured -measure
	// long): the many-key rows' leases are fitted to their keys' rates
	// (hybrid_fit.go), and a fleet whose keys were all first seen
	// together renews them together, in waves. A window of W holds
	// ⌊W/P⌋ or ⌈W/P⌉ waves of period P, so it reads up to P/W above
	// the steady count: see fittedMeasure.
	measure time.Duration
}

// fittedMeasure is hybrid's measured time on the many-key rows: two
// fitted lives of their keys at the rates this machine drives them (2
// minutes each). A lease is renewed when its life ends or its slice runs
// out, whichever comes first, so the waves' period is at most a life: on
// the uniform row a key seen 0.85 times a second on a replica spends its
// slice (83, the cap) in 97 s, and one life measured read two waves,
// 19.5 to 20.8 per 1,000, where the steady count is 12.0 (one call per
// 83 decisions). Two lives read two or three waves: at most half a wave,
// not a whole one, above the steady count (14.8 and 15.3 measured:
// docs/benchmarks.md).
const fittedMeasure = 4 * config.DefaultLeaseTTL

// userCheck is a Check from the caller a trusted gateway names in x-user.
func userCheck(key func(i int) int) func(int) *authv3.CheckRequest {
	return func(i int) *authv3.CheckRequest {
		return check.NewRequest(check.RequestSpec{Method: "GET", Path: "/", Source: "10.0.0.1",
			Headers: map[string]string{"x-user": "user-" + strconv.Itoa(key(i))}})
	}
}

func userPolicy(limit int, algorithm string) string {
	return fmt.Sprintf("policies:\n  - {name: users, key: [\"header:x-user\"], limit: %d, window: 1m, algorithm: %s}\n", limit, algorithm)
}

func steadyRows(domains string) []steadyRow {
	// A fixed Zipf sequence, so both modes see the same stream.
	z := rand.NewZipf(rand.New(rand.NewPCG(1, 2)), 1.1, 1, 100_000-1)
	zipf := make([]int, 1<<20)
	for i := range zipf {
		zipf[i] = int(z.Uint64())
	}
	busy := func(int) int { return 0 }
	busyRLS := rlsRequest("fixed_window")
	return []steadyRow{
		// 1,000 a minute each: at 20,000 decisions a second a key is seen
		// twice a second, 120 a minute. The targets are SPEC §9's.
		{name: "10,000 keys uniform", policy: userPolicy(1000, "token_bucket"), callsPerK: 20, speedup: 1, measure: fittedMeasure,
			check: userCheck(func(i int) int { return int(uint64(i) * 0x9e3779b97f4a7c15 % 10_000) })},
		// The busiest of 100,000 Zipf(1.1) keys gets about 9% of the
		// decisions: a million a minute keeps it far from its limit.
		{name: "100,000 keys Zipf(1.1)", policy: userPolicy(1_000_000, "token_bucket"), callsPerK: 50, speedup: 1.2, measure: fittedMeasure,
			check: userCheck(func(i int) int { return zipf[i%len(zipf)] })},
		{name: "busy key, fixed_window, Check", policy: userPolicy(1_000_000_000, "fixed_window"), callsPerK: 10, check: userCheck(busy)},
		{name: "busy key, sliding_window, Check", policy: userPolicy(1_000_000_000, "sliding_window"), callsPerK: 10, check: userCheck(busy)},
		{name: "busy descriptor, fixed_window, rate limit service", policy: "rls: {domains: [" + domains + "]}\n", callsPerK: 10,
			rls: func(int) *rlsv3.RateLimitRequest { return busyRLS }},
	}
}

// steadyMeasure is one mode's measured phase of a row.
type steadyMeasure struct {
	res      loadgen.Result
	cpu      time.Duration
	calls    float64 // Redis calls the replicas made
	degraded float64
	denied   int // decisions not allowed (every key is far from its limit)
	errors   int // gRPC errors
}

func (m steadyMeasure) perK() float64 { return m.calls * 1000 / float64(max(m.res.Requests, 1)) }

// runSteady measures every row and returns the targets.
func runSteady(b *bench) ([]targetCheck, error) {
	domains, err := writeDomains(b.dir)
	if err != nil {
		return nil, err
	}
	warm := fmt.Sprintf("hybrid warmed up %v (two lease lifetimes)", b.o.warmup)
	if b.o.warmup < steadyWarmup {
		warm = fmt.Sprintf("hybrid warmed up only %v, not two lease lifetimes (%v): a smoke run, not steady state", b.o.warmup, steadyWarmup)
	}
	measured := fmt.Sprintf("%v measured per mode", b.o.measure)
	if !b.o.measureSet {
		measured += fmt.Sprintf(" (hybrid %v on the many-key rows: two of their keys' fitted lease lives)", fittedMeasure)
	}
	fmt.Printf("\nkey distributions: three replicas per mode sharing one Redis, %s, then %s, in-process generator, %d workers\n\n",
		warm, measured, b.o.c)
	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "row\tmode\tdecisions/s\tvs redis mode\tp50\tp99\tCPU per decision\tRedis calls per 1,000\tdegraded\tunder-use (denied)\terrors\t")
	var checks []targetCheck
	for _, row := range steadyRows(domains) {
		if !strings.Contains(row.name, b.o.rows) {
			continue
		}
		fmt.Fprintf(os.Stderr, "bench: %s: hybrid warm-up %v...\n", row.name, b.o.warmup)
		h, err := b.steadyMode(row, "hybrid", b.o.warmup)
		if err != nil {
			return nil, fmt.Errorf("%s, hybrid: %w", row.name, err)
		}
		r, err := b.steadyMode(row, "redis", 0)
		if err != nil {
			return nil, fmt.Errorf("%s, redis: %w", row.name, err)
		}
		for _, m := range []struct {
			mode string
			m    steadyMeasure
		}{{"hybrid", h}, {"redis", r}} {
			fmt.Fprintf(tw, "%s\t%s\t%.0f\t%.2f×\t%s\t%s\t%s\t%.1f\t%.0f\t%d\t%d\t\n", row.name, m.mode, m.m.res.Throughput, m.m.res.Throughput/r.res.Throughput,
				us(m.m.res.P50), us(m.m.res.P99), cpuText(m.m.cpu), m.m.perK(), m.m.degraded, m.m.denied, m.m.errors)
		}
		checks = append(checks,
			targetCheck{fmt.Sprintf("%s: no decision degraded, no error", row.name), h.degraded+r.degraded == 0 && h.errors+r.errors == 0},
			targetCheck{fmt.Sprintf("%s: hybrid ≤ %.0f Redis calls per 1,000 decisions (%.1f)", row.name, row.callsPerK, h.perK()), h.perK() <= row.callsPerK})
		if row.speedup > 0 {
			ratio := h.res.Throughput / r.res.Throughput
			checks = append(checks, targetCheck{fmt.Sprintf("%s: hybrid throughput ≥ %.1f× redis mode's (%.0f vs %.0f decisions/s: %.2f×)", row.name, row.speedup, h.res.Throughput, r.res.Throughput, ratio), ratio >= row.speedup})
		}
	}
	tw.Flush()
	return checks, nil
}

// steadyMode starts three replicas in mode, drives them for warmup, then
// measures b.o.measure (hybrid: the row's measure, when set), and stops them.
func (b *bench) steadyMode(row steadyRow, mode string, warmup time.Duration) (steadyMeasure, error) {
	var m steadyMeasure
	cfg := fmt.Sprintf("listen: {grpc: 127.0.0.1:0, admin: 127.0.0.1:0}\nredis: {addrs: [%s]}\ndefault_mode: %s\n%s", b.rds.Addr, mode, row.policy)
	var procs []*testredis.Proc
	defer func() {
		for _, p := range procs {
			p.Stop()
		}
	}()
	for i := 0; i < 3; i++ {
		p, err := startSidecar(b.dir, fmt.Sprintf("steady-%s-%d", mode, i), b.bin, cfg)
		if err != nil {
			return m, err
		}
		procs = append(procs, p)
	}
	addrs := make([]string, len(procs))
	for i, p := range procs {
		addrs[i] = p.Addr
	}
	offset := 0 // every run goes on where the last stopped: the same stream
	drive := func(d time.Duration) (loadgen.Result, error) {
		o := loadgen.Options{Targets: addrs, Duration: d, Concurrency: b.o.c}
		base := offset
		if row.rls != nil {
			o.RateLimit = func(i int) *rlsv3.RateLimitRequest { return row.rls(base + i) }
		} else {
			o.Request = func(i int) *authv3.CheckRequest { return row.check(base + i) }
		}
		res, err := loadgen.Run(context.Background(), o)
		offset += res.Requests
		return res, err
	}
	// Connections and caches first, in every mode; then hybrid's leases,
	// ten seconds at a time.
	if _, err := drive(time.Second); err != nil {
		return m, err
	}
	for start := time.Now(); time.Since(start) < warmup; {
		if _, err := drive(min(10*time.Second, warmup-time.Since(start))); err != nil {
			return m, err
		}
	}
	// Each replica's slices are its share over the replicas it counts:
	// these three, or the row measures something else (another sidecar
	// heartbeating into the bench's Redis made it 5).
	for _, p := range procs {
		if n, err := procGauge(p, "extauthz_peers"); err != nil {
			return m, err
		} else if n != float64(len(procs)) {
			return m, fmt.Errorf("%s counts %v peers after the warm-up, want %d: another sidecar heartbeats into the bench's Redis", p.Name, n, len(procs))
		}
	}
	meter := append(cpuMeter{b.rds}, procs...)
	calls0, deg0, err := replicaCounts(procs)
	if err != nil {
		return m, err
	}
	measure := b.o.measure
	if row.measure > 0 && !b.o.measureSet && mode == "hybrid" {
		measure = row.measure
	}
	m.cpu, err = meter.measure(func() (int, error) {
		m.res, err = drive(measure)
		return m.res.Requests, err
	})
	if err != nil {
		return m, err
	}
	calls1, deg1, err := replicaCounts(procs)
	if err != nil {
		return m, err
	}
	m.calls, m.degraded = calls1-calls0, deg1-deg0
	m.errors = m.res.GRPCErrors
	m.denied = m.res.Requests - m.res.GRPCErrors - m.res.Statuses["200"]
	return m, nil
}

// replicaCounts sums the replicas' Redis calls (those that reached Redis:
// not the ones canceled by their caller or abandoned while Redis was
// marked down) and degraded decisions.
func replicaCounts(procs []*testredis.Proc) (calls, degraded float64, err error) {
	for _, p := range procs {
		c, err := sumCounter(p, "extauthz_redis_calls_total", func(l map[string]string) bool {
			return l["result"] != "canceled" && l["result"] != "abandoned"
		})
		if err != nil {
			return 0, 0, err
		}
		d, err := degradedDecisions(p)
		if err != nil {
			return 0, 0, err
		}
		calls, degraded = calls+c, degraded+d
	}
	return calls, degraded, nil
}
