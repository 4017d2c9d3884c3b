// Package gctune sets the garbage collector's target for serving Envoy.
// The sidecar and the benchmark's no-op ceiling both apply it, so the
// benchmark compares decisions, not collector settings.
package gctune

import (
	"os"
	"runtime/debug"
	"strconv"
)

// GCPercent is the garbage collector's target (GOGC) for serving Envoy,
// unless GOGC is set in the environment. The sidecar's live heap is small
// (a few MB plus the per-key cache) while every Check allocates ~16 KB in
// gRPC and protobuf, so at the default of 100 the collector runs every few
// hundred Checks and marking the live heap each time cost ~30% of the CPU
// per Check in profiles. 400 lets the heap grow to five times the live
// data between collections; GOMEMLIMIT (set from the container's memory
// limit in k8s/) still makes the collector work harder near the limit.
const GCPercent = 400

// Apply applies GCPercent unless the operator chose GOGC, and reports the
// value in force.
func Apply() int {
	if v, ok := os.LookupEnv("GOGC"); ok {
		if n, err := strconv.Atoi(v); err == nil {
			return n
		}
		return -1 // "off"
	}
	debug.SetGCPercent(GCPercent)
	return GCPercent
}
