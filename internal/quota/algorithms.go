package quota

import "fmt"

// counts is the state of the counting algorithms in an Entry.
type counts struct {
	win    windowCount // fixed and sliding window counters
	winLen int64       // the window length win was counted with, ns
	log    timeLog     // sliding log
}

// takeLocked decides one unit of l for the entry at ns, with the algorithm
// l names. The entry's shard must be locked. An entry last used with
// another algorithm (a reload changed it) starts again empty; its hybrid
// slice, if any, is kept.
func (e *Entry) takeLocked(l Limit, ns int64) (Decision, error) {
	if e.alg != l.Algorithm {
		e.resetLocked(l.Algorithm)
	}
	var d Decision
	switch l.Algorithm {
	case TokenBucket, LeakyBucket:
		if iv := l.Interval(); iv != e.iv {
			// A reload changed the rate: keep the units in use (or
			// waiting), not the time they take to drain.
			e.tat, e.iv = tokenBucketRescale(e.tat, ns, e.iv, iv), iv
		}
		if l.Algorithm == TokenBucket {
			e.tat, d = tokenBucketTake(e.tat, ns, l)
		} else {
			e.tat, d = leakyBucketTake(e.tat, ns, l)
		}
	case FixedWindow, SlidingWindow:
		if e.counts == nil {
			e.counts = &counts{}
		}
		c := e.counts
		if w := int64(l.Window); w != c.winLen {
			c.win, c.winLen = windowCount{}, w // windows of another length do not line up
		}
		if l.Algorithm == FixedWindow {
			c.win, d = fixedWindowTake(c.win, ns, l)
		} else {
			c.win, d = slidingWindowTake(c.win, ns, l)
		}
	case SlidingLog:
		if e.counts == nil {
			e.counts = &counts{}
		}
		d = slidingLogTake(&e.counts.log, ns, l)
	default:
		return Decision{}, fmt.Errorf("quota: unknown algorithm %s", l.Algorithm)
	}
	return d, nil
}

// refundLocked gives back one unit that takeLocked admitted under l. The
// entry's shard must be locked. An entry holding no state for l's
// algorithm has nothing to give back.
func (e *Entry) refundLocked(l Limit, ns int64) {
	if e.alg != l.Algorithm {
		return
	}
	switch l.Algorithm {
	case TokenBucket:
		if e.iv != 0 {
			e.tat = tokenBucketRefund(e.tat, ns, l)
		}
	case LeakyBucket:
		if e.iv != 0 {
			e.tat = leakyBucketRefund(e.tat, ns, l)
		}
	case FixedWindow:
		if c := e.counts; c != nil && c.winLen == int64(l.Window) {
			c.win = fixedWindowRefund(c.win, ns, l)
		}
	case SlidingWindow:
		if c := e.counts; c != nil && c.winLen == int64(l.Window) {
			c.win = slidingWindowRefund(c.win, ns, l)
		}
	case SlidingLog:
		if e.counts != nil {
			slidingLogRefund(&e.counts.log)
		}
	}
}

// resetLocked clears the algorithm state of the entry for algorithm a.
func (e *Entry) resetLocked(a Algorithm) {
	e.alg = a
	e.tat, e.iv = 0, 0
	e.counts = nil
}
