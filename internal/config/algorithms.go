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

// validateAlgorithm checks the settings that belong to one algorithm:
// queue and max_delay (leaky_bucket only), and the sliding log's limit,
// whose memory is one entry per admitted request.
func validateAlgorithm(r *rawPolicy, path string, p *Policy, c *Config, errs *Errors) {
	if p.Algorithm != LeakyBucket {
		if r.Queue != nil {
			errs.add(path+".queue", "applies to leaky_bucket only, not %s", p.Algorithm)
		}
		if r.MaxDelay != "" {
			errs.add(path+".max_delay", "applies to leaky_bucket only, not %s", p.Algorithm)
		}
	} else {
		p.Queue, p.MaxDelay = -1, DefaultMaxDelay
		if r.Queue != nil {
			p.Queue = *r.Queue
			if p.Queue < 0 || p.Queue > maxQueue {
				errs.add(path+".queue", "%d must be between 0 and %d", p.Queue, maxQueue)
			}
		}
		durationField(r.MaxDelay, path+".max_delay", &p.MaxDelay, errs)
		if p.MaxDelay > MaxMaxDelay {
			errs.add(path+".max_delay", "%q must be at most %s: a held request must be answered within Envoy's ext_authz timeout (200ms by default), with room for the Redis call", r.MaxDelay, MaxMaxDelay)
		}
		if !p.UsePlan && p.Limit > 0 && p.Window > 0 && p.Window/time.Duration(p.Limit) > p.MaxDelay {
			c.Warnings = append(c.Warnings, fmt.Sprintf("%s: leaky_bucket releases one request every %s, longer than max_delay %s: no request is ever held, a burst passes one and gets 429 for the rest",
				path, p.Window/time.Duration(p.Limit), p.MaxDelay))
		}
	}

	if p.Algorithm == SlidingLog {
		const why = "is too large for sliding_log, which keeps one entry per admitted request and key; at most %d (or use sliding_window)"
		const tooBig = "needs up to %s of sliding logs in this process (%d entries × local.max_keys %d × %d B), over local.max_log_bytes (%s); lower the limit or local.max_keys, raise local.max_log_bytes, or use sliding_window"
		check := func(what string, n int64) {
			switch {
			case n > MaxSlidingLogLimit:
				errs.add(path+".limit", "%s"+why, what, MaxSlidingLogLimit)
			case SlidingLogBytes(n, c.Local.MaxKeys) > c.Local.MaxLogBytes:
				errs.add(path+".limit", "%s"+tooBig, what, FormatBytes(SlidingLogBytes(n, c.Local.MaxKeys)),
					n, c.Local.MaxKeys, LogEntryBytes, FormatBytes(c.Local.MaxLogBytes))
			}
		}
		if p.UsePlan {
			for _, name := range sortedKeys(c.Plans) {
				n := c.Plans[name].Limit
				check(fmt.Sprintf("plans.%s.limit %d ", name, n), n)
			}
		} else {
			check(fmt.Sprintf("%d ", p.Limit), p.Limit)
		}
	}
}
