// Command bench prints one table from one run: Check throughput and p50/p99
// latency over gRPC for a no-op Check server (the ceiling) and for
// extauthz in local, hybrid and redis modes against a real local Redis, all
// driven by the same load generator at the same concurrency; the HTTP door
// (local and hybrid) against a no-op HTTP server, driven the way nginx
// asks an auth server (HTTP/1.1 keep-alive, one connection per worker);
// then Redis calls per 1,000 hybrid decisions and memory per tracked key;
// then Envoy's rate limit service protocol (rls.go) against its own no-op
// ceiling, in hybrid mode and with Redis down; then, over three replicas
// per mode, 10,000 uniform and 100,000 Zipf(1.1) keys.
//
//	go run ./tests/bench            # what `make bench` runs
//	go run ./tests/bench -n 100000 -c 64 -rounds 5
//
// Every server binds 127.0.0.1; runs are bounded in count and time.
// Targets are measured in interleaved rounds and the median round is
// reported, so a noisy neighbour hurts all targets alike.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/redis/go-redis/v9"

	"github.com/extauthz/extauthz/internal/check"
	"github.com/extauthz/extauthz/tests/internal/loadgen"
	"github.com/extauthz/extauthz/tests/internal/testredis"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "-noop-serve" {
		serveNoop()
		return
	}
	if len(os.Args) > 1 && os.Args[1] == "-noop-http-serve" {
		serveNoopHTTP()
		return
	}
	n := flag.Int("n", 40000, "requests per target per round")
	c := flag.Int("c", 32, "concurrent workers (one gRPC connection per target)")
	rounds := flag.Int("rounds", 3, "interleaved rounds; the median is reported")
	keys := flag.Int("keys", 100000, "distinct keys for the memory measurement")
	dists := flag.Bool("distributions", true, "also measure 10,000 uniform and 100,000 Zipf(1.1) keys over three replicas per mode")
	flag.Parse()
	if err := run(*n, *c, *rounds, *keys, *dists); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

const policy = `
clients:
  keys: [{id: ada, key: key-ada}]
policies:
  - {name: bench, match: {path_prefix: /orders}, key: [client], limit: 1000000000, window: 1m}
`

// httpCeiling names the HTTP no-op server's row.
const httpCeiling = "http no-op ceiling"

type target struct {
	name string
	p    *testredis.Proc
	http bool // the HTTP door (p.HTTP), not gRPC Check (p.Addr)
	owns bool // p is this target's process, to stop at the end
	runs []loadgen.Result
}

func run(n, c, rounds, keys int, dists bool) error {
	dir, err := os.MkdirTemp("", "extauthz-bench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	bin := filepath.Join(dir, "extauthz")
	build := exec.Command("go", "build", "-o", bin, "./cmd/extauthz")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		return fmt.Errorf("building extauthz (run from the repository root): %w", err)
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}

	rds, err := testredis.StartDetached(dir)
	if err != nil {
		return err
	}
	defer rds.Stop()
	listen := "listen: {grpc: 127.0.0.1:0, http: 127.0.0.1:0, admin: 127.0.0.1:0}\n"
	redisSection := fmt.Sprintf("redis: {addrs: [%s]}\n", rds.Addr)

	var targets []*target
	defer func() {
		for _, t := range targets {
			if t.owns {
				t.p.Stop()
			}
		}
	}()
	add := func(name string, p *testredis.Proc, err error) error {
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		targets = append(targets, &target{name: name, p: p, owns: true})
		return nil
	}
	p, err := testredis.Serve("no-op", nil, self, "-noop-serve")
	if err := add("no-op ceiling", p, err); err != nil {
		return err
	}
	for _, mode := range []string{"local", "hybrid", "redis"} {
		cfg := listen + "default_mode: " + mode + "\n" + policy
		if mode != "local" {
			cfg = listen + redisSection + "default_mode: " + mode + "\n" + policy
		}
		p, err := startSidecar(dir, mode, bin, cfg)
		if err := add(mode, p, err); err != nil {
			return err
		}
	}
	// The HTTP door: its own ceiling, then the local and hybrid sidecars'
	// HTTP listeners (the same processes as their gRPC rows).
	p, err = testredis.Serve("http no-op", nil, self, "-noop-http-serve")
	if err := add(httpCeiling, p, err); err != nil {
		return err
	}
	targets[len(targets)-1].http = true
	for _, t := range targets[:len(targets)-1] {
		if t.name == "local" || t.name == "hybrid" {
			targets = append(targets, &target{name: "http " + t.name, p: t.p, http: true})
		}
	}

	req := check.NewRequest(check.RequestSpec{Method: "POST", Path: "/orders", Headers: map[string]string{"x-api-key": "key-ada"}})
	same := func(int) *authv3.CheckRequest { return req } // read-only: safe to share
	// What nginx's auth_request sends (proxies/nginx/extauthz.conf): the
	// original method and URI in headers, the client's headers beside them.
	httpReq := loadgen.RawRequest("GET", "/nginx", "api.example.com", "X-Original-Method", "POST", "X-Original-URI", "/orders?page=1",
		"X-Forwarded-For", "10.0.0.1", "User-Agent", "curl/8.0", "Accept", "*/*", "X-Api-Key", "key-ada")
	drive := func(t *target, n int) (loadgen.Result, error) {
		if t.http {
			return loadgen.RunHTTP(context.Background(), loadgen.HTTPOptions{
				Targets: []string{t.p.HTTP}, Requests: n, Concurrency: c, MaxDuration: 2 * time.Minute, Request: httpReq,
			})
		}
		return loadgen.Run(context.Background(), loadgen.Options{
			Targets: []string{t.p.Addr}, Requests: n, Concurrency: c, MaxDuration: 2 * time.Minute, Request: same,
		})
	}
	for _, t := range targets { // warm up connections, caches and rates
		if _, err := drive(t, max(n/10, 2000)); err != nil {
			return fmt.Errorf("%s: %w", t.name, err)
		}
	}

	rdb := redis.NewClient(&redis.Options{Addr: rds.Addr})
	defer rdb.Close()
	ctx := context.Background()
	var hybridCalls, hybridDecisions int64
	degraded := map[string]float64{}
	for r := 0; r < rounds; r++ {
		for _, t := range targets {
			before := scriptCalls(ctx, rdb)
			d0, err := degradedDecisions(t)
			if err != nil {
				return err
			}
			res, err := drive(t, n)
			if err != nil {
				return fmt.Errorf("%s: %w", t.name, err)
			}
			if res.GRPCErrors > 0 || res.Statuses["200"] != n {
				return fmt.Errorf("%s: %d transport errors, statuses %v (first error: %s)", t.name, res.GRPCErrors, res.Statuses, res.FirstError)
			}
			d1, err := degradedDecisions(t)
			if err != nil {
				return err
			}
			degraded[t.name] += d1 - d0
			if t.name == "hybrid" {
				hybridCalls += scriptCalls(ctx, rdb) - before
				hybridDecisions += int64(n)
			}
			t.runs = append(t.runs, res)
		}
	}

	perKey, rss, err := memoryPerKey(dir, bin, keys, c)
	if err != nil {
		return fmt.Errorf("memory: %w", err)
	}
	printRLS, rlsChecks, err := measureRLS(dir, bin, targets[0].p.Addr, rds.Addr, n, c, rounds)
	if err != nil {
		return fmt.Errorf("rate limit service: %w", err)
	}

	fmt.Printf("extauthz benchmark: %s, %d CPUs, %s; %d requests per target per round, %d workers, %d interleaved rounds (median shown); every sidecar at the default configuration\n\n",
		time.Now().Format("2006-01-02"), runtime.NumCPU(), runtime.Version(), n, c, rounds)
	ceiling := median(targets[0].runs)
	byName := map[string]loadgen.Result{}
	for _, t := range targets {
		byName[t.name] = median(t.runs)
	}
	httpTop := byName[httpCeiling]
	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "target\tthroughput (decisions/s)\tof ceiling\tp50\tp99\tp99 vs ceiling\tdegraded decisions\t")
	for _, t := range targets {
		m, top := byName[t.name], ceiling
		if t.http {
			top = httpTop // each door against its own protocol's ceiling
		}
		fmt.Fprintf(tw, "%s\t%.0f\t%.0f%%\t%s\t%s\t%.2f×\t%.0f\t\n", t.name, m.Throughput, 100*m.Throughput/top.Throughput,
			us(m.P50), us(m.P99), float64(m.P99)/float64(top.P99), degraded[t.name])
	}
	tw.Flush()
	var totalDegraded float64
	for _, d := range degraded {
		totalDegraded += d
	}
	h, rm := byName["hybrid"], byName["redis"]
	hh, hl := byName["http hybrid"], byName["http local"]
	perThousand := float64(hybridCalls) * 1000 / float64(hybridDecisions)
	fmt.Printf("\nhybrid: %.2f Redis calls per 1,000 decisions (script calls seen by Redis, heartbeats included)\n", perThousand)
	fmt.Printf("memory per tracked key (local mode, %d keys): %.0f bytes of live heap, %.0f bytes of resident memory\n", keys, perKey, rss)

	// SPEC §9's targets, each checked; any miss, and any decision made
	// without Redis in a measured round, fails the run.
	checks := []targetCheck{
		{"no decision degraded (made without Redis) in any measured round", totalDegraded == 0},
		{fmt.Sprintf("hybrid throughput ≥ 90%% of the ceiling (%.0f%%)", 100*h.Throughput/ceiling.Throughput), h.Throughput >= 0.9*ceiling.Throughput},
		{fmt.Sprintf("hybrid p99 within 1.5× of the ceiling's (%.2f×)", float64(h.P99)/float64(ceiling.P99)), float64(h.P99) <= 1.5*float64(ceiling.P99)},
		{fmt.Sprintf("redis throughput ≥ 75%% of the ceiling (%.0f%%)", 100*rm.Throughput/ceiling.Throughput), rm.Throughput >= 0.75*ceiling.Throughput},
		{"hybrid ≥ redis on one busy key", h.Throughput >= rm.Throughput},
		{fmt.Sprintf("hybrid ≤ 1 Redis call per 1,000 decisions on a busy key (%.2f)", perThousand), perThousand <= 1},
		{fmt.Sprintf("HTTP door, hybrid, ≥ 85%% of the HTTP no-op ceiling's throughput (%.0f%%)", 100*hh.Throughput/httpTop.Throughput), hh.Throughput >= 0.85*httpTop.Throughput},
		{fmt.Sprintf("HTTP door, local, ≥ 85%% of the HTTP no-op ceiling's throughput (%.0f%%)", 100*hl.Throughput/httpTop.Throughput), hl.Throughput >= 0.85*httpTop.Throughput},
	}
	checks = append(checks, rlsChecks...)
	printRLS()
	if dists {
		more, err := runDistributions(dir, bin, self, rds, rdb, n/2, c, rounds)
		if err != nil {
			return fmt.Errorf("distributions: %w", err)
		}
		checks = append(checks, more...)
	}
	fmt.Println("\ntargets (SPEC §9; the HTTP door's from issue 17):")
	missed := 0
	for _, c := range checks {
		fmt.Printf("  %-8s %s\n", verdict(c.ok), c.what)
		if !c.ok {
			missed++
		}
	}
	if missed > 0 {
		return fmt.Errorf("%d of %d targets missed", missed, len(checks))
	}
	return nil
}

// targetCheck is one target of SPEC §9 and whether the run met it.
type targetCheck struct {
	what string
	ok   bool
}

// degradedDecisions reads extauthz_degraded_decisions_total from a
// sidecar's admin endpoint; the no-op server has none.
func degradedDecisions(t *target) (float64, error) {
	if t.p.Admin == "" {
		return 0, nil
	}
	resp, err := http.Get("http://" + t.p.Admin + "/metrics")
	if err != nil {
		return 0, fmt.Errorf("%s: %w", t.name, err)
	}
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", t.name, err)
	}
	var total float64
	for _, m := range mfs["extauthz_degraded_decisions_total"].GetMetric() {
		total += m.GetCounter().GetValue()
	}
	return total, nil
}

func verdict(ok bool) string {
	if ok {
		return "met"
	}
	return "NOT met"
}

func us(d time.Duration) string { return fmt.Sprintf("%dµs", d.Microseconds()) }

// median returns the round with the median throughput.
func median(runs []loadgen.Result) loadgen.Result {
	s := append([]loadgen.Result(nil), runs...)
	sort.Slice(s, func(i, j int) bool { return s[i].Throughput < s[j].Throughput })
	return s[len(s)/2]
}

// scriptCalls is the number of EVAL and EVALSHA calls Redis has served.
func scriptCalls(ctx context.Context, rdb *redis.Client) int64 {
	var total int64
	for _, line := range strings.Split(rdb.Info(ctx, "commandstats").Val(), "\n") {
		for _, cmd := range []string{"cmdstat_evalsha:", "cmdstat_eval:"} {
			if rest, ok := strings.CutPrefix(strings.TrimSpace(line), cmd); ok {
				var calls int64
				fmt.Sscanf(rest, "calls=%d", &calls)
				total += calls
			}
		}
	}
	return total
}

// memoryPerKey starts a local-mode sidecar, tracks `keys` distinct client
// IPs, and returns the growth of live heap (after a forced GC) and of
// resident memory, per key.
func memoryPerKey(dir, bin string, keys, c int) (heapPerKey, rssPerKey float64, err error) {
	cfg := fmt.Sprintf("listen: {grpc: 127.0.0.1:0, admin: 127.0.0.1:0}\ndefault_mode: local\nlocal: {max_keys: %d}\npolicies:\n  - {name: per-ip, key: [ip], limit: 100, window: 1m}\n", keys*2)
	p, err := startSidecar(dir, "memory", bin, cfg)
	if err != nil {
		return 0, 0, err
	}
	defer p.Stop()
	gen := func(offset int) func(int) *authv3.CheckRequest {
		return func(i int) *authv3.CheckRequest {
			i += offset
			return check.NewRequest(check.RequestSpec{Method: "GET", Path: "/", Source: fmt.Sprintf("10.%d.%d.%d", i>>16&255, i>>8&255, i&255)})
		}
	}
	drive := func(n, offset int) error {
		_, err := loadgen.Run(context.Background(), loadgen.Options{Targets: []string{p.Addr}, Requests: n, Concurrency: c, Request: gen(offset)})
		return err
	}
	// Warm up with a few keys so runtime and gRPC buffers are in place.
	if err := drive(2000, 1<<23); err != nil {
		return 0, 0, err
	}
	heap0, rss0, err := liveMemory(p.Admin)
	if err != nil {
		return 0, 0, err
	}
	if err := drive(keys, 0); err != nil {
		return 0, 0, err
	}
	heap1, rss1, err := liveMemory(p.Admin)
	if err != nil {
		return 0, 0, err
	}
	return (heap1 - heap0) / float64(keys), (rss1 - rss0) / float64(keys), nil
}

// liveMemory forces a GC through pprof, then reads the heap in use and the
// resident set size from /metrics.
func liveMemory(admin string) (heap, rss float64, err error) {
	for i := 0; i < 2; i++ {
		resp, err := http.Get("http://" + admin + "/debug/pprof/heap?gc=1")
		if err != nil {
			return 0, 0, err
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	resp, err := http.Get("http://" + admin + "/metrics")
	if err != nil {
		return 0, 0, err
	}
	defer resp.Body.Close()
	p := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		return 0, 0, err
	}
	return gauge(mfs, "go_memstats_heap_alloc_bytes"), gauge(mfs, "process_resident_memory_bytes"), nil
}

func gauge(mfs map[string]*dto.MetricFamily, name string) float64 {
	if mf, ok := mfs[name]; ok && len(mf.GetMetric()) > 0 {
		return mf.GetMetric()[0].GetGauge().GetValue()
	}
	return 0
}
