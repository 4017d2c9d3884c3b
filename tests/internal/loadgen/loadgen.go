// Package loadgen drives Check calls at a gRPC Authorization server (or
// ShouldRateLimit calls at a rate limit service): a fixed number of
// requests from a fixed number of workers, round robin over the targets,
// bounded in count and time. Benchmarks and the end-to-end tests
// that need a realistic rate use it through tests/loadgen, built without
// the race detector. It decodes of each response only the status it
// counts (codec.go says why).
package loadgen

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
)

// Options describes one run.
type Options struct {
	Targets     []string      // gRPC addresses, host:port
	Requests    int           // total requests (ignored when Duration is set)
	Concurrency int           // workers
	MaxDuration time.Duration // stop early after this long (0: 2 minutes)
	// Duration, when set, runs for this long instead of a count of
	// requests: each worker stops once it has passed.
	Duration time.Duration
	// Request builds request i. It must be safe for concurrent use.
	Request func(i int) *authv3.CheckRequest
	// RateLimit, when set instead of Request, builds request i of Envoy's
	// rate limit service (envoy.service.ratelimit.v3): OK counts as the
	// 200 Envoy lets through, OVER_LIMIT as its 429.
	RateLimit func(i int) *rlsv3.RateLimitRequest
	// ConnsPerTarget opens several HTTP/2 connections per target, as Envoy
	// does with several worker threads (default 1).
	ConnsPerTarget int
}

// Result summarises a run.
type Result struct {
	Requests   int            `json:"requests"`
	Elapsed    time.Duration  `json:"elapsed_ns"`
	Statuses   map[string]int `json:"statuses"` // HTTP status Envoy would send, as text
	GRPCErrors int            `json:"grpc_errors"`
	FirstError string         `json:"first_error,omitempty"`
	P50        time.Duration  `json:"p50_ns"`
	P99        time.Duration  `json:"p99_ns"`
	Max        time.Duration  `json:"max_ns"`
	Throughput float64        `json:"throughput_rps"`
	// PerTarget counts allowed (200) responses by target index.
	AllowedPerTarget []int `json:"allowed_per_target"`
}

// Run performs the run described by o.
func Run(ctx context.Context, o Options) (Result, error) {
	if o.Concurrency < 1 || (o.Requests < 1 && o.Duration <= 0) || len(o.Targets) == 0 || (o.Request == nil) == (o.RateLimit == nil) {
		return Result{}, fmt.Errorf("loadgen: need targets, requests, concurrency and one request builder")
	}
	if o.MaxDuration <= 0 {
		o.MaxDuration = 2 * time.Minute
	}
	if o.Duration > 0 {
		o.MaxDuration = max(o.MaxDuration, o.Duration+time.Minute)
	}
	if o.ConnsPerTarget < 1 {
		o.ConnsPerTarget = 1
	}
	var clients [][]caller
	for _, t := range o.Targets {
		var cs []caller
		for i := 0; i < o.ConnsPerTarget; i++ {
			conn, err := grpc.NewClient("passthrough:///"+t, grpc.WithTransportCredentials(insecure.NewCredentials()),
				grpc.WithDefaultCallOptions(grpc.ForceCodecV2(newStatusCodec())))
			if err != nil {
				return Result{}, err
			}
			defer conn.Close()
			if o.RateLimit != nil {
				cs = append(cs, rateLimitCaller{rlsv3.NewRateLimitServiceClient(conn), o.RateLimit})
			} else {
				cs = append(cs, checkCaller{authv3.NewAuthorizationClient(conn), o.Request})
			}
		}
		clients = append(clients, cs)
	}
	ctx, cancel := context.WithTimeout(ctx, o.MaxDuration)
	defer cancel()

	var samples []sample
	var elapsed time.Duration
	if o.Duration > 0 {
		samples, elapsed = runFor(ctx, o, clients)
	} else {
		samples = make([]sample, o.Requests)
		var next atomic.Int64
		var wg sync.WaitGroup
		start := time.Now()
		for w := 0; w < o.Concurrency; w++ {
			wg.Add(1)
			go func(w int) {
				defer wg.Done()
				for {
					i := int(next.Add(1) - 1)
					if i >= o.Requests || ctx.Err() != nil {
						return
					}
					target := i % len(clients)
					c := clients[target][w%o.ConnsPerTarget]
					samples[i] = c.call(ctx, i, target)
				}
			}(w)
		}
		wg.Wait()
		elapsed = time.Since(start)
		if ctx.Err() != nil && int(next.Load()) < o.Requests {
			return Result{}, fmt.Errorf("loadgen: run of %d requests did not finish within %v", o.Requests, o.MaxDuration)
		}
	}

	return summarize(samples, len(o.Targets), elapsed), nil
}

// runFor runs o.Duration: request i goes to target i mod targets, as in
// a counted run; each worker keeps its own samples.
func runFor(ctx context.Context, o Options, clients [][]caller) ([]sample, time.Duration) {
	var next atomic.Int64
	var wg sync.WaitGroup
	per := make([][]sample, o.Concurrency)
	start := time.Now()
	deadline := start.Add(o.Duration)
	for w := 0; w < o.Concurrency; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for ctx.Err() == nil && time.Now().Before(deadline) {
				i := int(next.Add(1) - 1)
				target := i % len(clients)
				per[w] = append(per[w], clients[target][w%o.ConnsPerTarget].call(ctx, i, target))
			}
		}(w)
	}
	wg.Wait()
	elapsed := time.Since(start)
	return slices.Concat(per...), elapsed
}

// sample is one call's outcome.
type sample struct {
	latency time.Duration
	status  int
	target  int
	err     error
}

// summarize is a run's Result from its samples: statuses, allowed calls
// per target, latency percentiles of the calls that got an answer, and
// throughput over elapsed.
func summarize(samples []sample, targets int, elapsed time.Duration) Result {
	r := Result{Requests: len(samples), Elapsed: elapsed, Statuses: map[string]int{}, AllowedPerTarget: make([]int, targets)}
	lat := make([]time.Duration, 0, len(samples))
	for _, s := range samples {
		if s.err != nil {
			r.GRPCErrors++
			if r.FirstError == "" {
				r.FirstError = s.err.Error()
			}
			continue
		}
		r.Statuses[fmt.Sprint(s.status)]++
		if s.status == 200 {
			r.AllowedPerTarget[s.target]++
		}
		lat = append(lat, s.latency)
	}
	slices.Sort(lat)
	if len(lat) > 0 {
		r.P50 = lat[len(lat)*50/100]
		r.P99 = lat[min(len(lat)*99/100, len(lat)-1)]
		r.Max = lat[len(lat)-1]
	}
	r.Throughput = float64(len(samples)) / elapsed.Seconds()
	return r
}

// caller makes call i of a run: a Check or a ShouldRateLimit.
type caller interface {
	call(ctx context.Context, i, target int) sample
}

type checkCaller struct {
	c     authv3.AuthorizationClient
	build func(i int) *authv3.CheckRequest
}

func (c checkCaller) call(ctx context.Context, i, target int) sample {
	req := c.build(i)
	t0 := time.Now()
	resp, err := c.c.Check(ctx, req)
	s := sample{latency: time.Since(t0), target: target, err: err}
	if err == nil {
		s.status = HTTPStatus(resp)
	}
	return s
}

type rateLimitCaller struct {
	c     rlsv3.RateLimitServiceClient
	build func(i int) *rlsv3.RateLimitRequest
}

func (c rateLimitCaller) call(ctx context.Context, i, target int) sample {
	req := c.build(i)
	t0 := time.Now()
	resp, err := c.c.ShouldRateLimit(ctx, req)
	s := sample{latency: time.Since(t0), target: target, err: err}
	if err == nil {
		s.status = 200
		if resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
			s.status = 429
		}
	}
	return s
}

// HTTPStatus is the HTTP status Envoy sends for a CheckResponse: 200 when
// the gRPC status is OK, else the denied response's status (403 when none).
func HTTPStatus(resp *authv3.CheckResponse) int {
	if codes.Code(resp.GetStatus().GetCode()) == codes.OK {
		return 200
	}
	if s := resp.GetDeniedResponse().GetStatus().GetCode(); s != 0 {
		return int(s)
	}
	return 403
}
