// Command demo tells the whole story in one command (`make demo`): it
// starts a redis-server and three replicas of the real extauthz binary on
// loopback, sends each scenario 600 requests round robin, and prints what
// was admitted: the seed scenario (each replica counting alone, a shared
// Redis bucket, leased slices, and a naive GET-then-INCR limiter racing
// itself) beside every algorithm. A second table replays the boundary
// burst with injected time, through the same Go code and Lua scripts the
// sidecar runs.
//
//	go run ./tests/demo [-bin bin/extauthz]
//
// It needs redis-server on PATH (`make redis-server` installs it) and
// finishes within a few minutes at most; everything listens on 127.0.0.1.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"text/tabwriter"
	"time"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"github.com/redis/go-redis/v9"

	"github.com/extauthz/extauthz/internal/check"
	"github.com/extauthz/extauthz/internal/config"
	"github.com/extauthz/extauthz/internal/quota"
	"github.com/extauthz/extauthz/internal/quota/local"
	"github.com/extauthz/extauthz/internal/quota/redisstore"
	"github.com/extauthz/extauthz/tests/internal/loadgen"
	"github.com/extauthz/extauthz/tests/internal/testredis"
)

const requests = 600

func main() {
	bin := flag.String("bin", "", "extauthz binary (default: build ./cmd/extauthz into a temporary directory)")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	if err := run(ctx, *bin); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

// scenario is one row of the main table: a policy of the replicas'
// configuration, reached through its path.
type scenario struct {
	title, mode, algorithm, limit string
	policy                        string // its name and path prefix
	expect                        string
}

var scenarios = []scenario{
	{"seed: each replica counts alone", "local", "token_bucket", "100/1m", "local-token-bucket", "300 (3 × 100)"},
	{"seed: one bucket in Redis", "redis", "token_bucket", "100/1m", "redis-token-bucket", "100"},
	{"seed: slices leased from Redis", "hybrid", "token_bucket", "100/1m", "hybrid-token-bucket", "100"},
	{"weighted two windows", "redis", "sliding_window", "100/1m", "redis-sliding-window", "100"},
	{"one counter per window", "redis", "fixed_window", "100/1m", "redis-fixed-window", "100"},
	{"exact log", "redis", "sliding_log", "100/1m", "redis-sliding-log", "100"},
	{"shaping: OKs held to 1 per 100ms", "redis", "leaky_bucket", "100/10s", "redis-leaky-bucket", "2 + 1 per 100ms"},
}

// replicaConfig is the configuration every replica runs: one policy per
// scenario, and the shipped defaults for everything else.
func replicaConfig(redisAddr string) string {
	var b strings.Builder
	fmt.Fprintf(&b, `listen: {grpc: 127.0.0.1:0, admin: 127.0.0.1:0}
redis: {addrs: [%s]}
default_mode: redis
clients:
  keys:
    - {id: ada, key: key-ada}
    - {id: bob, key: key-bob}
policies:
`, redisAddr)
	for _, s := range scenarios {
		limit, window, _ := strings.Cut(s.limit, "/")
		extra := ""
		if s.algorithm == "leaky_bucket" {
			extra = ", max_delay: 150ms"
		}
		fmt.Fprintf(&b, "  - {name: %s, match: {path_prefix: /%s}, key: [client], limit: %s, window: %s, mode: %s, algorithm: %s%s}\n",
			s.policy, s.policy, limit, window, s.mode, s.algorithm, extra)
	}
	return b.String()
}

func run(ctx context.Context, bin string) error {
	dir, err := os.MkdirTemp("", "extauthz-demo-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	if bin == "" {
		bin = filepath.Join(dir, "extauthz")
		fmt.Println("building extauthz ...")
		cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, "./cmd/extauthz")
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
		if err := cmd.Run(); err != nil {
			return fmt.Errorf("go build ./cmd/extauthz (run from the repository root): %w", err)
		}
	}

	rp, err := testredis.StartDetached(dir)
	if err != nil {
		return err
	}
	defer rp.Stop()
	addr := rp.Addr
	var replicas []*replica
	defer func() {
		for _, r := range replicas {
			r.Stop()
		}
	}()
	cfg := replicaConfig(addr)
	for i := 0; i < 3; i++ {
		r, err := startReplica(bin, dir, i, cfg)
		if err != nil {
			return err
		}
		replicas = append(replicas, r)
	}
	// Hybrid slices are sized for the replica count: wait until every
	// replica has heard the others (heartbeats run once a second).
	deadline := time.Now().Add(15 * time.Second)
	for _, r := range replicas {
		for r.peers(ctx) != 3 {
			if time.Now().After(deadline) || ctx.Err() != nil {
				return fmt.Errorf("replicas did not see each other through Redis within 15s")
			}
			time.Sleep(50 * time.Millisecond) // polling the replicas' heartbeats
		}
	}
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	defer rdb.Close()
	var targets []string
	for _, r := range replicas {
		targets = append(targets, r.Addr)
	}
	fmt.Printf("redis-server %s, extauthz replicas %s\n\n", addr, strings.Join(targets, " "))

	fmt.Printf("%d requests, round robin over 3 replicas sharing one Redis; each column a fresh API key\n\n", requests)
	tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "scenario\tmode\talgorithm\tlimit\t32 in parallel\t600 at once\texpected")
	for _, s := range scenarios {
		var cells []string
		for _, c := range []struct {
			workers int
			key     string
		}{{32, "key-ada"}, {requests, "key-bob"}} {
			if strings.Contains(s.algorithm, "window") {
				waitClearOfMinute(ctx, rdb)
			}
			res, err := loadgen.Run(ctx, loadgen.Options{
				Targets: targets, Requests: requests, Concurrency: c.workers, MaxDuration: time.Minute,
				Request: fixedRequest("/"+s.policy+"/orders", c.key),
			})
			if err != nil {
				return fmt.Errorf("%s: %w", s.title, err)
			}
			if res.GRPCErrors > 0 {
				return fmt.Errorf("%s: %d gRPC errors; first: %s", s.title, res.GRPCErrors, res.FirstError)
			}
			cell := fmt.Sprintf("%d in %v", res.Statuses["200"], res.Elapsed.Round(time.Millisecond))
			if s.algorithm == "leaky_bucket" {
				cell += fmt.Sprintf(", slowest answer %v", res.Max.Round(time.Millisecond))
			}
			cells = append(cells, cell)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", s.title, s.mode, s.algorithm, s.limit, cells[0], cells[1], s.expect)
	}
	n32, d32, err := naiveRace(ctx, addr, "naive:ada", 32)
	if err != nil {
		return err
	}
	nAll, dAll, err := naiveRace(ctx, addr, "naive:bob", requests)
	if err != nil {
		return err
	}
	fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d in %v\t%d in %v\t%s\n", "naive GET then INCR (the race)", "-", "-", "100", n32, d32.Round(time.Millisecond), nAll, dAll.Round(time.Millisecond), "over 100")
	tw.Flush()
	fmt.Print(`
local counts per replica: 3 × 100. redis and hybrid count once, atomically, for
all replicas, however many requests arrive at once. The naive limiter reads
the count, then increments it in a second call: every request in between reads
the same count and passes, so the more arrive together, the more pass. A token
bucket refills one token per 600ms, so a run lasting longer may admit one more.
The leaky bucket admits 1 + max_delay/interval at once, then one per interval,
holding each OK until its slot (at most max_delay, 150ms, plus the Check's own
time).
`)

	return boundaryBurst(rdb)
}

// waitClearOfMinute waits, if Redis TIME is in the last 5s of a minute,
// for the next minute: a 1m window that turned during a run would
// legitimately admit a second batch, and this table is about one window.
func waitClearOfMinute(ctx context.Context, rdb *redis.Client) {
	now, err := rdb.Time(ctx).Result()
	if err != nil {
		return
	}
	if left := now.Truncate(time.Minute).Add(time.Minute).Sub(now); left < 5*time.Second {
		select {
		case <-time.After(left + 100*time.Millisecond):
		case <-ctx.Done():
		}
	}
}

func fixedRequest(path, key string) func(int) *authv3.CheckRequest {
	req := check.NewRequest(check.RequestSpec{Method: "POST", Path: path, Headers: map[string]string{"x-api-key": key}})
	return func(int) *authv3.CheckRequest { return req }
}

// naiveRace is the limiter the scripts replace: three replicas (clients),
// each reading the count with GET and, below the limit, admitting and
// counting with INCR. workers requests are in flight at once. Connections
// are opened first and the workers start together, as a burst meets
// replicas that are already connected.
func naiveRace(ctx context.Context, addr, key string, workers int) (int64, time.Duration, error) {
	var clients []*redis.Client
	for i := 0; i < 3; i++ {
		c := redis.NewClient(&redis.Options{Addr: addr, PoolSize: workers})
		defer c.Close()
		clients = append(clients, c)
	}
	var warm sync.WaitGroup
	for w := 0; w < workers; w++ {
		warm.Add(1)
		go func() { defer warm.Done(); clients[w%3].Ping(ctx) }()
	}
	warm.Wait()
	var admitted, next atomic.Int64
	var firstErr atomic.Pointer[error]
	var wg sync.WaitGroup
	gate := make(chan struct{})
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-gate
			for {
				i := next.Add(1) - 1
				if i >= requests || ctx.Err() != nil {
					return
				}
				c := clients[i%3]
				n, err := c.Get(ctx, key).Int64()
				if err != nil && err != redis.Nil {
					firstErr.CompareAndSwap(nil, &err)
					return
				}
				if n < 100 {
					c.Incr(ctx, key)
					admitted.Add(1)
				}
			}
		}()
	}
	start := time.Now()
	close(gate)
	wg.Wait()
	if e := firstErr.Load(); e != nil {
		return 0, 0, fmt.Errorf("naive limiter: %w", *e)
	}
	return admitted.Load(), time.Since(start), ctx.Err()
}

// fakeClock is the injected time of the boundary-burst replay.
type fakeClock struct{ ns atomic.Int64 }

func (c *fakeClock) Now() time.Time     { return time.Unix(0, c.ns.Load()) }
func (c *fakeClock) Set(t time.Time)    { c.ns.Store(t.UnixNano()) }
func (c *fakeClock) At(d time.Duration) { c.Set(burstStart.Add(d)) }

// burstStart is on a minute: second 60 of the replay is a window boundary.
var burstStart = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// boundaryBurst replays the published boundary-burst numbers with injected
// time: 100 requests at second 59.9, 100 at 60.1, 100 at 90, limit 100
// per minute, in local mode (the Go algorithms) and redis mode (the Lua
// scripts on the demo's Redis, StoreOptions.Clock standing in for TIME).
func boundaryBurst(rdb *redis.Client) error {
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	clk := &fakeClock{}
	counts, err := local.NewTable(1000)
	if err != nil {
		return err
	}
	// The limiters production wires (redisstore.Open, as internal/sidecar
	// calls it at the shipped defaults), over the demo's Redis, with
	// StoreOptions.Clock and the hybrid sweeper's clock standing in for
	// the wall clock.
	cfg := config.Default()
	opened, err := redisstore.Open(rdb, nil, redisstore.OpenOptions{
		Store:     redisstore.StoreOptions{Prefix: "demo:", Timeout: config.DefaultTimeout, Log: quiet, Clock: clk.Now},
		MaxKeys:   cfg.Local.MaxKeys,
		Counts:    counts,
		ReplicaID: "demo",
		PeerTTL:   cfg.Fallback.PeerTTL,
		MinPeers:  1, // the demo's one process: its fallback would be the whole limit
		Hybrid:    redisstore.HybridOptions{SliceIdle: cfg.Local.SliceIdle, LeaseTTL: cfg.Local.LeaseTTL, Log: quiet, Now: clk.Now},
	})
	if err != nil {
		return err
	}
	defer opened.Close(context.Background())
	limiters := []struct {
		name string
		lim  quota.Limiter
	}{{"local", local.New(counts)}, {"redis", opened.Redis}, {"hybrid", opened.Hybrid}}
	ctx := context.Background()
	burst := func(lim quota.Limiter, key string, l quota.Limit, n int) (int, quota.Decision, error) {
		admitted, first, rejected := 0, quota.Decision{}, false
		for i := 0; i < n; i++ {
			d, err := lim.Take(ctx, key, l, 1, clk.Now())
			if err != nil {
				return 0, d, err
			}
			if d.Allowed {
				admitted++
			} else if !rejected {
				first, rejected = d, true
			}
		}
		return admitted, first, nil
	}

	fmt.Print("\nBoundary burst, injected time: limit 100/min; 100 requests at 59.9s, 100 at 60.1s (a new window), 100 at 90s\n\n")
	tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "mode\talgorithm\tat 59.9\tat 60.1\ttotal\tnext wait\tRetry-After\tat 90\t")
	for _, lm := range limiters {
		for _, a := range []quota.Algorithm{quota.TokenBucket, quota.SlidingWindow, quota.FixedWindow, quota.SlidingLog, quota.LeakyBucket} {
			l := quota.Limit{Algorithm: a, Limit: 100, Window: time.Minute, Queue: -1, MaxDelay: 100 * time.Millisecond}
			key := lm.name + ":burst:" + a.String() // redis and hybrid modes share keys: one bucket
			clk.At(59900 * time.Millisecond)
			n1, _, err := burst(lm.lim, key, l, 100)
			if err != nil {
				return err
			}
			clk.At(60100 * time.Millisecond)
			n2, first, err := burst(lm.lim, key, l, 101) // one more: a fixed window's 201st is rejected
			if err != nil {
				return err
			}
			clk.At(90 * time.Second)
			n3, _, err := burst(lm.lim, key, l, 100)
			if err != nil {
				return err
			}
			retry := max(int64(math.Ceil(first.RetryAfter.Seconds())), 1)
			fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%v\t%d\t%d\t\n", lm.name, a, n1, n2, n1+n2, first.RetryAfter.Round(time.Millisecond), retry, n3)
		}
	}
	tw.Flush()

	// The formula check: 70 at second 30, then as many as fit at 75.
	fmt.Print("\nsliding_window, 70 requests at 30s, then as many as fit at 75s (15s into the next window):\n")
	weighted := 70 * 45.0 / 60.0
	want := int(math.Floor(100 - weighted))
	for _, lm := range limiters {
		l := quota.Limit{Algorithm: quota.SlidingWindow, Limit: 100, Window: time.Minute}
		clk.At(30 * time.Second)
		if _, _, err := burst(lm.lim, lm.name+":formula", l, 70); err != nil {
			return err
		}
		clk.At(75 * time.Second)
		n, first, err := burst(lm.lim, lm.name+":formula", l, 100)
		if err != nil {
			return err
		}
		fmt.Printf("  %-5s admitted %d; formula ⌊100 − 70 × 45/60⌋ = ⌊100 − %.1f⌋ = %d; next wait %v\n",
			lm.name, n, weighted, want, first.RetryAfter.Round(time.Microsecond))
	}
	return nil
}
