package quota

import (
	"math/big"
	"math/rand/v2"
	"testing"
	"time"
)

// t0 is on a minute (and an hour): windows of 1m start at t0 + k minutes.
func TestT0IsOnAWindowBoundary(t *testing.T) {
	if windowStart(t0.UnixNano(), int64(time.Hour)) != t0.UnixNano() {
		t.Fatalf("t0 %v is not on an hour: the window tests below assume it", t0)
	}
}

type windowStep struct {
	t         time.Duration // since t0
	allowed   bool
	remaining int64
	retry     time.Duration
	reset     time.Duration
}

func runWindowSteps(t *testing.T, take func(windowCount, int64, Limit, int64) (windowCount, Decision), l Limit, steps []windowStep) windowCount {
	t.Helper()
	var st windowCount
	for i, s := range steps {
		var d Decision
		st, d = take(st, at(s.t).UnixNano(), l, 1)
		if d.Allowed != s.allowed || d.Remaining != s.remaining || d.RetryAfter != s.retry || d.ResetAfter != s.reset || d.Limit != l.Limit {
			t.Fatalf("step %d at +%v: got allowed=%v remaining=%d retry=%v reset=%v; want %v %d %v %v",
				i, s.t, d.Allowed, d.Remaining, d.RetryAfter, d.ResetAfter, s.allowed, s.remaining, s.retry, s.reset)
		}
	}
	return st
}

func TestFixedWindowSteps(t *testing.T) {
	l := Limit{Algorithm: FixedWindow, Limit: 2, Window: 10 * time.Second}
	st := runWindowSteps(t, fixedWindowTake, l, []windowStep{
		{1 * time.Second, true, 1, 0, 9 * time.Second},
		{2 * time.Second, true, 0, 0, 8 * time.Second},
		{9 * time.Second, false, 0, time.Second, time.Second},
		{10 * time.Second, true, 1, 0, 10 * time.Second}, // a new window: the count starts again
		{10 * time.Second, true, 0, 0, 10 * time.Second},
		{15 * time.Second, false, 0, 5 * time.Second, 5 * time.Second},
		{45 * time.Second, true, 1, 0, 5 * time.Second}, // windows later, nothing is left of the old count
	})
	// A refund in the same window gives the unit back; one from a window
	// that has ended gives nothing.
	st = fixedWindowRefund(st, at(46*time.Second).UnixNano(), l, 1)
	if st.cur != 0 {
		t.Fatalf("after refund cur = %d, want 0", st.cur)
	}
	st.cur = 2
	if got := fixedWindowRefund(st, at(50*time.Second).UnixNano(), l, 1); got.cur != 2 || got.start != st.start {
		t.Fatalf("refund into the next window changed the old one: %+v", got)
	}
}

func TestSlidingWindowSteps(t *testing.T) {
	// 10 per 10s. The previous window's count weighs (10s − t)/10s.
	l := Limit{Algorithm: SlidingWindow, Limit: 10, Window: 10 * time.Second}
	var steps []windowStep
	for i := int64(0); i < 10; i++ {
		steps = append(steps, windowStep{5 * time.Second, true, 9 - i, 0, 15 * time.Second})
	}
	steps = append(steps,
		// cur = 10 = limit: the next fits once this count, become the
		// previous window, weighs 9: t = 10s + 10s × (10 − 9)/10 = 11s.
		windowStep{5 * time.Second, false, 0, 6 * time.Second, 15 * time.Second},
		// +11s: prev 10 × 0.9 = 9, + 1 = 10 ≤ 10.
		// Fully restored once this window's count has decayed too: 19s.
		windowStep{11 * time.Second, true, 0, 0, 19 * time.Second},
		// prev 9 + cur 1 + 1 > 10: wait for prev × (10s − t)/10s ≤ 8, t = 12s.
		windowStep{11 * time.Second, false, 0, time.Second, 19 * time.Second},
		windowStep{12 * time.Second, true, 0, 0, 18 * time.Second},
		// +15s: 10 × 0.5 + 2 = 7 in use: 3 fit.
		windowStep{15 * time.Second, true, 2, 0, 15 * time.Second},
		windowStep{15 * time.Second, true, 1, 0, 15 * time.Second},
		windowStep{15 * time.Second, true, 0, 0, 15 * time.Second},
		// prev × (10s − t)/10s + 5 + 1 ≤ 10 from t = 6s.
		windowStep{15 * time.Second, false, 0, time.Second, 15 * time.Second},
		// Two windows later both counts are gone.
		windowStep{31 * time.Second, true, 9, 0, 19 * time.Second},
	)
	runWindowSteps(t, slidingWindowTake, l, steps)
}

// The wait a rejected request is given is the first instant it fits: one
// nanosecond earlier it would still be rejected.
func TestSlidingWindowWaitIsExact(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	for i := 0; i < 20000; i++ {
		l := Limit{Algorithm: SlidingWindow, Limit: 1 + rng.Int64N(200), Window: time.Duration(1+rng.Int64N(120)) * time.Second}
		w := int64(l.Window)
		st := windowCount{start: windowStart(t0.UnixNano(), w), prev: rng.Int64N(3 * l.Limit), cur: rng.Int64N(l.Limit + 2)}
		now := st.start + rng.Int64N(w)
		_, d := slidingWindowTake(st, now, l, 1)
		if d.Allowed {
			continue
		}
		wait := int64(d.RetryAfter)
		if wait <= 0 {
			t.Fatalf("%+v at +%d: rejected with wait %v", st, now-st.start, d.RetryAfter)
		}
		if _, d2 := slidingWindowTake(st, now+wait, l, 1); !d2.Allowed {
			t.Fatalf("%+v limit %d: rejected again after the wait %v", st, l.Limit, d.RetryAfter)
		}
		if _, d2 := slidingWindowTake(st, now+wait-1, l, 1); d2.Allowed {
			t.Fatalf("%+v limit %d: admitted 1ns before the wait %v", st, l.Limit, d.RetryAfter)
		}
	}
}

// The 128-bit helpers agree with math/big at the extremes the
// configuration allows (limit 2^40, window 366 days).
func TestU128(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	maxW := int64(366 * 24 * time.Hour)
	for i := 0; i < 10000; i++ {
		a, b, c := rng.Int64N(1<<40), rng.Int64N(maxW), 1+rng.Int64N(1<<40)
		x := mul128(a, b)
		want := new(big.Int).Mul(big.NewInt(a), big.NewInt(b))
		got := new(big.Int).Or(new(big.Int).Lsh(new(big.Int).SetUint64(x.hi), 64), new(big.Int).SetUint64(x.lo))
		if got.Cmp(want) != 0 {
			t.Fatalf("mul128(%d, %d) = %v, want %v", a, b, got, want)
		}
		if b == 0 || a > c {
			continue
		}
		// ⌈a×b / c⌉ with a ≤ c fits in int64.
		q := ceilDiv128(x, c)
		wq, r := new(big.Int).QuoRem(want, big.NewInt(c), new(big.Int))
		if r.Sign() != 0 {
			wq.Add(wq, big.NewInt(1))
		}
		if wq.Int64() != q {
			t.Fatalf("ceilDiv128(%d×%d, %d) = %d, want %v", a, b, c, q, wq)
		}
	}
}
