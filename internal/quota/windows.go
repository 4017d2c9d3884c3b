package quota

import (
	"math/bits"
	"time"
)

// Design note: the two window counters divide time into windows of length W
// aligned to the unix epoch (a 1m window starts on the minute), so every
// replica and Redis agree on where a window starts without sharing any
// state but the count.
//
// fixed_window keeps one count per window and resets it when the window
// ends. It is cheap and easy to explain, but a client can spend the whole
// limit at the end of one window and again at the start of the next: up to
// 2 × limit within a few milliseconds.
//
// sliding_window is Cloudflare's weighted two-window counter: it keeps the
// count of the current window (cur) and of the one before (prev), and
// estimates the requests of the last W as
//
//	estimate(t) = prev × (W − t)/W + cur       t = time since the current window began
//
// treating the previous window's requests as spread evenly over it. A
// request is admitted when estimate + 1 ≤ limit. Memory is two counters
// per key; the error against an exact log is small when traffic is smooth
// and bounded by the previous window's count.
//
// The wait of a rejected request is computed, not guessed. With no new
// requests the estimate only decays, continuously and linearly:
//
//	t in [e, W):   prev × (W − t)/W + cur
//	t in [W, 2W):  cur × (2W − t)/W            (cur has become the previous window)
//	t ≥ 2W:        0
//
// so the first instant at which estimate + 1 ≤ limit is
//
//	cur + 1 ≤ limit:  t = W × (prev − (limit − cur − 1)) / prev     (within this window)
//	cur ≥ limit:      t = W + W × (cur − (limit − 1)) / cur         (within the next one)
//
// and for n units at once, the same with n in place of 1.
//
// and the wait is t − e, rounded up to the nanosecond (to the microsecond in
// Redis), so a client that retries on time is admitted. Example: limit 100
// per minute, 100 requests in the previous window, none yet in this one,
// now 100ms into it: t = 60s × (100 − 99)/100 = 600ms, a wait of 500ms.
//
// In Go the arithmetic is exact (128-bit products); the Lua scripts use
// doubles in microseconds, exact while limit × window in µs stays below
// 2^53 (for a one-minute window, limits up to 150 million).

// windowCount is the state of a window counter: the start of the window
// last counted (unix ns), its count, and the count of the window before it
// (sliding window only).
type windowCount struct {
	start, prev, cur int64
}

// maxCount bounds a window's count under charges (l.Overdraft), which
// may pass the limit: 2^40 keeps the 128-bit products' quotients, and the
// Lua scripts' doubles, exact.
const maxCount = 1 << 40

// windowStart returns the start of the window of length w holding now.
func windowStart(now, w int64) int64 { return now - now%w }

// roll moves the counter to the window holding now: the current count
// becomes the previous one when exactly one window has passed, and both are
// zero after two or more.
func (st windowCount) roll(now, w int64) windowCount {
	ws := windowStart(now, w)
	switch st.start {
	case ws:
		return st
	case ws - w:
		return windowCount{start: ws, prev: st.cur}
	}
	return windowCount{start: ws}
}

// fixedWindowTake asks for n units of a fixed window counter at now; n = 0
// decides as for one unit and counts nothing. Under l.Overdraft a take of
// n > 0 is counted whatever the count (it may pass the limit); the
// window's end forgives what went past it.
func fixedWindowTake(st windowCount, now int64, l Limit, n int64) (windowCount, Decision) {
	start, end := l.bounds(now)
	if st.start != start {
		st = windowCount{start: start} // a fixed window forgets the previous one entirely
	}
	st.prev = 0
	left := time.Duration(end - now)
	d := Decision{Limit: l.Limit, ResetAfter: left}
	if l.Charges(n) {
		st.cur = min(st.cur+n, maxCount)
		d.Allowed = true
		d.Remaining = max(l.Limit-st.cur, 0)
		return st, d
	}
	if st.cur+max(n, 1) <= l.Limit {
		st.cur += n
		d.Allowed = true
		d.Remaining = l.Limit - st.cur
		return st, d
	}
	d.RetryAfter = left
	return st, d
}

// fixedWindowRefund gives n units back to the window holding now. Units
// counted in a window that has since ended are gone with it.
func fixedWindowRefund(st windowCount, now int64, l Limit, n int64) windowCount {
	if start, _ := l.bounds(now); st.start == start {
		st.cur = max(st.cur-n, 0)
	}
	return st
}

// slidingWindowTake asks for n units of a sliding window counter at now;
// n = 0 decides as for one unit and counts nothing. Under l.Overdraft a
// take of n > 0 is counted whatever the estimate; what went past the
// limit weighs on the next window as any count does, so the debt is paid
// as the estimate decays.
func slidingWindowTake(st windowCount, now int64, l Limit, n int64) (windowCount, Decision) {
	w := int64(l.Window)
	st = st.roll(now, w)
	e := now - st.start
	d := Decision{Limit: l.Limit}
	spend := max(n, 1)
	if l.Charges(n) || slidingFits(st.prev, st.cur+spend, l.Limit, w, e) {
		if l.Charges(n) {
			n = min(n, maxCount-st.cur)
		}
		st.cur += n
		d.Allowed = true
		d.Remaining = slidingRemaining(st.prev, st.cur, l.Limit, w, e)
		d.ResetAfter = time.Duration(2*w - e)
		if st.cur == 0 {
			d.ResetAfter = time.Duration(max(w-e, 0))
			if st.prev == 0 {
				d.ResetAfter = 0
			}
		}
		return st, d
	}
	d.RetryAfter = time.Duration(slidingWait(st.prev, st.cur, l.Limit, w, e, spend))
	switch {
	case st.cur > 0:
		d.ResetAfter = time.Duration(2*w - e)
	case st.prev > 0:
		d.ResetAfter = time.Duration(w - e)
	}
	return st, d
}

// slidingWindowRefund gives n units back. They were counted in the current
// window, or, when the window turned between take and refund, in what is
// now the previous one.
func slidingWindowRefund(st windowCount, now int64, l Limit, n int64) windowCount {
	w := int64(l.Window)
	ws := windowStart(now, w)
	switch st.start {
	case ws:
		st.cur = max(st.cur-n, 0)
	case ws - w:
		st = st.roll(now, w)
		st.prev = max(st.prev-n, 0)
	}
	return st
}

// slidingFits reports whether prev × (w−e)/w + n ≤ limit, exactly.
func slidingFits(prev, n, limit, w, e int64) bool {
	lhs := mul128(prev, w-e).add(mul128(n, w))
	return lhs.cmp(mul128(limit, w)) <= 0
}

// slidingRemaining is ⌊limit − prev × (w−e)/w − cur⌋, at least 0: how many
// more units fit right now.
func slidingRemaining(prev, cur, limit, w, e int64) int64 {
	room, used := mul128(limit, w), mul128(prev, w-e).add(mul128(cur, w))
	if used.cmp(room) >= 0 {
		return 0
	}
	q, _ := room.sub(used).divmod(uint64(w))
	return int64(q)
}

// slidingWait is the time from e until estimate + n ≤ limit, with the
// counts as they are (see the design note above, there for n = 1). It
// assumes the units do not fit now. n units that exceed the limit never
// fit; the wait is then until both windows' counts are gone.
func slidingWait(prev, cur, limit, w, e, n int64) int64 {
	switch {
	case n > limit:
		return 2*w - e
	case cur+n <= limit:
		// prev > 0 here, or the units would fit.
		return ceilDiv128(mul128(w, prev-(limit-cur-n)), prev) - e
	}
	return w + ceilDiv128(mul128(w, cur-(limit-n)), cur) - e
}

// u128 is an unsigned 128-bit integer, for products of counts and
// nanosecond windows that overflow 64 bits (2^40 × a year in ns).
type u128 struct{ hi, lo uint64 }

// mul128 returns a × b for non-negative a and b.
func mul128(a, b int64) u128 {
	hi, lo := bits.Mul64(uint64(a), uint64(b))
	return u128{hi, lo}
}

func (x u128) add(y u128) u128 {
	lo, c := bits.Add64(x.lo, y.lo, 0)
	hi, _ := bits.Add64(x.hi, y.hi, c)
	return u128{hi, lo}
}

func (x u128) sub(y u128) u128 {
	lo, b := bits.Sub64(x.lo, y.lo, 0)
	hi, _ := bits.Sub64(x.hi, y.hi, b)
	return u128{hi, lo}
}

func (x u128) cmp(y u128) int {
	switch {
	case x.hi != y.hi:
		if x.hi < y.hi {
			return -1
		}
		return 1
	case x.lo < y.lo:
		return -1
	case x.lo > y.lo:
		return 1
	}
	return 0
}

// divmod divides x by d; the quotient must fit in 64 bits (x.hi < d).
func (x u128) divmod(d uint64) (q, r uint64) { return bits.Div64(x.hi, x.lo, d) }

// ceilDiv128 returns ⌈x / d⌉ for d > 0 and a quotient that fits in int64.
func ceilDiv128(x u128, d int64) int64 {
	q, r := x.divmod(uint64(d))
	if r != 0 {
		q++
	}
	return int64(q)
}
