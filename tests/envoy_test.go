package tests

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// envoyRequest is what a client sent to Envoy; build turns it into the
// CheckRequest Envoy's ext_authz HTTP filter sends (see Envoy's
// check_request_utils.cc): source and destination socket addresses, the
// request time, the stream id, method/path/host/scheme/protocol, and every
// request header with lower-case names, pseudo-headers included and
// repeated headers joined with commas.
type envoyRequest struct {
	method   string
	path     string // with the query string, as :path carries it
	host     string
	headers  [][2]string
	sourceIP string
	context  map[string]string
	jwt      map[string]any // payload jwt_authn verified, under provider "jwt_payload"
}

var streamID atomic.Uint64

func (r envoyRequest) build() *authv3.CheckRequest {
	if r.method == "" {
		r.method = "GET"
	}
	if r.path == "" {
		r.path = "/"
	}
	if r.host == "" {
		r.host = "api.example.com"
	}
	if r.sourceIP == "" {
		r.sourceIP = "10.1.2.3"
	}
	id := streamID.Add(1)
	headers := map[string]string{
		":authority":        r.host,
		":method":           r.method,
		":path":             r.path,
		":scheme":           "https",
		"user-agent":        "e2e/1.0",
		"x-forwarded-proto": "https",
		"x-request-id":      fmt.Sprintf("e2e-%d", id),
	}
	for _, h := range r.headers {
		k := strings.ToLower(h[0])
		if prev, ok := headers[k]; ok {
			headers[k] = prev + "," + h[1]
		} else {
			headers[k] = h[1]
		}
	}
	_, query, _ := strings.Cut(r.path, "?")
	attrs := &authv3.AttributeContext{
		Source:      &authv3.AttributeContext_Peer{Address: sockAddr(r.sourceIP, 40000+uint32(id%20000))},
		Destination: &authv3.AttributeContext_Peer{Address: sockAddr("10.0.0.10", 8443)},
		Request: &authv3.AttributeContext_Request{
			Time: timestamppb.Now(),
			Http: &authv3.AttributeContext_HttpRequest{
				Id:       strconv.FormatUint(id, 10),
				Method:   r.method,
				Headers:  headers,
				Path:     r.path,
				Host:     r.host,
				Scheme:   "https",
				Query:    query,
				Protocol: "HTTP/2",
			},
		},
		ContextExtensions: r.context,
	}
	if r.jwt != nil {
		payload, err := structpb.NewStruct(map[string]any{"jwt_payload": r.jwt})
		if err != nil {
			panic(err)
		}
		attrs.MetadataContext = &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{
			"envoy.filters.http.jwt_authn": payload,
		}}
	}
	return &authv3.CheckRequest{Attributes: attrs}
}

func sockAddr(ip string, port uint32) *corev3.Address {
	return &corev3.Address{Address: &corev3.Address_SocketAddress{SocketAddress: &corev3.SocketAddress{
		Protocol: corev3.SocketAddress_TCP, Address: ip, PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: port},
	}}}
}

// httpStatus is the HTTP status Envoy would send for resp: 200 when
// allowed, else the denied response's status.
func httpStatus(resp *authv3.CheckResponse) int {
	if codes.Code(resp.GetStatus().GetCode()) == codes.OK {
		return 200
	}
	if s := resp.GetDeniedResponse().GetStatus().GetCode(); s != 0 {
		return int(s)
	}
	return 403
}

func deniedHeaders(resp *authv3.CheckResponse) map[string]string {
	m := map[string]string{}
	for _, h := range resp.GetDeniedResponse().GetHeaders() {
		m[h.GetHeader().GetKey()] = h.GetHeader().GetValue()
	}
	return m
}

func okHeaders(resp *authv3.CheckResponse) map[string]string {
	m := map[string]string{}
	for _, h := range resp.GetOkResponse().GetResponseHeadersToAdd() {
		m[h.GetHeader().GetKey()] = h.GetHeader().GetValue()
	}
	return m
}

// result is one decision of a load run.
type result struct {
	replica int
	resp    *authv3.CheckResponse
	err     error
	latency time.Duration
	done    time.Time // when the answer arrived
}

// drive sends n requests from `workers` goroutines, request i going to
// replica i % len(replicas) (round robin), and returns every result in
// request order. The run is bounded by n and by a 2-minute deadline.
func drive(t *testing.T, replicas []*sidecar, n, workers int, req func(i int) *authv3.CheckRequest) []result {
	t.Helper()
	out := make([]result, n)
	driveCalls(t, n, workers, func(ctx context.Context, i int) {
		r := replicas[i%len(replicas)]
		start := time.Now()
		resp, err := r.Client.Check(ctx, req(i))
		done := time.Now()
		out[i] = result{replica: i % len(replicas), resp: resp, err: err, latency: done.Sub(start), done: done}
	})
	return out
}

// driveCalls makes calls 0..n-1 from `workers` goroutines, bounded by n
// and by a 2-minute deadline.
func driveCalls(t *testing.T, n, workers int, call func(ctx context.Context, i int)) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var next atomic.Int64
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= n || ctx.Err() != nil {
					return
				}
				call(ctx, i)
			}
		}()
	}
	wg.Wait()
	if ctx.Err() != nil {
		t.Fatalf("load run of %d requests did not finish within its deadline", n)
	}
}

// timedDrive is drive, also returning how long the run took.
func timedDrive(t *testing.T, replicas []*sidecar, n, workers int, req func(i int) *authv3.CheckRequest) ([]result, time.Duration) {
	t.Helper()
	start := time.Now()
	out := drive(t, replicas, n, workers, req)
	return out, time.Since(start)
}

// assertAdmitted checks that a token bucket limit of `limit` per `window`,
// enforced by `buckets` independent buckets, admitted exactly `want` plus
// at most what the buckets refilled while the run lasted: one token per
// window/limit each. A run shorter than one refill interval must admit
// exactly `want`.
func assertAdmitted(t *testing.T, got, want, limit int, window, elapsed time.Duration, buckets int) {
	t.Helper()
	refill := buckets * int(elapsed/(window/time.Duration(limit)))
	t.Logf("admitted %d in %v (want %d, plus up to %d refilled during the run)", got, elapsed.Round(time.Millisecond), want, refill)
	if got < want || got > want+refill {
		t.Fatalf("admitted %d; want %d (+%d refilled in %v)", got, want, refill, elapsed)
	}
}

// tally counts results by HTTP status; a gRPC error fails the test.
func tally(t *testing.T, results []result) map[int]int {
	t.Helper()
	counts := map[int]int{}
	for i, r := range results {
		if r.err != nil {
			t.Fatalf("request %d: gRPC error: %v", i, r.err)
		}
		counts[httpStatus(r.resp)]++
	}
	return counts
}
