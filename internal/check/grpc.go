package check

import (
	"os"
	"runtime"
	"runtime/debug"
	"strconv"
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

// GCPercent is the garbage collector's target (GOGC) for serving Envoy,
// unless GOGC is set in the environment. The sidecar's live heap is small
// (a few MB plus the per-key cache) while every Check allocates ~16 KB in
// gRPC and protobuf, so at the default of 100 the collector runs every few
// hundred Checks and marking the live heap each time cost ~30% of the CPU
// per Check in profiles. 400 lets the heap grow to five times the live
// data between collections; GOMEMLIMIT (set from the container's memory
// limit in k8s/) still makes the collector work harder near the limit.
const GCPercent = 400

// TuneGC applies GCPercent unless the operator chose GOGC, and reports the
// value in force.
func TuneGC() int {
	if v, ok := os.LookupEnv("GOGC"); ok {
		if n, err := strconv.Atoi(v); err == nil {
			return n
		}
		return -1 // "off"
	}
	debug.SetGCPercent(GCPercent)
	return GCPercent
}
