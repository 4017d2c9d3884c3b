package tests

import (
	"context"
	"strings"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// How Envoy's ratelimit HTTP filter builds a RateLimitRequest (Envoy's
// router/router_ratelimit.cc and the filter's ratelimit.cc): the filter
// names the domain; each of the route's rate_limits entries yields one
// descriptor, its actions one entry each, in order; when an action finds
// nothing (a header the request lacks, metadata that is not there and no
// default) the whole descriptor is left out. The request-level hits_addend
// is 0 (one hit) unless the filter state sets it; a rate_limits entry may
// set its own hits_addend and a limit override.

// rlAction is one rate limit action.
type rlAction func(r envoyRequest) (entry *ratelimitv3.RateLimitDescriptor_Entry, ok bool)

// remoteAddress is Envoy's remote_address action: the trusted client
// address (here the source address; the tests send no x-forwarded-for).
func remoteAddress() rlAction {
	return func(r envoyRequest) (*ratelimitv3.RateLimitDescriptor_Entry, bool) {
		return &ratelimitv3.RateLimitDescriptor_Entry{Key: "remote_address", Value: r.sourceIP}, true
	}
}

// requestHeader is the request_headers action: the header's value under
// descriptorKey; a request without the header yields no descriptor.
func requestHeader(header, descriptorKey string) rlAction {
	return func(r envoyRequest) (*ratelimitv3.RateLimitDescriptor_Entry, bool) {
		for _, h := range r.headers {
			if strings.EqualFold(h[0], header) {
				return &ratelimitv3.RateLimitDescriptor_Entry{Key: descriptorKey, Value: h[1]}, true
			}
		}
		return nil, false
	}
}

// genericKey is the generic_key action; an empty key is Envoy's default,
// "generic_key".
func genericKey(key, value string) rlAction {
	if key == "" {
		key = "generic_key"
	}
	return func(envoyRequest) (*ratelimitv3.RateLimitDescriptor_Entry, bool) {
		return &ratelimitv3.RateLimitDescriptor_Entry{Key: key, Value: value}, true
	}
}

// metadataAction is the metadata action: a value from the route's or the
// request's dynamic metadata (here given directly; "" when absent) under
// descriptorKey, or defaultValue; with neither, no descriptor.
func metadataAction(descriptorKey, value, defaultValue string) rlAction {
	return func(envoyRequest) (*ratelimitv3.RateLimitDescriptor_Entry, bool) {
		if value == "" {
			value = defaultValue
		}
		if value == "" {
			return nil, false
		}
		return &ratelimitv3.RateLimitDescriptor_Entry{Key: descriptorKey, Value: value}, true
	}
}

// routeRateLimit is one entry of a route's rate_limits.
type routeRateLimit struct {
	actions    []rlAction
	hitsAddend *uint64 // the entry's own hits_addend, if set
	override   *ratelimitv3.RateLimitDescriptor_RateLimitOverride
}

// rateLimitRequest is the RateLimitRequest Envoy sends for r under the
// route's rate_limits, with the filter's domain.
func rateLimitRequest(domain string, r envoyRequest, limits ...routeRateLimit) *rlsv3.RateLimitRequest {
	req := &rlsv3.RateLimitRequest{Domain: domain}
outer:
	for _, l := range limits {
		d := &ratelimitv3.RateLimitDescriptor{Limit: l.override}
		for _, a := range l.actions {
			e, ok := a(r)
			if !ok {
				continue outer
			}
			d.Entries = append(d.Entries, e)
		}
		if l.hitsAddend != nil {
			d.HitsAddend = wrapperspb.UInt64(*l.hitsAddend)
		}
		req.Descriptors = append(req.Descriptors, d)
	}
	return req
}

func actions(a ...rlAction) routeRateLimit { return routeRateLimit{actions: a} }

// rls is a client of the sidecar's rate limit service, on the connection
// its Check client uses.
func (s *sidecar) rls() rlsv3.RateLimitServiceClient { return rlsv3.NewRateLimitServiceClient(s.conn) }

// shouldRateLimit sends one request and fails the test on a gRPC error.
func (s *sidecar) shouldRateLimit(req *rlsv3.RateLimitRequest) *rlsv3.RateLimitResponse {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := s.rls().ShouldRateLimit(ctx, req)
	if err != nil {
		s.t.Fatalf("ShouldRateLimit: %v", err)
	}
	return resp
}

// rlsStatus is the HTTP status Envoy sends for an answer: 200 when OK,
// 429 (the filter's default) when over the limit.
func rlsStatus(resp *rlsv3.RateLimitResponse) int {
	if resp.GetOverallCode() == rlsv3.RateLimitResponse_OK {
		return 200
	}
	return 429
}

// rlsResult is one call of a load run.
type rlsResult struct {
	replica int
	resp    *rlsv3.RateLimitResponse
	err     error
}

// driveRLS is drive for the rate limit service: n requests from workers
// goroutines, request i to replica i % len(replicas), bounded by n and a
// 2-minute deadline.
func driveRLS(t *testing.T, replicas []*sidecar, n, workers int, req func(i int) *rlsv3.RateLimitRequest) []rlsResult {
	t.Helper()
	clients := make([]rlsv3.RateLimitServiceClient, len(replicas))
	for i, r := range replicas {
		clients[i] = r.rls()
	}
	out := make([]rlsResult, n)
	driveCalls(t, n, workers, func(ctx context.Context, i int) {
		resp, err := clients[i%len(clients)].ShouldRateLimit(ctx, req(i))
		out[i] = rlsResult{replica: i % len(clients), resp: resp, err: err}
	})
	return out
}

// tallyRLS counts results by the status Envoy would send; a gRPC error
// fails the test.
func tallyRLS(t *testing.T, results []rlsResult) map[int]int {
	t.Helper()
	counts := map[int]int{}
	for i, r := range results {
		if r.err != nil {
			t.Fatalf("request %d: gRPC error: %v", i, r.err)
		}
		counts[rlsStatus(r.resp)]++
	}
	return counts
}

// startRLSBackground drives rate limit calls at s until halted, recording
// each as the outage tests' background does. (Envoy's rate limit filter
// gives a call 20ms by default; the tests give it more, so a slow answer
// is measured rather than cut off.)
func startRLSBackground(s *sidecar, workers int, req func(i int) *rlsv3.RateLimitRequest) *background {
	client := s.rls()
	return startCalls(workers, func(ctx context.Context, i int) (int, error) {
		resp, err := client.ShouldRateLimit(ctx, req(i))
		return rlsStatus(resp), err
	})
}

// rlsAdmitted sends n copies of req and counts those answered OK.
func (s *sidecar) rlsAdmitted(n int, req *rlsv3.RateLimitRequest) int {
	s.t.Helper()
	ok := 0
	for i := 0; i < n; i++ {
		if rlsStatus(s.shouldRateLimit(req)) == 200 {
			ok++
		}
	}
	return ok
}
