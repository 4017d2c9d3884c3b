package quota

import "time"

// Design note: leaky_bucket shapes traffic rather than only metering it.
// Requests leave the bucket one every T = window/limit; a request that
// arrives while others are still waiting is admitted but held (its OK
// delayed) until its slot, as long as it would wait at most D:
//
//	D = min(MaxDelay, Queue × T)        (MaxDelay alone when Queue < 0)
//
// Beyond that it is rejected with a 429 whose wait is the time until it
// would be within D of its slot.
//
// This is GCRA's "virtual scheduling": the whole state is tat, the instant
// of the next free slot. A request at now gets slot max(tat, now), waits
// slot − now, and moves tat one interval on. The requests already waiting
// at now are those whose slots are still ahead, ⌈(tat − now)/T⌉ − 1 of
// them, so "at most Queue waiting, the new one included" is exactly
// slot − now ≤ Queue × T, and both bounds reduce to one tolerance D.
//
// As a meter it is a token bucket of capacity 1 + D/T: a burst admits
// 1 + ⌊D/T⌋ requests at once, then one per T. What differs is that each
// admitted request is released at its slot, so the upstream sees an even
// rate. MaxDelay must stay below Envoy's ext_authz timeout (the
// configuration enforces 150ms, inside Envoy's default 200ms), because a
// held request is an open Check call.
//
// A refund gives the slot back: tat moves back one interval, as a token
// bucket's refund does.

// Tolerance returns D in nanoseconds (see the design note).
func (l Limit) Tolerance() int64 {
	d := int64(max(l.MaxDelay, 0))
	iv := l.Interval()
	// Queue × iv without overflow: only a queue shorter than D/iv matters.
	if l.Queue >= 0 && l.Queue <= d/iv {
		d = l.Queue * iv
	}
	return d
}

// leakyBucketTake asks for n slots of a leaky bucket whose next free slot
// is tat (unix ns; zero is an empty bucket) at now, and returns the new
// state. The request leaves at the first of its slots; the others keep the
// bucket busy after it. n = 0 decides as for one slot and takes none.
func leakyBucketTake(tat, now int64, l Limit, n int64) (int64, Decision) {
	iv := l.Interval()
	tol := l.Tolerance()
	slot := max(tat, now)
	delay := slot - now
	d := Decision{Limit: l.Limit}
	if delay <= tol {
		next := slot + max(n, 1)*iv
		if n == 0 {
			next = slot
		} else {
			d.Delay = time.Duration(delay)
		}
		d.Allowed = true
		if ahead := max(next-now, 0); ahead <= tol {
			d.Remaining = (tol-ahead)/iv + 1
		}
		d.ResetAfter = time.Duration(max(next-now, 0))
		if n == 0 {
			return tat, d
		}
		return next, d
	}
	d.RetryAfter = time.Duration(delay - tol)
	d.ResetAfter = time.Duration(delay)
	return tat, d
}

// leakyBucketRefund gives n slots back.
func leakyBucketRefund(tat, now int64, l Limit, n int64) int64 {
	return max(tat-n*l.Interval(), now)
}
