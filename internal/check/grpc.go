package check

import (
	"context"
	"runtime"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/tap"
)

// MaxCheckRequestBytes is the largest CheckRequest the server reads: gRPC's
// default, set explicitly so that it is a decision, not an accident. Envoy
// refuses requests whose headers exceed max_request_headers_kb (60 KiB by
// default) before it calls ext_authz, so a CheckRequest from Envoy is far
// smaller. A larger one is refused by gRPC with RESOURCE_EXHAUSTED before
// Check runs; Envoy then applies failure_mode_allow, so the limit must stay
// above anything Envoy may send. Check's cost is linear in the request's
// size, so a lower limit would not reduce the work per byte a client can
// cause.
const MaxCheckRequestBytes = 4 << 20

// MaxConcurrentStreams is the most calls one connection may have open at
// once, advertised in SETTINGS_MAX_CONCURRENT_STREAMS; a stream past it is
// reset with REFUSED_STREAM before anything of it is kept. Envoy's
// connection pool opens another connection when one reaches the peer's
// limit, and gRPC clients queue, so the cap costs a well-behaved caller
// nothing: a sidecar deciding 10,000 Checks/s at 1 ms has about 10 open.
// What it bounds is one connection's hold on the process: without it a
// client kept 20,000 header-only streams open on one connection (240 MB).
const MaxConcurrentStreams = 1024

// MaxHeaderListBytes bounds a call's HTTP/2 header list, as HTTP/2 counts
// it (name, value and 32 bytes per field, after HPACK decoding), advertised
// in SETTINGS_MAX_HEADER_LIST_SIZE. A longer list is reset with
// FRAME_SIZE_ERROR before gRPC turns it into metadata. Envoy's ext_authz and
// rate limit calls carry a few hundred bytes of headers (the request's own
// headers travel in the message, under MaxCheckRequestBytes); gRPC's default,
// 16 MiB, let ~250 KB on the wire of HPACK references to one large -bin
// header be decoded into hundreds of megabytes.
const MaxHeaderListBytes = 16 << 10

// RequestTimeout is the longest a unary call may take from its headers to
// its answer, whatever deadline (or none) the caller sent: a stream whose
// request message never arrives is answered DEADLINE_EXCEEDED and closed
// after it, so the stream cap cannot be held forever. It is far above what
// a Check or ShouldRateLimit needs (Envoy's ext_authz timeout is 200 ms by
// default; a leaky-bucket hold is at most 150 ms, a Redis call times out
// at 150 ms and a failing Redis opens the breaker within 250 ms).
const RequestTimeout = 5 * time.Second

// longLived are the streaming methods the sidecar serves whose calls last
// as long as the caller watches; RequestTimeout does not apply to them.
var longLived = map[string]bool{
	"/grpc.health.v1.Health/Watch": true,
	"/envoy.service.rate_limit_quota.v3.RateLimitQuotaService/StreamRateLimitQuotas": true,
	"/grpc.reflection.v1.ServerReflection/ServerReflectionInfo":                      true,
	"/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo":                 true,
}

// requestDeadline is the server's in-tap handle: it runs when a call's
// headers arrive, before gRPC waits for its message, and the context it
// returns is the stream's, which the wait for the message reads.
func requestDeadline(ctx context.Context, info *tap.Info) (context.Context, error) {
	if longLived[info.FullMethodName] {
		return ctx, nil
	}
	// The stream's own context is cancelled when the call ends, which
	// cancels this one and stops its timer: nothing outlives the call.
	ctx, cancel := context.WithTimeout(ctx, RequestTimeout)
	_ = cancel
	return ctx, nil
}

// ServerOptions are the gRPC server settings for serving Envoy. The
// benchmark's no-op ceiling uses the same ones, so the comparison measures
// the Check logic, not a difference in transport tuning.
func ServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.MaxRecvMsgSize(MaxCheckRequestBytes),
		grpc.MaxConcurrentStreams(MaxConcurrentStreams),
		grpc.MaxHeaderListSize(MaxHeaderListBytes),
		grpc.InTapHandle(requestDeadline),
		// Envoy keeps its ext_authz connection open and may ping it; do
		// not answer an eager ping with GOAWAY.
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 5 * time.Second, PermitWithoutStream: true}),
		// Reuse a pool of goroutines for streams instead of starting one
		// per Check: a fresh goroutine's stack grows (and is copied) on
		// every call, which profiles showed at ~8% of CPU.
		grpc.NumStreamWorkers(uint32(64 * runtime.GOMAXPROCS(0))),
		// Marshal responses with the code go-control-plane generates.
		grpc.ForceServerCodecV2(newCodec()),
	}
}
