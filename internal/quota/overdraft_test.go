package quota

import (
	"testing"
	"time"
)

// charge is one step of a charge: always limit: n units taken at t (n = 0
// asks), and what the decision must be.
type charge struct {
	t         time.Duration
	n         int64
	allowed   bool
	remaining int64
	retry     time.Duration // checked when not allowed
}

func runCharges(t *testing.T, l Limit, steps []charge) {
	t.Helper()
	var s State
	for i, c := range steps {
		d, err := s.Take(l, c.n, at(c.t).UnixNano())
		if err != nil {
			t.Fatal(err)
		}
		if d.Allowed != c.allowed || d.Remaining != c.remaining || !c.allowed && d.RetryAfter != c.retry {
			t.Fatalf("step %d (%d units at +%v): allowed=%v remaining=%d retry=%v; want %v %d %v",
				i, c.n, c.t, d.Allowed, d.Remaining, d.RetryAfter, c.allowed, c.remaining, c.retry)
		}
	}
}

func TestOverdraftTokenBucket(t *testing.T) {
	// 10 per 10s: a unit a second. A charge of 25 at once leaves a debt
	// of 15; the first unit is back 16s later.
	l := Limit{Algorithm: TokenBucket, Limit: 10, Window: 10 * time.Second, Overdraft: true}
	runCharges(t, l, []charge{
		{0, 0, true, 10, 0},
		{0, 25, true, 0, 0},                              // a charge is never refused
		{0, 0, false, 0, 16 * time.Second},               // in debt: a question is denied until one unit is back
		{10 * time.Second, 0, false, 0, 6 * time.Second}, // refill pays the debt first
		{16 * time.Second, 0, true, 1, 0},                // one unit is back
		{16 * time.Second, 3, true, 0, 0},                // charged into debt again
		{16 * time.Second, 0, false, 0, 3 * time.Second}, // 2 in debt: 3s to one unit
		{19 * time.Second, 0, true, 1, 0},                // queries spend nothing
		{19 * time.Second, 0, true, 1, 0},
		{100 * time.Second, 0, true, 10, 0}, // paid off and full
	})
}

func TestOverdraftFixedWindow(t *testing.T) {
	// 10 per 10s: the count may pass the limit; the window's end forgives it.
	l := Limit{Algorithm: FixedWindow, Limit: 10, Window: 10 * time.Second, Overdraft: true}
	runCharges(t, l, []charge{
		{0, 0, true, 10, 0},
		{1 * time.Second, 8, true, 2, 0},
		{2 * time.Second, 30, true, 0, 0},               // 38 of 10
		{3 * time.Second, 0, false, 0, 7 * time.Second}, // until the window ends
		{9 * time.Second, 1, true, 0, 0},                // still charged
		{10 * time.Second, 0, true, 10, 0},              // the next window starts afresh: the debt is forgiven
	})
}

func TestOverdraftSlidingWindow(t *testing.T) {
	// 10 per 10s: 20 charged in the first window weigh on the next one
	// until the estimate is below 10: 20 × (10s − t)/10s ≤ 9 at t = 5.5s.
	l := Limit{Algorithm: SlidingWindow, Limit: 10, Window: 10 * time.Second, Overdraft: true}
	runCharges(t, l, []charge{
		{0, 20, true, 0, 0},
		{5 * time.Second, 0, false, 0, 10*time.Second + 5500*time.Millisecond - 5*time.Second},
		{15500 * time.Millisecond, 0, true, 1, 0},
		{30 * time.Second, 0, true, 10, 0},
	})
}

// TestOverdraftOff checks that without Overdraft a take past the limit is
// refused and counts nothing, as before.
func TestOverdraftOff(t *testing.T) {
	for _, a := range []Algorithm{TokenBucket, FixedWindow, SlidingWindow} {
		l := Limit{Algorithm: a, Limit: 10, Window: 10 * time.Second}
		var s State
		s.Take(l, 8, t0.UnixNano())
		if d, _ := s.Take(l, 3, t0.UnixNano()); d.Allowed {
			t.Fatalf("%s: 3 units past 2 remaining allowed", a)
		}
		if d, _ := s.Take(l, 2, t0.UnixNano()); !d.Allowed || d.Remaining != 0 {
			t.Fatalf("%s: the refused take counted: %+v", a, d)
		}
	}
}
