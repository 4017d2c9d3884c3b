package quota

import "time"

// The token bucket is kept as GCRA (the generic cell rate algorithm): its
// whole state is one instant, tat, at which the bucket will be full again.
// A bucket of capacity C refilling one unit every T holds
// (C*T - (tat-now)) / T tokens; taking a unit pushes tat forward by T. One
// integer per key, no floating point, and exact at the nanosecond.

// tokenBucketTake asks for n units of a bucket whose state is tat (unix
// nanoseconds; zero is a full bucket) at now, and returns the new state.
// n = 0 decides as for one unit and spends nothing. Under l.Overdraft a
// take of n > 0 is a charge: tat moves past now + tau (the level below
// empty, a debt) and refill pays it back before a unit is admitted again.
func tokenBucketTake(tat, now int64, l Limit, n int64) (int64, Decision) {
	iv := l.Interval()
	capacity := l.Capacity()
	tau := capacity * iv // time a full bucket takes to refill from empty
	base := max(tat, now)
	d := Decision{Limit: l.Limit}
	if l.Charges(n) {
		next := base + min(n, (maxDebt-(base-now))/iv)*iv
		d.Allowed = true
		d.Remaining = max((tau-(next-now))/iv, 0)
		d.ResetAfter = time.Duration(next - now)
		return next, d
	}
	next := base + max(n, 1)*iv
	if next-now <= tau {
		d.Allowed = true
		if n == 0 {
			d.Remaining = (tau - (base - now)) / iv
			d.ResetAfter = time.Duration(base - now)
			return tat, d
		}
		d.Remaining = (tau - (next - now)) / iv
		d.ResetAfter = time.Duration(next - now)
		return next, d
	}
	d.Remaining = max((tau-(base-now))/iv, 0) // 0 in debt
	d.RetryAfter = time.Duration(next - now - tau)
	d.ResetAfter = time.Duration(base - now)
	return tat, d
}

// maxDebt bounds how far charges may push a bucket's tat past now (about
// 146 years): far beyond any budget's debt, and far from overflowing.
const maxDebt = 1 << 62

// tokenBucketRefund gives n units back: tat moves back by n intervals,
// never below now (a bucket cannot hold more than its capacity).
func tokenBucketRefund(tat, now int64, l Limit, n int64) int64 {
	return max(tat-n*l.Interval(), now)
}

// tokenBucketRescale converts a bucket's state kept at interval oldIv to
// newIv when a reload changes the limit, keeping the number of tokens in
// use, not the time they take to refill: raising a limit from 2 to 3 per
// minute after two requests leaves one token, as an operator expects.
func tokenBucketRescale(tat, now, oldIv, newIv int64) int64 {
	if tat <= now || oldIv == newIv || oldIv == 0 {
		return tat
	}
	used := float64(tat-now) / float64(oldIv)
	return now + int64(used*float64(newIv))
}
