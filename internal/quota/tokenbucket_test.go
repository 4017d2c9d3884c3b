package quota

import (
	"testing"
	"time"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func at(d time.Duration) time.Time { return t0.Add(d) }

type step struct {
	t         time.Duration // since t0
	allowed   bool
	remaining int64
	retry     time.Duration
	reset     time.Duration
}

func runSteps(t *testing.T, l Limit, steps []step) {
	t.Helper()
	var tat int64
	for i, s := range steps {
		var d Decision
		tat, d = tokenBucketTake(tat, at(s.t).UnixNano(), l, 1)
		if d.Allowed != s.allowed || d.Remaining != s.remaining || d.RetryAfter != s.retry || d.ResetAfter != s.reset {
			t.Fatalf("step %d at +%v: got allowed=%v remaining=%d retry=%v reset=%v; want %v %d %v %v",
				i, s.t, d.Allowed, d.Remaining, d.RetryAfter, d.ResetAfter, s.allowed, s.remaining, s.retry, s.reset)
		}
		if d.Limit != l.Limit {
			t.Fatalf("step %d: Limit = %d, want %d", i, d.Limit, l.Limit)
		}
	}
}

func TestTokenBucketSteps(t *testing.T) {
	// 3 per 3s: one token a second, capacity 3.
	l := Limit{Limit: 3, Window: 3 * time.Second}
	runSteps(t, l, []step{
		{0, true, 2, 0, 1 * time.Second},
		{0, true, 1, 0, 2 * time.Second},
		{0, true, 0, 0, 3 * time.Second},
		{0, false, 0, 1 * time.Second, 3 * time.Second},
		{500 * time.Millisecond, false, 0, 500 * time.Millisecond, 2500 * time.Millisecond},
		{1 * time.Second, true, 0, 0, 3 * time.Second},
		{1 * time.Second, false, 0, 1 * time.Second, 3 * time.Second},
		// Quiet for a long time: the bucket is full again, never fuller.
		{time.Minute, true, 2, 0, 1 * time.Second},
	})
}

func TestTokenBucketBurst(t *testing.T) {
	// 60 per minute with a burst of 5: five at once, then one a second.
	l := Limit{Limit: 60, Window: time.Minute, Burst: 5}
	var steps []step
	for i := int64(0); i < 5; i++ {
		steps = append(steps, step{0, true, 4 - i, 0, time.Duration(i+1) * time.Second})
	}
	steps = append(steps,
		step{0, false, 0, time.Second, 5 * time.Second},
		step{time.Second, true, 0, 0, 5 * time.Second},
	)
	runSteps(t, l, steps)
}

func TestTokenBucketRefundNeverOverfills(t *testing.T) {
	l := Limit{Limit: 10, Window: 10 * time.Second}
	now := at(0).UnixNano()
	tat, d := tokenBucketTake(0, now, l, 1)
	if !d.Allowed || d.Remaining != 9 {
		t.Fatalf("first take: %+v", d)
	}
	tat = tokenBucketRefund(tat, now, l, 1)
	tat = tokenBucketRefund(tat, now, l, 1) // a second refund must not add an 11th token
	var got int
	for i := 0; i < 20; i++ {
		var d Decision
		if tat, d = tokenBucketTake(tat, now, l, 1); d.Allowed {
			got++
		}
	}
	if got != 10 {
		t.Fatalf("after refunds, a full bucket admitted %d, want 10", got)
	}
}

func TestTokenBucketExactOverWindow(t *testing.T) {
	// 100 per minute, a request every 10ms for two minutes: the first
	// minute admits the burst of 100 plus what refills, and steady state
	// admits exactly one per 600ms.
	l := Limit{Limit: 100, Window: time.Minute}
	var tat int64
	admitted := 0
	for ms := 0; ms < 120_000; ms += 10 {
		var d Decision
		tat, d = tokenBucketTake(tat, at(time.Duration(ms)*time.Millisecond).UnixNano(), l, 1)
		if d.Allowed {
			admitted++
		}
	}
	// capacity 100 + refill over 119.99s at 1 per 600ms = 100 + 199 = 299
	if admitted != 299 {
		t.Fatalf("admitted %d over two minutes, want 299", admitted)
	}
}
