package quota

import (
	"testing"
	"time"
)

// A request may cost several units, taken all or none, given back
// together; a cost of 0 asks without spending. Ten units a minute (one
// every 6s, a burst of 10), every number worked out by hand.
func TestUnitsEveryAlgorithm(t *testing.T) {
	type step struct {
		at      time.Duration
		units   int64 // taken; negative: given back
		allowed bool
		left    int64         // Remaining
		retry   time.Duration // RetryAfter
	}
	ten := func(a Algorithm) Limit {
		return Limit{Algorithm: a, Limit: 10, Window: time.Minute, Queue: -1, MaxDelay: 150 * time.Millisecond}
	}
	for _, tc := range []struct {
		alg   Algorithm
		steps []step
	}{{
		// 3 of 10 leave 7; 8 do not fit, one token (6s) short; a question
		// spends nothing; 7 fit; 2 given back fit again.
		alg: TokenBucket,
		steps: []step{
			{0, 3, true, 7, 0},
			{0, 8, false, 7, 6 * time.Second},
			{0, 0, true, 7, 0},
			{0, 7, true, 0, 0},
			{0, -2, false, 0, 0},
			{0, 2, true, 0, 0},
		},
	}, {
		// 8 more would make 11 in the window: not before it ends (60s).
		alg: FixedWindow,
		steps: []step{
			{0, 3, true, 7, 0},
			{0, 8, false, 0, time.Minute},
			{0, 0, true, 7, 0},
			{0, 7, true, 0, 0},
			{0, -2, false, 0, 0},
			{0, 2, true, 0, 0},
		},
	}, {
		// 8 fit once 3 × (120 − t)/60 + 8 ≤ 10: at t = 80s.
		alg: SlidingWindow,
		steps: []step{
			{0, 3, true, 7, 0},
			{0, 8, false, 0, 80 * time.Second},
			{0, 0, true, 7, 0},
			{0, 7, true, 0, 0},
			{0, -2, false, 0, 0},
			{0, 2, true, 0, 0},
		},
	}, {
		// 8 fit when one of the three entries has left: at 60s.
		alg: SlidingLog,
		steps: []step{
			{0, 3, true, 7, 0},
			{0, 8, false, 0, time.Minute},
			{0, 0, true, 7, 0},
			{0, 7, true, 0, 0},
			{0, -2, false, 0, 0},
			{0, 2, true, 0, 0},
		},
	}, {
		// Slots every 6s, held at most 150ms: three slots leave the
		// next free one 18s away, 17.85s beyond the tolerance; given
		// back, it is free again.
		alg: LeakyBucket,
		steps: []step{
			{0, 3, true, 0, 0},
			{0, 1, false, 0, 18*time.Second - 150*time.Millisecond},
			{0, -3, false, 0, 0},
			{0, 0, true, 1, 0},
			{0, 1, true, 0, 0},
		},
	}} {
		t.Run(tc.alg.String(), func(t *testing.T) {
			var s State
			l := ten(tc.alg)
			for i, st := range tc.steps {
				ns := at(st.at).UnixNano()
				if st.units < 0 {
					s.Refund(l, -st.units, ns)
					continue
				}
				d, err := s.Take(l, st.units, ns)
				if err != nil || d.Allowed != st.allowed || d.Remaining != st.left || d.RetryAfter != st.retry {
					t.Fatalf("step %d (%d units): %+v %v; want allowed=%v remaining=%d retry=%v", i, st.units, d, err, st.allowed, st.left, st.retry)
				}
			}
		})
	}
}
