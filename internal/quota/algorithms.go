package quota

import "fmt"

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
		if w := int64(l.Window); w != e.winLen {
			e.win, e.winLen = windowCount{}, w // windows of another length do not line up
		}
		if l.Algorithm == FixedWindow {
			e.win, d = fixedWindowTake(e.win, ns, l)
		} else {
			e.win, d = slidingWindowTake(e.win, ns, l)
		}
	case SlidingLog:
		if e.log == nil {
			e.log = &timeLog{}
		}
		d = slidingLogTake(e.log, ns, l)
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
		if e.winLen == int64(l.Window) {
			e.win = fixedWindowRefund(e.win, ns, l)
		}
	case SlidingWindow:
		if e.winLen == int64(l.Window) {
			e.win = slidingWindowRefund(e.win, ns, l)
		}
	case SlidingLog:
		if e.log != nil {
			slidingLogRefund(e.log)
		}
	}
}

// resetLocked clears the algorithm state of the entry for algorithm a.
func (e *Entry) resetLocked(a Algorithm) {
	e.alg = a
	e.tat, e.iv = 0, 0
	e.win, e.winLen = windowCount{}, 0
	e.log = nil
}
