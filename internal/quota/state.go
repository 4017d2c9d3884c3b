package quota

import (
	"fmt"
	"slices"
	"time"
)

// State is one key's count under one algorithm: the whole of what local
// mode keeps per key, and of a Redis-backed key's fallback bucket. The
// zero value is an empty count (a full bucket, an empty window or log).
//
// A State is not safe for concurrent use: the caller serialises access
// (internal/quota/local keeps each under its cache shard's lock).
type State struct {
	alg Algorithm
	// Token and leaky bucket: tat is the instant (unix ns) at which the
	// bucket is full again, or the next free slot; iv the refill interval
	// it was computed with.
	tat int64
	iv  int64
	// until is the end of the key's penalty box (Limit.BlockFor), unix
	// ns; 0 or past: not blocked.
	until int64
	// counts holds the window counters and the sliding log, allocated
	// only for those algorithms so the buckets' states stay small.
	counts *counts
}

// counts is the state of the counting algorithms.
type counts struct {
	win    windowCount // fixed and sliding window counters
	winLen int64       // the window layout win was counted with (Limit.windowKey)
	log    timeLog     // sliding log
}

// Take decides n units of l at ns (unix nanoseconds) with the algorithm l
// names, all or none (n = 0: as for one, counting nothing). A state last
// used with another algorithm (a reload changed it) starts again empty.
//
// A key in its penalty box (Limit.BlockFor) is denied until the block's
// end, its count untouched; a denial under a limit with a BlockFor puts it
// there. A charge is counted whatever the block: it records units already
// served.
func (s *State) Take(l Limit, n, ns int64) (Decision, error) {
	if s.alg != l.Algorithm {
		s.reset(l.Algorithm)
	}
	if s.until > ns && !l.Charges(n) {
		return blocked(l, time.Duration(s.until-ns)), nil
	}
	d, err := s.take(l, n, ns)
	if err == nil && !d.Allowed && l.BlockFor > 0 && !l.Charges(n) {
		// A block once set is not extended by the denials during it
		// (the check above answers them): it ends BlockFor after the
		// denial that set it, as Cloudflare's mitigation timeout does.
		s.until = ns + int64(l.BlockFor)
		return blocked(l, l.BlockFor), nil
	}
	return d, err
}

// blocked is the decision for a key whose penalty box ends left from now:
// nothing remaining until then, and both waits are the block's end.
func blocked(l Limit, left time.Duration) Decision {
	return Decision{Limit: l.Limit, RetryAfter: left, ResetAfter: left}
}

// take decides n units of l at ns with l's algorithm.
func (s *State) take(l Limit, n, ns int64) (Decision, error) {
	var d Decision
	switch l.Algorithm {
	case TokenBucket, LeakyBucket:
		if iv := l.Interval(); iv != s.iv {
			// A reload changed the rate: keep the units in use (or
			// waiting), not the time they take to drain.
			s.tat, s.iv = tokenBucketRescale(s.tat, ns, s.iv, iv), iv
		}
		if l.Algorithm == TokenBucket {
			s.tat, d = tokenBucketTake(s.tat, ns, l, n)
		} else {
			s.tat, d = leakyBucketTake(s.tat, ns, l, n)
		}
	case FixedWindow, SlidingWindow:
		c := s.windows(l.windowKey())
		if l.Algorithm == FixedWindow {
			c.win, d = fixedWindowTake(c.win, ns, l, n)
		} else {
			c.win, d = slidingWindowTake(c.win, ns, l, n)
		}
	case SlidingLog:
		if s.counts == nil {
			s.counts = &counts{}
		}
		d = slidingLogTake(&s.counts.log, ns, l, n)
	default:
		return Decision{}, fmt.Errorf("quota: unknown algorithm %s", l.Algorithm)
	}
	return d, nil
}

// Refund gives back n units that Take admitted under l. A state holding no
// count for l's algorithm has nothing to give back.
func (s *State) Refund(l Limit, n, ns int64) {
	if s.alg != l.Algorithm {
		return
	}
	switch l.Algorithm {
	case TokenBucket:
		if s.iv != 0 {
			s.tat = tokenBucketRefund(s.tat, ns, l, n)
		}
	case LeakyBucket:
		if s.iv != 0 {
			s.tat = leakyBucketRefund(s.tat, ns, l, n)
		}
	case FixedWindow:
		if c := s.counts; c != nil && c.winLen == l.windowKey() {
			c.win = fixedWindowRefund(c.win, ns, l, n)
		}
	case SlidingWindow:
		if c := s.counts; c != nil && c.winLen == int64(l.Window) {
			c.win = slidingWindowRefund(c.win, ns, l, n)
		}
	case SlidingLog:
		if s.counts != nil {
			slidingLogRefund(&s.counts.log, n)
		}
	}
}

// Counting reports whether the state already counts under l's algorithm,
// so that what it spent is kept.
func (s *State) Counting(l Limit) bool {
	if s.alg != l.Algorithm {
		return false
	}
	switch l.Algorithm {
	case TokenBucket, LeakyBucket:
		return s.iv != 0
	}
	return s.counts != nil
}

// reset clears the state for algorithm a.
func (s *State) reset(a Algorithm) {
	*s = State{alg: a}
}

// windows returns the window counters for the window layout w
// (Limit.windowKey), starting afresh when it changed: windows of another
// length, or calendar windows, do not line up.
func (s *State) windows(w int64) *counts {
	if s.counts == nil {
		s.counts = &counts{}
	}
	if c := s.counts; c.winLen != w {
		c.win, c.winLen = windowCount{}, w
	}
	return s.counts
}

// Peek is the decision n units would get under l at ns (n = 0: one,
// counting nothing), leaving s as it was: the counters API reads a count
// with it, under any limit, without disturbing it.
func (s *State) Peek(l Limit, n, ns int64) (Decision, error) {
	c := *s
	if s.counts != nil {
		counts := *s.counts
		counts.log.ts = slices.Clone(s.counts.log.ts)
		c.counts = &counts
	}
	return c.Take(l, n, ns)
}
