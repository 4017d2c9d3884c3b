// Package fleet simulates a fleet of sidecars against one real Redis
// (standalone or a Cluster), in one process: N replicas, each with the
// Redis side of a sidecar, wired by redisstore.Open as the sidecar is (its
// own clients and connection pool, store and breaker, heartbeats, hybrid
// leases and returns, the fallback), deciding keys drawn from a distribution at a
// rate per replica. It measures what the fleet costs Redis: commands and
// CPU (INFO), connections, memory per key, the latency of Redis calls,
// calls per decision, and the heartbeat set's load.
//
// It is test tooling: tests/fleet_test.go asserts bounds at N=100, and `make
// bench-fleet` prints the table docs/capacity.md reports.
package fleet

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math"
	"math/rand/v2"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/redis/go-redis/v9"

	"github.com/extauthz/extauthz/internal/quota"
	"github.com/extauthz/extauthz/internal/quota/local"
	"github.com/extauthz/extauthz/internal/quota/redisstore"
)

// Options describes one fleet run.
type Options struct {
	// Addrs is what each replica is given: one address is a standalone
	// server, several are a Cluster's seeds. Masters are the servers to
	// read INFO from (for a Cluster, every master).
	Addrs   []string
	Masters []string

	Replicas int
	Mode     string // "redis" or "hybrid"
	Keys     int    // distinct keys
	// ZipfS is the Zipf exponent of the key distribution (such as 1.1):
	// key k is drawn with probability ∝ 1/(k+1)^s. Zero: uniform.
	ZipfS float64
	// Rate is decisions per second per replica; each replica keeps at
	// most InFlight decisions waiting on Redis (4 by default) and counts
	// the ticks it skips past that.
	Rate     float64
	InFlight int
	Limit    quota.Limit // every key's limit
	// Warmup runs the load before measuring; Duration is the measured
	// load; Idle is how long the heartbeats alone are measured after it.
	Warmup, Duration, Idle time.Duration
	// PoolSize is redis.pool_size (0: the default). Legacy builds each
	// replica's clients as they were before pools were sized for
	// autopipelining (go-redis's default pools, four idle connections
	// dialled at start-up), for comparison.
	PoolSize int
	Legacy   bool
	// MemoryKeys, when set, is how many buckets a last step creates (one
	// decision each, under a limit slow enough that none expires
	// meanwhile) to measure what a key costs Redis.
	MemoryKeys int
}

// Result is what one run measured. Rates are per second of the measured
// phase.
type Result struct {
	Options   Options
	Decisions int64   // made in the measured phase
	Allowed   int64   // of those
	Degraded  int64   // of those, made without Redis
	Skipped   int64   // ticks skipped because InFlight decisions waited
	PerSecond float64 // decisions per second, the whole fleet

	Calls        map[string]int64 // Redis calls by operation, measured phase
	FailedCalls  int64            // of those, failed (timeouts and errors), probes left out
	CallsPerDec  float64          // every call the replicas made ÷ decisions
	DecCallsPer  float64          // calls decisions made (leases, scripts, refunds) ÷ decisions
	CallP50      time.Duration    // Redis call latency seen by the replicas
	CallP99      time.Duration
	CallTimeouts int64

	Commands     float64 // Redis commands per second (INFO total_commands_processed), all masters
	ScriptCalls  float64 // EVALSHA and EVAL per second, all masters
	CPU          float64 // Redis CPU, cores (INFO used_cpu_sys + used_cpu_user), all masters
	BaselineCPU  float64 // the same with no client connected, for comparison
	MaxMasterCPU float64 // the busiest master's
	Clients      int     // connected clients at the end of the load, all masters (the driver's own excluded)
	ClientsIdle  int     // before the load: what the fleet holds open doing nothing
	MemoryPerKey float64 // used_memory growth ÷ keys created by the MemoryKeys step, bytes
	KeyBytes     float64 // MEMORY USAGE of sampled keys, bytes (the value alone)
	Keys         int64   // keys in Redis at the end of the load (buckets expire once full again)

	// DriverCPU is the cores this process (every simulated sidecar, the
	// load and the measuring) used over the measured phase, of
	// runtime.NumCPU: when it nears them the fleet's calls wait on the
	// driver, not on Redis.
	DriverCPU float64

	// Evidence is the machine's and the breakers' side of the measured
	// phase (evidence.go).
	Evidence Evidence

	HeartbeatsPerSec float64 // the whole fleet, idle phase
	HeartbeatCPU     float64 // cores on the master holding the heartbeat set, idle phase
	IdleCommands     float64 // commands per second, all masters, idle phase
	Goroutines       int     // in the driver with the fleet running, for scale
}

// replica is the Redis side of one sidecar.
type replica struct {
	opened  *redisstore.Opened
	limiter quota.Limiter
}

// Run starts the fleet, measures it and stops it.
func Run(ctx context.Context, o Options) (Result, error) {
	if o.Replicas < 1 || o.Keys < 1 || o.Rate <= 0 || len(o.Addrs) == 0 {
		return Result{}, fmt.Errorf("fleet: need replicas, keys, a rate and an address")
	}
	if len(o.Masters) == 0 {
		o.Masters = o.Addrs
	}
	if o.InFlight <= 0 {
		o.InFlight = 4
	}
	if o.Mode == "" {
		o.Mode = "hybrid"
	}
	res := Result{Options: o}
	admins := make([]*redis.Client, len(o.Masters))
	for i, a := range o.Masters {
		admins[i] = redis.NewClient(&redis.Options{Addr: a, PoolSize: 1})
		defer admins[i].Close()
	}
	before0, err := snapshot(ctx, admins)
	if err != nil {
		return res, err
	}
	bstart := time.Now()
	idleWait(ctx, time.Second)
	if b1, err := snapshot(ctx, admins); err == nil {
		res.BaselineCPU = (b1.cpu - before0.cpu) / time.Since(bstart).Seconds()
	}

	m := newMetrics()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	replicas := make([]*replica, 0, o.Replicas)
	defer func() {
		var wg sync.WaitGroup
		for _, r := range replicas {
			wg.Add(1)
			go func() { defer wg.Done(); r.close() }()
		}
		wg.Wait()
	}()
	for i := 0; i < o.Replicas; i++ {
		r, err := newReplica(ctx, o, m, log, i)
		if err != nil {
			return res, fmt.Errorf("fleet: replica %d: %w", i, err)
		}
		replicas = append(replicas, r)
	}
	// Every replica has heartbeated once (NewPeers beats at once); let
	// them hear each other before the load, as a rollout would.
	idleWait(ctx, 2*time.Second)
	idle0, err := snapshot(ctx, admins)
	if err != nil {
		return res, err
	}
	res.ClientsIdle = idle0.clients - before0.clients

	var (
		decisions, allowed, degraded, skipped atomic.Int64
		measuring                             atomic.Bool
		wg                                    sync.WaitGroup
	)
	loadCtx, stopLoad := context.WithCancel(ctx)
	for i, r := range replicas {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r.drive(loadCtx, o, i, &decisions, &allowed, &degraded, &skipped, &measuring)
		}()
	}
	idleWait(ctx, o.Warmup)
	calls0, hist0, failed0 := callsOf(m), histogramOf(m), failedOf(m)
	snap0, err := snapshot(ctx, admins)
	if err != nil {
		stopLoad()
		return res, err
	}
	ev := startEvidence(ctx, admins, m)
	measuring.Store(true)
	start, cpu0 := time.Now(), processCPU()
	idleWait(ctx, o.Duration)
	measuring.Store(false)
	elapsed := time.Since(start)
	res.DriverCPU = (processCPU() - cpu0) / elapsed.Seconds()
	res.Evidence = ev.finish(ctx, admins, m, runtime.NumCPU())
	snap1, err := snapshot(ctx, admins)
	calls1, hist1, failed1 := callsOf(m), histogramOf(m), failedOf(m)
	res.Goroutines = runtime.NumGoroutine()
	stopLoad()
	wg.Wait()
	if err != nil {
		return res, err
	}

	secs := elapsed.Seconds()
	res.Decisions, res.Allowed, res.Degraded, res.Skipped = decisions.Load(), allowed.Load(), degraded.Load(), skipped.Load()
	res.PerSecond = float64(res.Decisions) / secs
	res.FailedCalls = failed1 - failed0
	res.Calls = map[string]int64{}
	var all, dec int64
	for op, n := range calls1 {
		d := n - calls0[op]
		res.Calls[op] = d
		switch op {
		case "probe", "confirm":
		case "peers", "return":
			all += d
		default:
			all, dec = all+d, dec+d
		}
	}
	if res.Decisions > 0 {
		res.CallsPerDec = float64(all) / float64(res.Decisions)
		res.DecCallsPer = float64(dec) / float64(res.Decisions)
	}
	res.CallP50, res.CallP99 = hist1.sub(hist0).quantile(0.5), hist1.sub(hist0).quantile(0.99)
	res.CallTimeouts = timeoutsOf(m) // the whole run
	res.Commands = float64(snap1.commands-snap0.commands) / secs
	res.ScriptCalls = float64(snap1.scripts-snap0.scripts) / secs
	res.CPU = (snap1.cpu - snap0.cpu) / secs
	for i := range snap1.perMaster {
		res.MaxMasterCPU = max(res.MaxMasterCPU, (snap1.perMaster[i].cpu-snap0.perMaster[i].cpu)/secs)
	}
	res.Clients = snap1.clients - before0.clients
	res.Keys = snap1.keys - before0.keys

	// The heartbeats alone: the load has stopped; idle slices go back
	// within a second (slice_idle), then only heartbeats reach Redis.
	idleWait(ctx, 1500*time.Millisecond)
	beats0 := callsOf(m)["peers"]
	i0, err := snapshot(ctx, admins)
	if err != nil {
		return res, err
	}
	istart := time.Now()
	idleWait(ctx, o.Idle)
	i1, err := snapshot(ctx, admins)
	if err != nil {
		return res, err
	}
	isecs := time.Since(istart).Seconds()
	res.HeartbeatsPerSec = float64(callsOf(m)["peers"]-beats0) / isecs
	res.IdleCommands = float64(i1.commands-i0.commands) / isecs
	for j := range i1.perMaster {
		res.HeartbeatCPU = max(res.HeartbeatCPU, (i1.perMaster[j].cpu-i0.perMaster[j].cpu)/isecs)
	}
	if o.MemoryKeys > 0 {
		if err := measureMemory(ctx, o, replicas, admins, &res); err != nil {
			return res, err
		}
	}
	return res, nil
}

// measureMemory creates o.MemoryKeys buckets, one decision each, under 10
// an hour (a spent token takes six minutes to come back, so none expires
// meanwhile), and divides Redis's memory growth by the keys created. The
// fleet's buckets are deleted first: the load's would expire during the
// step, freeing memory and keys the growth would not count, and an
// earlier run's memory buckets on the same server would not be created
// again.
func measureMemory(ctx context.Context, o Options, replicas []*replica, admins []*redis.Client, res *Result) error {
	for _, a := range admins {
		if err := deleteKeys(ctx, a, "rl:{fleet:*"); err != nil {
			return err
		}
	}
	m0, err := snapshot(ctx, admins)
	if err != nil {
		return err
	}
	l := quota.Limit{Limit: 10, Window: time.Hour, OnError: quota.ErrorFallback}
	var next atomic.Int64
	var wg sync.WaitGroup
	for w := 0; w < 16; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := replicas[w%len(replicas)]
			for {
				k := next.Add(1)
				if k > int64(o.MemoryKeys) {
					return
				}
				dctx, cancel := context.WithTimeout(ctx, time.Second)
				r.limiter.Take(dctx, "fleet:memory:"+strconv.FormatInt(k, 10), l, 1, time.Now())
				cancel()
			}
		}()
	}
	wg.Wait()
	m1, err := snapshot(ctx, admins)
	if err != nil {
		return err
	}
	if created := m1.keys - m0.keys; created > 0 {
		res.MemoryPerKey = float64(m1.memory-m0.memory) / float64(created)
	}
	res.KeyBytes = sampleKeyBytes(ctx, admins)
	return nil
}

// deleteKeys deletes the keys matching pattern on one server, a SCAN page
// at a time. DEL, not UNLINK: the memory must be free when it returns.
func deleteKeys(ctx context.Context, a *redis.Client, pattern string) error {
	var cursor uint64
	for {
		keys, next, err := a.Scan(ctx, cursor, pattern, 1000).Result()
		if err != nil {
			return fmt.Errorf("fleet: SCAN on %s: %w", a.Options().Addr, err)
		}
		// One DEL per key: in a Cluster every key may be in its own slot.
		pipe := a.Pipeline()
		for _, k := range keys {
			pipe.Del(ctx, k)
		}
		if _, err := pipe.Exec(ctx); err != nil && len(keys) > 0 {
			return fmt.Errorf("fleet: DEL on %s: %w", a.Options().Addr, err)
		}
		if cursor = next; cursor == 0 {
			return nil
		}
	}
}

// newReplica wires one replica with redisstore.Open, as the sidecar does.
func newReplica(ctx context.Context, o Options, m *redisstore.Metrics, log *slog.Logger, i int) (*replica, error) {
	var pipe *redis.AutoPipeliner
	var closeConn func() error
	sopts := redisstore.StoreOptions{Prefix: "rl:", Metrics: m, Log: log}
	if o.Legacy {
		p, probe, closers, err := legacyClients(o.Addrs)
		if err != nil {
			return nil, err
		}
		pipe = p
		closeConn = func() error {
			for _, c := range closers {
				c.Close()
			}
			return nil
		}
		sopts.Probe = probe
	} else {
		c, err := redisstore.NewClients(redisstore.ClientOptions{Addrs: o.Addrs, PoolSize: o.PoolSize, Name: "extauthz"})
		if err != nil {
			return nil, err
		}
		pipe, closeConn = c.Pipe, c.Close
		sopts = c.StoreOptions(sopts)
	}
	counts, err := local.NewTable(100_000)
	if err != nil {
		closeConn()
		return nil, err
	}
	opened, err := redisstore.Open(pipe, closeConn, redisstore.OpenOptions{
		Store:   sopts,
		MaxKeys: 100_000,
		Counts:  counts,
		Warm: func(store *redisstore.Store) error {
			wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			if err := store.Warm(wctx); err != nil {
				return fmt.Errorf("loading scripts: %w", err)
			}
			return nil
		},
		ReplicaID: "fleet-" + strconv.Itoa(i),
		PeerTTL:   15 * time.Second,
		MinPeers:  2,
		Hybrid:    redisstore.HybridOptions{Log: log},
	})
	if err != nil {
		return nil, err
	}
	r := &replica{opened: opened, limiter: opened.Hybrid}
	if o.Mode == "redis" {
		r.limiter = opened.Redis
	}
	return r, nil
}

// legacyClients are the clients as cmd/extauthz built them before pools
// were sized for autopipelining: go-redis's default pool sizes (ten per
// CPU, a pipeline pool of ten), four idle connections dialled at start.
func legacyClients(addrs []string) (*redis.AutoPipeliner, redis.UniversalClient, []io.Closer, error) {
	opts := &redis.UniversalOptions{
		Addrs: addrs, DialTimeout: 750 * time.Millisecond, DialerRetries: 1,
		ReadTimeout: redisstore.DefaultTimeout, WriteTimeout: redisstore.DefaultTimeout,
		ContextTimeoutEnabled: true, MaxRetries: -1, MinRetryBackoff: -1, MaxRetryBackoff: -1,
		MinIdleConns: 4, ClientName: "extauthz",
	}
	client := redis.NewUniversalClient(opts)
	probeOpts := *opts
	probeOpts.PoolSize, probeOpts.MinIdleConns, probeOpts.ClientName = 1, 0, "extauthz-probe"
	probe := redis.NewUniversalClient(&probeOpts)
	pipe, err := client.AutoPipeline()
	if err != nil {
		client.Close()
		probe.Close()
		return nil, nil, nil, err
	}
	return pipe, probe, []io.Closer{pipe, probe, client}, nil
}

func (r *replica) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	r.opened.Close(ctx)
}

// drive decides at o.Rate until ctx ends, counting decisions made while
// measuring is set.
func (r *replica) drive(ctx context.Context, o Options, i int, decisions, allowed, degraded, skipped *atomic.Int64, measuring *atomic.Bool) {
	rng := rand.New(rand.NewPCG(uint64(i), 42))
	next := keyPicker(rng, o)
	period := time.Duration(float64(time.Second) / o.Rate)
	// Replicas start out of phase, as real ones do.
	timer := time.NewTimer(time.Duration(rng.Int64N(int64(period))))
	defer timer.Stop()
	sem := make(chan struct{}, o.InFlight)
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		}
		timer.Reset(period)
		select {
		case sem <- struct{}{}:
		default:
			if measuring.Load() {
				skipped.Add(1)
			}
			continue
		}
		key := "fleet:k" + strconv.Itoa(next())
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			// Envoy's ext_authz timeout, 200ms, arrives as the deadline.
			dctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
			d, err := r.limiter.Take(dctx, key, o.Limit, 1, time.Now())
			cancel()
			if err != nil || !measuring.Load() {
				return
			}
			decisions.Add(1)
			if d.Allowed {
				allowed.Add(1)
			}
			if d.Degraded != quota.NotDegraded {
				degraded.Add(1)
			}
		}()
	}
}

// keyPicker draws key indexes from o's distribution.
func keyPicker(rng *rand.Rand, o Options) func() int {
	if o.ZipfS > 1 {
		z := rand.NewZipf(rng, o.ZipfS, 1, uint64(o.Keys-1))
		return func() int { return int(z.Uint64()) }
	}
	return func() int { return rng.IntN(o.Keys) }
}

// processCPU is the CPU time this process has used, user and system, in
// seconds.
func processCPU() float64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()).Seconds()
}

// idleWait waits d or until ctx ends. The fleet runs on real time:
// waiting is the point.
func idleWait(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// newMetrics are the replicas' collectors, shared by the whole fleet, with
// finer latency buckets than the sidecar exports (50µs to 1s).
func newMetrics() *redisstore.Metrics {
	m := redisstore.NewMetrics(nil)
	m.Duration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "fleet_redis_call_duration_seconds",
		Buckets: prometheus.ExponentialBuckets(50e-6, 1.25, 57),
	}, []string{"op"})
	return m
}

// hist is a snapshot of the call latency histogram, every operation.
type hist struct {
	bounds []float64
	counts []uint64 // cumulative
}

func histogramOf(m *redisstore.Metrics) hist {
	ch := make(chan prometheus.Metric, 64)
	go func() { m.Duration.Collect(ch); close(ch) }()
	var h hist
	for pm := range ch {
		var d dto.Metric
		pm.Write(&d)
		// Operations other than decisions' and heartbeats' (probes) are
		// few; every call counts.
		for i, b := range d.GetHistogram().GetBucket() {
			if len(h.bounds) <= i {
				h.bounds = append(h.bounds, b.GetUpperBound())
				h.counts = append(h.counts, 0)
			}
			h.counts[i] += b.GetCumulativeCount()
		}
	}
	return h
}

func (h hist) sub(o hist) hist {
	out := hist{bounds: h.bounds, counts: slices.Clone(h.counts)}
	for i := range out.counts {
		if i < len(o.counts) {
			out.counts[i] -= o.counts[i]
		}
	}
	return out
}

// quantile interpolates within the bucket holding q.
func (h hist) quantile(q float64) time.Duration {
	if len(h.counts) == 0 || h.counts[len(h.counts)-1] == 0 {
		return 0
	}
	total := float64(h.counts[len(h.counts)-1])
	rank := q * total
	lower, below := 0.0, 0.0
	for i, c := range h.counts {
		if float64(c) >= rank {
			frac := 0.0
			if n := float64(c) - below; n > 0 {
				frac = (rank - below) / n
			}
			return time.Duration((lower + frac*(h.bounds[i]-lower)) * float64(time.Second))
		}
		lower, below = h.bounds[i], float64(c)
	}
	return time.Duration(h.bounds[len(h.bounds)-1] * float64(time.Second))
}

func callsOf(m *redisstore.Metrics) map[string]int64 {
	out := map[string]int64{}
	eachCall(m, func(op, result string, n float64) {
		if result != "canceled" && result != "abandoned" {
			out[op] += int64(n)
		}
	})
	return out
}

// timeoutsOf and failedOf count calls that timed out, and that failed in
// any way, probes left out.
func timeoutsOf(m *redisstore.Metrics) int64 { return countResults(m, "timeout") }
func failedOf(m *redisstore.Metrics) int64   { return countResults(m, "timeout", "error") }

func countResults(m *redisstore.Metrics, results ...string) int64 {
	var total float64
	eachCall(m, func(op, result string, n float64) {
		if op != "probe" && op != "confirm" && slices.Contains(results, result) {
			total += n
		}
	})
	return int64(total)
}

// eachCall calls f with every series of m's Redis call counter.
func eachCall(m *redisstore.Metrics, f func(op, result string, n float64)) {
	ch := make(chan prometheus.Metric, 256)
	go func() { m.Calls.Collect(ch); close(ch) }()
	for pm := range ch {
		var d dto.Metric
		pm.Write(&d)
		var op, result string
		for _, l := range d.GetLabel() {
			switch l.GetName() {
			case "op":
				op = l.GetValue()
			case "result":
				result = l.GetValue()
			}
		}
		f(op, result, d.GetCounter().GetValue())
	}
}

// masterStats are one master's INFO figures.
type masterStats struct {
	commands, scripts, keys, memory int64
	clients                         int
	cpu                             float64 // seconds
}

// fleetSnapshot sums the masters.
type fleetSnapshot struct {
	masterStats
	perMaster []masterStats
}

func snapshot(ctx context.Context, admins []*redis.Client) (fleetSnapshot, error) {
	var s fleetSnapshot
	for _, a := range admins {
		info, err := a.Info(ctx, "stats", "cpu", "clients", "memory", "commandstats", "keyspace").Result()
		if err != nil {
			return s, fmt.Errorf("fleet: INFO from %s: %w", a.Options().Addr, err)
		}
		ms := parseInfo(info)
		ms.clients-- // the driver's own
		s.perMaster = append(s.perMaster, ms)
		s.commands += ms.commands
		s.scripts += ms.scripts
		s.keys += ms.keys
		s.memory += ms.memory
		s.clients += ms.clients
		s.cpu += ms.cpu
	}
	return s, nil
}

func parseInfo(info string) masterStats {
	var ms masterStats
	for _, line := range strings.Split(info, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok {
			continue
		}
		switch {
		case k == "total_commands_processed":
			ms.commands, _ = strconv.ParseInt(v, 10, 64)
		case k == "connected_clients":
			ms.clients, _ = strconv.Atoi(v)
		case k == "used_memory":
			ms.memory, _ = strconv.ParseInt(v, 10, 64)
		case k == "used_cpu_sys" || k == "used_cpu_user":
			f, _ := strconv.ParseFloat(v, 64)
			ms.cpu += f
		case k == "cmdstat_evalsha" || k == "cmdstat_eval":
			for _, kv := range strings.Split(v, ",") {
				if n, ok := strings.CutPrefix(kv, "calls="); ok {
					c, _ := strconv.ParseInt(n, 10, 64)
					ms.scripts += c
				}
			}
		case strings.HasPrefix(k, "db"):
			// db0:keys=12,expires=12,avg_ttl=0
			for _, kv := range strings.Split(v, ",") {
				if n, ok := strings.CutPrefix(kv, "keys="); ok {
					c, _ := strconv.ParseInt(n, 10, 64)
					ms.keys += c
				}
			}
		}
	}
	return ms
}

// sampleKeyBytes averages MEMORY USAGE over up to 100 random bucket keys.
func sampleKeyBytes(ctx context.Context, admins []*redis.Client) float64 {
	var total, n float64
	for _, a := range admins {
		for i := 0; i < 100/len(admins)+1; i++ {
			k, err := a.RandomKey(ctx).Result()
			if err != nil || !strings.HasPrefix(k, "rl:{fleet:") {
				continue
			}
			b, err := a.MemoryUsage(ctx, k).Result()
			if err == nil {
				total, n = total+float64(b), n+1
			}
		}
	}
	if n == 0 {
		return math.NaN()
	}
	return total / n
}
