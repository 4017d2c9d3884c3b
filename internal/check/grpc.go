package check

import (
	"runtime"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"
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

// ServerOptions are the gRPC server settings for serving Envoy. The
// benchmark's no-op ceiling uses the same ones, so the comparison measures
// the Check logic, not a difference in transport tuning.
func ServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.MaxRecvMsgSize(MaxCheckRequestBytes),
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
