package config

import (
	"fmt"
	"math"
	"math/bits"
	"time"
)

// Leaky bucket shaping bounds.
const (
	// DefaultMaxDelay is the longest a leaky_bucket policy holds a request
	// when max_delay is not given.
	DefaultMaxDelay = 100 * time.Millisecond
	// MaxMaxDelay bounds max_delay. A held request is an open Check call:
	// Envoy's ext_authz filter gives it 200ms by default (envoy/envoy.yaml,
	// grpc_service.timeout), and the Check also spends its Redis call and
	// the network. 150ms leaves 50ms for them in the usual case; a caller
	// that gives up while its request is held (a slow Redis call ate its
	// budget) has its unit refunded and never reaches the upstream.
	MaxMaxDelay = 150 * time.Millisecond
	// maxQueue bounds queue: each waiting request is a Check in flight.
	maxQueue = 100_000
)

// MaxSlidingLogLimit is the largest limit a sliding_log policy may have:
// its memory is one entry per admitted request per key (about 8 bytes in
// this process, 40 to 130 in Redis).
const MaxSlidingLogLimit = 100_000

// LogEntryBytes is what one sliding_log entry costs in this process: an
// instant in nanoseconds, in a ring that grows up to the limit.
const LogEntryBytes = 8

// DefaultMaxLogBytes bounds the sliding logs this process may hold when
// local.max_log_bytes is not given.
const DefaultMaxLogBytes = 256 << 20

// SlidingLogBytes is the most a sliding_log policy's logs may take in this
// process: limit entries of LogEntryBytes for each of up to maxKeys keys
// (the per-key table holds at most that many, whatever they belong to).
// It saturates at the largest int64.
func SlidingLogBytes(limit int64, maxKeys int) int64 {
	hi, lo := bits.Mul64(uint64(limit)*LogEntryBytes, uint64(maxKeys))
	if hi != 0 || lo > math.MaxInt64 {
		return math.MaxInt64
	}
	return int64(lo)
}

// warnLeakyBucket warns of a leaky_bucket policy that never holds a
// request: one that releases a request less often than max_delay.
func warnLeakyBucket(path string, p *Policy, c *Config) {
	if p.Algorithm == LeakyBucket && !p.UsePlan && p.Limit > 0 && p.Window > 0 && p.Window/time.Duration(p.Limit) > p.MaxDelay {
		c.Warnings = append(c.Warnings, fmt.Sprintf("%s: leaky_bucket releases one request every %s, longer than max_delay %s: no request is ever held, a burst passes one and gets 429 for the rest",
			path, p.Window/time.Duration(p.Limit), p.MaxDelay))
	}
}
