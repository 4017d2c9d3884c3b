// Command bench prints the tables of `make bench` from one run. Every row
// reports the server's CPU per decision (cpu.go: its process, plus its
// redis-server's for the modes that use Redis) beside throughput and
// p50/p99, and the gRPC rows are driven twice, by ghz (ghz.go, pinned in
// tools/bench) and by the in-process generator (tests/internal/loadgen).
//
//	go run ./tests/bench              # what `make bench` runs first
//	go run ./tests/bench -compare     # `make bench-compare`
//	go run ./tests/bench -n 5000 -rounds 1 -warmup 10s -measure 3s    # a smoke run
//
// The tables: Check over gRPC for a no-op Check server (the ceiling) and
// extauthz in local, hybrid and redis modes against a real local Redis,
// the HTTP door (local and hybrid) against a no-op HTTP server driven the
// way nginx asks an auth server, Redis calls per 1,000 hybrid decisions
// and memory per tracked key (main.go); Envoy's rate limit service against
// its own no-op ceiling, in hybrid mode and with Redis down (rls.go); the
// key distributions in steady state over three replicas per mode
// (steady.go). With -compare, only extauthz in redis mode against
// envoyproxy/ratelimit (compare.go).
//
// Every server binds 127.0.0.1; runs are bounded in count and time.
// Targets are measured in interleaved rounds and the median round is
// reported, so a noisy neighbour hurts all targets alike. It exits 1 when
// a target is missed; a target that could not be measured is missed.
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
	"slices"
	"strings"
	"time"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/redis/go-redis/v9"

	"github.com/extauthz/extauthz/internal/check"
	"github.com/extauthz/extauthz/internal/config"
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
	var o options
	flag.IntVar(&o.n, "n", 40000, "requests per target per round and load generator")
	flag.IntVar(&o.c, "c", 32, "concurrent workers (the in-process generator: one gRPC connection per target; ghz: two)")
	flag.IntVar(&o.rounds, "rounds", 3, "interleaved rounds; the median is reported")
	flag.IntVar(&o.keys, "keys", 100000, "distinct keys for the memory measurement")
	flag.BoolVar(&o.dists, "distributions", true, "also measure the key distributions in steady state over three replicas per mode")
	flag.DurationVar(&o.warmup, "warmup", steadyWarmup, "the key distributions' warm-up before measuring: two lease lifetimes by default (shorten only for a smoke run)")
	// One lease life: the keys' first leases are granted together in the
	// warm-up, so their renewals come in waves a lease life apart, and a
	// shorter window lands on a wave or between two.
	flag.DurationVar(&o.measure, "measure", config.DefaultLeaseTTL, "the key distributions' measured load per row: one lease life by default")
	flag.BoolVar(&o.steadyOnly, "steady-only", false, "only the key distributions in steady state")
	flag.StringVar(&o.rows, "rows", "", "only the key distribution rows whose name contains this (\"keys\": the uniform and Zipf rows); every row's targets still gate")
	flag.BoolVar(&o.compare, "compare", false, "only the comparison with envoyproxy/ratelimit (make bench-compare)")
	rlqs := flag.Bool("rlqs", false, "only the rate limit quota service row beside Check's (10 Envoys × 1,000 buckets)")
	flag.Parse()
	flag.Visit(func(f *flag.Flag) { o.measureSet = o.measureSet || f.Name == "measure" })
	var err error
	if *rlqs {
		err = runRLQS()
	} else if o.compare {
		err = runCompare(o)
	} else {
		err = run(o)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

// options are the command line's.
type options struct {
	n, c, rounds, keys int
	dists, compare     bool
	steadyOnly         bool
	rows               string
	warmup, measure    time.Duration
	measureSet         bool // -measure given: every row measures that long
}

const policy = `
clients:
  keys: [{id: ada, key: key-ada}]
policies:
  - {name: bench, match: {path_prefix: /orders}, key: [client], limit: 1000000000, window: 1m}
`

// httpCeiling names the HTTP no-op server's row.
const httpCeiling = "http no-op ceiling"

// bench is what every part of a run shares: the built binary, this
// program (the no-op servers), the shared Redis, ghz.
type bench struct {
	o     options
	dir   string
	bin   string
	self  string
	rds   *testredis.Proc
	rdb   *redis.Client
	ghz   *ghz   // nil when it could not be built
	noGhz string // why not
}

// setup builds the binary and ghz and starts the shared Redis; the
// returned function undoes it.
func setup(o options) (*bench, func(), error) {
	dir, err := os.MkdirTemp("", "extauthz-bench-")
	if err != nil {
		return nil, nil, err
	}
	b := &bench{o: o, dir: dir, bin: filepath.Join(dir, "extauthz")}
	cleanup := func() {
		if b.rdb != nil {
			b.rdb.Close()
		}
		b.rds.Stop()
		os.RemoveAll(dir)
	}
	build := exec.Command("go", "build", "-o", b.bin, "./cmd/extauthz")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		cleanup()
		return nil, nil, fmt.Errorf("building extauthz (run from the repository root): %w", err)
	}
	if b.self, err = os.Executable(); err != nil {
		cleanup()
		return nil, nil, err
	}
	if b.ghz, err = newGhz(dir, o.c); err != nil {
		b.noGhz = "ghz could not be built in tools/bench: see the message above the tables"
		fmt.Fprintf(os.Stderr, "bench: no ghz rows: %v\n", err)
	}
	if b.rds, err = testredis.StartDetached(dir); err != nil {
		cleanup()
		return nil, nil, err
	}
	b.rdb = redis.NewClient(&redis.Options{Addr: b.rds.Addr})
	return b, cleanup, nil
}

// grpcTarget is a row answering Check (or, with rls, ShouldRateLimit) on
// p's gRPC address, driven by both load generators.
func (b *bench) grpcTarget(name string, p *testredis.Proc, usesRedis bool, checkReq *authv3.CheckRequest, rlsReq *rlsv3.RateLimitRequest) *target {
	t := &target{name: name, p: p, meter: cpuMeter{p}, drive: map[string]func(int) (loadgen.Result, error){}}
	if usesRedis {
		t.meter = append(t.meter, b.rds)
	}
	t.drive[inProcess] = func(n int) (loadgen.Result, error) {
		o := loadgen.Options{Targets: []string{p.Addr}, Requests: n, Concurrency: b.o.c, MaxDuration: 2 * time.Minute}
		if rlsReq != nil {
			o.RateLimit = func(int) *rlsv3.RateLimitRequest { return rlsReq } // read-only: safe to share
		} else {
			o.Request = func(int) *authv3.CheckRequest { return checkReq }
		}
		return loadgen.Run(context.Background(), o)
	}
	if b.ghz != nil {
		t.drive[byGhz] = func(n int) (loadgen.Result, error) {
			if rlsReq != nil {
				return b.ghz.run(p.Addr, rateLimitMethod, rlsReq, n)
			}
			return b.ghz.run(p.Addr, checkMethod, checkReq, n)
		}
	}
	return t
}

func run(o options) error {
	b, cleanup, err := setup(o)
	if err != nil {
		return err
	}
	defer cleanup()
	if o.steadyOnly {
		checks, err := runSteady(b)
		if err != nil {
			return fmt.Errorf("distributions: %w", err)
		}
		return report(checks)
	}
	listen := "listen: {grpc: 127.0.0.1:0, http: 127.0.0.1:0, admin: 127.0.0.1:0}\n"
	redisSection := fmt.Sprintf("redis: {addrs: [%s]}\n", b.rds.Addr)

	var targets []*target
	stopTargets := func() {
		for _, t := range targets {
			if t.owns {
				t.p.Stop()
			}
		}
		targets = nil
	}
	defer stopTargets()
	req := check.NewRequest(check.RequestSpec{Method: "POST", Path: "/orders", Headers: map[string]string{"x-api-key": "key-ada"}})
	noop, err := testredis.Serve("no-op", nil, b.self, "-noop-serve")
	if err != nil {
		return fmt.Errorf("no-op: %w", err)
	}
	targets = append(targets, b.grpcTarget("no-op ceiling", noop, false, req, nil))
	targets[0].owns = true
	for _, mode := range []string{"local", "hybrid", "redis"} {
		cfg := listen + "default_mode: " + mode + "\n" + policy
		if mode != "local" {
			cfg = listen + redisSection + "default_mode: " + mode + "\n" + policy
		}
		p, err := startSidecar(b.dir, mode, b.bin, cfg)
		if err != nil {
			return fmt.Errorf("%s: %w", mode, err)
		}
		t := b.grpcTarget(mode, p, mode != "local", req, nil)
		t.owns = true
		targets = append(targets, t)
	}
	// The HTTP door: its own ceiling, then the local and hybrid sidecars'
	// HTTP listeners (the same processes as their gRPC rows), driven the
	// way nginx asks an auth server (HTTP/1.1 keep-alive, one connection
	// per worker), by the in-process generator alone.
	httpReq := loadgen.RawRequest("GET", "/nginx", "api.example.com", "X-Original-Method", "POST", "X-Original-URI", "/orders?page=1",
		"X-Forwarded-For", "10.0.0.1", "User-Agent", "curl/8.0", "Accept", "*/*", "X-Api-Key", "key-ada")
	httpTarget := func(name string, p *testredis.Proc, meter cpuMeter) *target {
		return &target{name: name, p: p, meter: meter, http: true, drive: map[string]func(int) (loadgen.Result, error){
			inProcess: func(n int) (loadgen.Result, error) {
				return loadgen.RunHTTP(context.Background(), loadgen.HTTPOptions{
					Targets: []string{p.HTTP}, Requests: n, Concurrency: o.c, MaxDuration: 2 * time.Minute, Request: httpReq,
				})
			},
		}}
	}
	hn, err := testredis.Serve("http no-op", nil, b.self, "-noop-http-serve")
	if err != nil {
		return fmt.Errorf("http no-op: %w", err)
	}
	grpcRows := slices.Clone(targets)
	targets = append(targets, httpTarget(httpCeiling, hn, cpuMeter{hn}))
	targets[len(targets)-1].owns = true
	for _, t := range grpcRows {
		if t.name == "local" || t.name == "hybrid" {
			targets = append(targets, httpTarget("http "+t.name, t.p, t.meter))
		}
	}

	ctx := context.Background()
	if err := measureRounds(ctx, targets, b.rdb, o.n, o.rounds); err != nil {
		return err
	}
	perKey, rss, err := memoryPerKey(b.dir, b.bin, o.keys, o.c)
	if err != nil {
		return fmt.Errorf("memory: %w", err)
	}
	rlsRows, err := measureRLS(b, noop)
	if err != nil {
		return fmt.Errorf("rate limit service: %w", err)
	}

	fmt.Printf("extauthz benchmark: %s, %d CPUs, %s; %d requests per target per round and load generator, %d workers, %d interleaved rounds (median shown); every sidecar at the default configuration\n\n",
		time.Now().Format("2006-01-02"), runtime.NumCPU(), runtime.Version(), o.n, o.c, o.rounds)
	by := map[string]*target{}
	for _, t := range targets {
		by[t.name] = t
	}
	printRows(targets, func(t *target) *target {
		if t.http {
			return by[httpCeiling] // each door against its own protocol's ceiling
		}
		return targets[0]
	})
	fmt.Println(cpuNote)
	var degraded float64
	var errs int
	for _, t := range targets {
		for g := range t.samples {
			s := t.summary(g)
			degraded, errs = degraded+s.degraded, errs+s.errors
		}
	}
	hs := by["hybrid"].summary(inProcess)
	perThousand := float64(hs.scripts) * 1000 / float64(hs.decided)
	if gs := by["hybrid"].summary(byGhz); gs.ok {
		perThousand = float64(hs.scripts+gs.scripts) * 1000 / float64(hs.decided+gs.decided)
	}
	fmt.Printf("\nhybrid: %.2f Redis calls per 1,000 decisions (script calls seen by Redis, heartbeats included)\n", perThousand)
	fmt.Printf("memory per tracked key (local mode, %d keys): %.0f bytes of live heap, %.0f bytes of resident memory\n", o.keys, perKey, rss)
	printRatios(by)

	// SPEC §9's targets, each checked; any miss, and any decision made
	// without Redis in a measured round, fails the run.
	h, top := by["hybrid"].summary(inProcess), targets[0].summary(inProcess)
	checks := []targetCheck{
		{fmt.Sprintf("no decision degraded (made without Redis) and no error in any measured round (%.0f degraded, %d errors)", degraded, errs), degraded == 0 && errs == 0},
		cpuGate(by["hybrid"], targets[0], 1.25, b.noGhz),
		{fmt.Sprintf("hybrid p99 within 1.5× of the ceiling's, in-process generator (%.2f×)", float64(h.res.P99)/float64(top.res.P99)), float64(h.res.P99) <= 1.5*float64(top.res.P99)},
		{fmt.Sprintf("hybrid ≤ 1 Redis call per 1,000 decisions on a busy key (%.2f)", perThousand), perThousand <= 1},
	}
	checks = append(checks, rlsRows.print(b)...)
	if o.dists {
		// The tables' sidecars heartbeat into the same Redis: stopped
		// first, or the rows' replicas count them as peers (5, not 3)
		// and lease slices of a fifth, not a third (the uniform row: 50
		// tokens, not 83, and 22.0 calls per 1,000 where the rows alone
		// read 14.8).
		stopTargets()
		more, err := runSteady(b)
		if err != nil {
			return fmt.Errorf("distributions: %w", err)
		}
		checks = append(checks, more...)
	}
	return report(checks)
}

// cpuNote says what the CPU column is.
const cpuNote = `
CPU per decision: the server's process (utime + stime from /proc/PID/stat), plus its redis-server's for the
modes that use Redis, over the measured round, ÷ decisions; the median round. It measures the server, whichever
client drives it; the throughput columns mostly measure the client, which shares the cores.`

// printRatios prints the throughput ratios that SPEC §9 once gated: on a
// machine whose cores the client shares they measure the client as much
// as the sidecar, so they are shown, not gated.
func printRatios(by map[string]*target) {
	top, http := by["no-op ceiling"], by[httpCeiling]
	fmt.Println("\nthroughput ratios (printed, not gated: they measure the load generator as much as the sidecar):")
	for _, r := range []struct{ row, ceiling *target }{{by["hybrid"], top}, {by["redis"], top}, {by["redis"], by["hybrid"]}, {by["http hybrid"], http}, {by["http local"], http}} {
		for _, g := range []string{byGhz, inProcess} {
			a, c := r.row.summary(g), r.ceiling.summary(g)
			if a.ok && c.ok {
				fmt.Printf("  %s / %s, %s: %.0f%%\n", r.row.name, r.ceiling.name, g, 100*a.res.Throughput/c.res.Throughput)
			}
		}
	}
}

// report prints the targets and fails the run when one was missed.
func report(checks []targetCheck) error {
	fmt.Println("\ntargets (SPEC §9, issues 24 and 25):")
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

// families reads a sidecar's /metrics.
func families(p *testredis.Proc) (map[string]*dto.MetricFamily, error) {
	resp, err := http.Get("http://" + p.Admin + "/metrics")
	if err != nil {
		return nil, fmt.Errorf("%s: %w", p.Name, err)
	}
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", p.Name, err)
	}
	return mfs, nil
}

// procGauge reads a sidecar's gauge name.
func procGauge(p *testredis.Proc, name string) (float64, error) {
	mfs, err := families(p)
	if err != nil {
		return 0, err
	}
	return gauge(mfs, name), nil
}

// degradedDecisions reads extauthz_degraded_decisions_total from a
// sidecar's admin endpoint; the no-op server has none.
func degradedDecisions(p *testredis.Proc) (float64, error) {
	return sumCounter(p, "extauthz_degraded_decisions_total", nil)
}

// sumCounter sums a counter's series on a sidecar's /metrics whose labels
// keep accepts (nil: every series); 0 for a server with no admin address.
func sumCounter(p *testredis.Proc, name string, keep func(labels map[string]string) bool) (float64, error) {
	if p.Admin == "" {
		return 0, nil
	}
	mfs, err := families(p)
	if err != nil {
		return 0, err
	}
	var total float64
	for _, m := range mfs[name].GetMetric() {
		labels := map[string]string{}
		for _, l := range m.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		if keep == nil || keep(labels) {
			total += m.GetCounter().GetValue()
		}
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
