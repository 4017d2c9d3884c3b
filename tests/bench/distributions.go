package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"text/tabwriter"
	"time"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"github.com/redis/go-redis/v9"

	"github.com/extauthz/extauthz/internal/check"
	"github.com/extauthz/extauthz/tests/internal/loadgen"
	"github.com/extauthz/extauthz/tests/internal/testredis"
)

// The key distributions: how a real gateway's callers spread. Each row
// runs three replicas sharing one Redis (the rows are about sharing), with
// requests round robin over them, against three no-op servers as the
// ceiling, and counts the Redis script calls per 1,000 decisions.

// userPolicy limits each caller, named by a header a trusted gateway sets,
// far from the limit: the rows measure what a decision costs, not denials.
const userPolicy = `
policies:
  - {name: users, key: ["header:x-user"], limit: 100000, window: 1m}
`

// distribution names a key for request i.
type distribution struct {
	name string
	key  func(i int) int
}

func distributions() []distribution {
	// A fixed Zipf sequence, so every target sees the same stream.
	z := rand.NewZipf(rand.New(rand.NewPCG(1, 2)), 1.1, 1, 100_000-1)
	zipf := make([]int, 1<<18)
	for i := range zipf {
		zipf[i] = int(z.Uint64())
	}
	return []distribution{
		{"10,000 keys uniform", func(i int) int { return int(uint64(i) * 0x9e3779b97f4a7c15 % 10_000) }},
		{"100,000 keys Zipf(1.1)", func(i int) int { return zipf[i%len(zipf)] }},
	}
}

// distRow is one mode (or the ceiling) under one distribution.
type distRow struct {
	name    string
	procs   []*testredis.Proc
	runs    []loadgen.Result
	calls   int64 // script calls Redis served during the measured rounds
	decided int64
	// degraded decisions in the measured rounds
	degraded float64
}

// runDistributions measures every mode under every distribution and
// returns the target checks.
func runDistributions(dir, bin, self string, rds *testredis.Proc, rdb *redis.Client, n, c, rounds int) ([]targetCheck, error) {
	var checks []targetCheck
	for _, dist := range distributions() {
		rows, err := startDistRows(dir, bin, self, rds, dist.name)
		if err != nil {
			return nil, err
		}
		err = measureDist(rows, dist, rdb, n, c, rounds)
		for _, r := range rows {
			for _, p := range r.procs {
				p.Stop()
			}
		}
		if err != nil {
			return nil, err
		}
		checks = append(checks, printDist(dist, rows)...)
	}
	return checks, nil
}

func startDistRows(dir, bin, self string, rds *testredis.Proc, dist string) ([]*distRow, error) {
	ceiling := &distRow{name: "no-op ceiling ×3"}
	rows := []*distRow{ceiling}
	for i := 0; i < 3; i++ {
		p, err := testredis.Serve("no-op", nil, self, "-noop-serve")
		if err != nil {
			return rows, err
		}
		ceiling.procs = append(ceiling.procs, p)
	}
	listen := "listen: {grpc: 127.0.0.1:0, admin: 127.0.0.1:0}\n"
	for _, mode := range []string{"local", "hybrid", "redis"} {
		r := &distRow{name: mode + " ×3"}
		rows = append(rows, r)
		cfg := listen + "default_mode: " + mode + "\n" + userPolicy
		if mode != "local" {
			cfg = listen + fmt.Sprintf("redis: {addrs: [%s]}\n", rds.Addr) + "default_mode: " + mode + "\n" + userPolicy
		}
		for i := 0; i < 3; i++ {
			p, err := startSidecar(dir, fmt.Sprintf("%s-%s-%d", mode, dist[:3], i), bin, cfg)
			if err != nil {
				return rows, err
			}
			r.procs = append(r.procs, p)
		}
	}
	return rows, nil
}

func measureDist(rows []*distRow, dist distribution, rdb *redis.Client, n, c, rounds int) error {
	ctx := context.Background()
	drive := func(r *distRow, n, offset int) (loadgen.Result, error) {
		addrs := make([]string, len(r.procs))
		for i, p := range r.procs {
			addrs[i] = p.Addr
		}
		return loadgen.Run(ctx, loadgen.Options{
			Targets: addrs, Requests: n, Concurrency: c, MaxDuration: 2 * time.Minute,
			Request: func(i int) *authv3.CheckRequest {
				return check.NewRequest(check.RequestSpec{Method: "GET", Path: "/", Source: "10.0.0.1",
					Headers: map[string]string{"x-user": "user-" + strconv.Itoa(dist.key(offset+i))}})
			},
		})
	}
	for _, r := range rows { // warm up connections, caches and rates
		if _, err := drive(r, max(n/10, 2000), 0); err != nil {
			return fmt.Errorf("%s: %w", r.name, err)
		}
	}
	for round := 0; round < rounds; round++ {
		for _, r := range rows {
			d0, err := degradedAll(r.procs)
			if err != nil {
				return err
			}
			before := scriptCalls(ctx, rdb)
			res, err := drive(r, n, (round+1)*n)
			if err != nil {
				return fmt.Errorf("%s: %w", r.name, err)
			}
			if res.GRPCErrors > 0 || res.Statuses["200"] != n {
				return fmt.Errorf("%s: %d gRPC errors, statuses %v (first error: %s)", r.name, res.GRPCErrors, res.Statuses, res.FirstError)
			}
			r.calls += scriptCalls(ctx, rdb) - before
			r.decided += int64(n)
			d1, err := degradedAll(r.procs)
			if err != nil {
				return err
			}
			r.degraded += d1 - d0
			r.runs = append(r.runs, res)
		}
	}
	return nil
}

func degradedAll(procs []*testredis.Proc) (float64, error) {
	var total float64
	for _, p := range procs {
		d, err := degradedDecisions(&target{name: p.Name, p: p})
		if err != nil {
			return 0, err
		}
		total += d
	}
	return total, nil
}

// printDist prints one distribution's table and returns its checks:
// hybrid at least as fast as redis mode, hybrid's Redis calls within the
// distribution's target, and no degraded decision.
func printDist(dist distribution, rows []*distRow) []targetCheck {
	fmt.Printf("\n%s, three replicas per mode sharing one Redis:\n\n", dist.name)
	ceiling := median(rows[0].runs)
	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "target\tthroughput (Checks/s)\tof ceiling\tp50\tp99\tRedis calls per 1,000\tdegraded decisions\t")
	by := map[string]loadgen.Result{}
	calls := map[string]float64{}
	degraded := 0.0
	for _, r := range rows {
		m := median(r.runs)
		by[r.name] = m
		perK := 0.0
		if r.decided > 0 {
			perK = float64(r.calls) * 1000 / float64(r.decided)
		}
		calls[r.name] = perK
		degraded += r.degraded
		fmt.Fprintf(tw, "%s\t%.0f\t%.0f%%\t%s\t%s\t%.1f\t%.0f\t\n", r.name, m.Throughput, 100*m.Throughput/ceiling.Throughput,
			us(m.P50), us(m.P99), perK, r.degraded)
	}
	tw.Flush()
	limit := map[string]float64{"10,000 keys uniform": 500, "100,000 keys Zipf(1.1)": 100}[dist.name]
	h, rm := by["hybrid ×3"], by["redis ×3"]
	return []targetCheck{
		{fmt.Sprintf("%s: no decision degraded", dist.name), degraded == 0},
		{fmt.Sprintf("%s: hybrid ≥ redis (%.0f vs %.0f Checks/s)", dist.name, h.Throughput, rm.Throughput), h.Throughput >= rm.Throughput},
		{fmt.Sprintf("%s: hybrid ≤ %.0f Redis calls per 1,000 decisions (%.1f)", dist.name, limit, calls["hybrid ×3"]), calls["hybrid ×3"] <= limit},
	}
}
