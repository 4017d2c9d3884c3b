package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/extauthz/extauthz/tests/internal/envoyrlqs"
	"github.com/extauthz/extauthz/tests/internal/testredis"
)

// The rate limit quota service row (make bench-rlqs, or -rlqs): 10
// simulated Envoys (tests/internal/envoyrlqs, enforcing assignments as
// Envoy's filter does, reporting every second) with 1,000 buckets each,
// one tenant a bucket, every tenant's limit far above its load, against
// one hybrid sidecar and one Redis; beside it, in the same run, Check on
// the same 10,000 tenants of the same policy, driven by 32 workers. Each
// row gives the sidecar's and Redis's CPU and the Redis script calls per
// 1,000 admitted requests, over a measured window after a warm-up.

const (
	rlqsEnvoys      = 10
	rlqsBuckets     = 1000
	rlqsPerBucket   = 2 // requests a second offered to each bucket
	rlqsWarmup      = 5 * time.Second
	rlqsMeasure     = 15 * time.Second
	rlqsCheckWorker = 32
)

const rlqsBenchConfig = `listen: {grpc: 127.0.0.1:0, admin: 127.0.0.1:0}
redis: {addrs: [%s]}
default_mode: hybrid
policies:
  - {name: bench, key: ["header:x-tenant"], limit: 1000000, window: 1m}
rlqs:
  domains:
    - name: bench
      buckets: [{match: {name: bench}, policy: bench, key: [tenant]}]
`

// rlqsRow is one measured row.
type rlqsRow struct {
	name      string
	admitted  int64
	cpu       time.Duration
	calls     int64
	perSecond float64
}

func runRLQS() error {
	dir, err := os.MkdirTemp("", "extauthz-bench-rlqs-")
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
	var rows []rlqsRow
	for _, measure := range []func(string, string, *testredis.Proc, *redis.Client) (rlqsRow, error){measureRLQSRow, measureCheckRow} {
		rds, err := testredis.StartDetached(dir)
		if err != nil {
			return err
		}
		rdb := redis.NewClient(&redis.Options{Addr: rds.Addr})
		row, err := measure(dir, bin, rds, rdb)
		rdb.Close()
		rds.Stop()
		if err != nil {
			return err
		}
		rows = append(rows, row)
	}
	fmt.Printf("\n%d Envoys × %d buckets (RLQS) beside Check on the same %d tenants; hybrid, one sidecar, %s measured after %s\n",
		rlqsEnvoys, rlqsBuckets, rlqsEnvoys*rlqsBuckets, rlqsMeasure, rlqsWarmup)
	fmt.Printf("%-34s %12s %14s %22s %26s\n", "row", "admitted", "admitted/s", "CPU per 1,000 admitted", "Redis calls per 1,000")
	for _, r := range rows {
		fmt.Printf("%-34s %12d %14.0f %22s %26.2f\n", r.name, r.admitted, r.perSecond,
			fmt.Sprintf("%.2fms", float64(r.cpu)*1000/float64(r.admitted)/float64(time.Millisecond)),
			float64(r.calls)*1000/float64(r.admitted))
	}
	return nil
}

// window runs the load for warm-up plus measure and returns what was
// admitted, the CPU the sidecar and Redis spent, and the script calls
// Redis served, over the measured part only.
func window(ctx context.Context, sc, rds *testredis.Proc, rdb *redis.Client, admitted *atomic.Int64, load func(stop <-chan struct{})) (rlqsRow, error) {
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() { load(stop) })
	time.Sleep(rlqsWarmup) // load generation runs meanwhile; this paces the run, nothing waits on it
	meter := cpuMeter{sc, rds}
	cpu0, err := meter.read()
	if err != nil {
		close(stop)
		wg.Wait()
		return rlqsRow{}, err
	}
	calls0, n0, t0 := scriptCalls(ctx, rdb), admitted.Load(), time.Now()
	time.Sleep(rlqsMeasure)
	cpu1, err := meter.read()
	calls1, n1, el := scriptCalls(ctx, rdb), admitted.Load(), time.Since(t0)
	close(stop)
	wg.Wait()
	if err != nil {
		return rlqsRow{}, err
	}
	if n1 == n0 {
		return rlqsRow{}, fmt.Errorf("bench: nothing admitted in the measured window")
	}
	return rlqsRow{admitted: n1 - n0, cpu: cpu1 - cpu0, calls: calls1 - calls0, perSecond: float64(n1-n0) / el.Seconds()}, nil
}

func measureRLQSRow(dir, bin string, rds *testredis.Proc, rdb *redis.Client) (rlqsRow, error) {
	sc, err := startSidecar(dir, "rlqs", bin, fmt.Sprintf(rlqsBenchConfig, rds.Addr))
	if err != nil {
		return rlqsRow{}, err
	}
	defer sc.Stop()
	var admitted atomic.Int64
	load := func(stop <-chan struct{}) {
		var wg sync.WaitGroup
		for e := 0; e < rlqsEnvoys; e++ {
			wg.Go(func() {
				conn, err := grpc.NewClient("passthrough:///"+sc.Addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
				if err != nil {
					return
				}
				defer conn.Close()
				f := envoyrlqs.New(conn, envoyrlqs.Options{Domain: "bench", ReportingInterval: time.Second, NoAssignmentDeny: true})
				defer f.Close()
				ids := make([]map[string]string, rlqsBuckets)
				for i := range ids {
					ids[i] = map[string]string{"name": "bench", "tenant": fmt.Sprintf("e%d-t%d", e, i)}
				}
				tick := time.NewTicker(time.Second / rlqsPerBucket)
				defer tick.Stop()
				for {
					select {
					case <-stop:
						return
					case <-tick.C:
					}
					for _, id := range ids {
						if f.Request(id) {
							admitted.Add(1)
						}
					}
				}
			})
		}
		wg.Wait()
	}
	row, err := window(context.Background(), sc, rds, rdb, &admitted, load)
	row.name = "RLQS, hybrid (10 Envoys)"
	return row, err
}

func measureCheckRow(dir, bin string, rds *testredis.Proc, rdb *redis.Client) (rlqsRow, error) {
	sc, err := startSidecar(dir, "check", bin, fmt.Sprintf(rlqsBenchConfig, rds.Addr))
	if err != nil {
		return rlqsRow{}, err
	}
	defer sc.Stop()
	conn, err := grpc.NewClient("passthrough:///"+sc.Addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return rlqsRow{}, err
	}
	defer conn.Close()
	client := authv3.NewAuthorizationClient(conn)
	var admitted, next atomic.Int64
	load := func(stop <-chan struct{}) {
		var wg sync.WaitGroup
		for w := 0; w < rlqsCheckWorker; w++ {
			wg.Go(func() {
				for {
					select {
					case <-stop:
						return
					default:
					}
					i := next.Add(1)
					tenant := fmt.Sprintf("e%d-t%d", i%rlqsEnvoys, (i/rlqsEnvoys)%rlqsBuckets)
					req := &authv3.CheckRequest{Attributes: &authv3.AttributeContext{
						Source: &authv3.AttributeContext_Peer{Address: &corev3.Address{Address: &corev3.Address_SocketAddress{SocketAddress: &corev3.SocketAddress{Address: "10.1.2.3"}}}},
						Request: &authv3.AttributeContext_Request{Http: &authv3.AttributeContext_HttpRequest{
							Method: "GET", Path: "/orders", Host: "api.example.com",
							Headers: map[string]string{":method": "GET", ":path": "/orders", "x-tenant": tenant},
						}},
					}}
					resp, err := client.Check(context.Background(), req)
					if err == nil && resp.GetStatus().GetCode() == 0 {
						admitted.Add(1)
					}
				}
			})
		}
		wg.Wait()
	}
	row, err := window(context.Background(), sc, rds, rdb, &admitted, load)
	row.name = "Check, hybrid (32 workers)"
	return row, err
}
