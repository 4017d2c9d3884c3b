package quota

import (
	"testing"
	"time"
)

type leakyStep struct {
	t         time.Duration // since t0
	allowed   bool
	delay     time.Duration
	remaining int64
	retry     time.Duration
}

func runLeakySteps(t *testing.T, l Limit, steps []leakyStep) {
	t.Helper()
	var tat int64
	for i, s := range steps {
		var d Decision
		tat, d = leakyBucketTake(tat, at(s.t).UnixNano(), l, 1)
		if d.Allowed != s.allowed || d.Delay != s.delay || d.Remaining != s.remaining || d.RetryAfter != s.retry {
			t.Fatalf("step %d at +%v: got allowed=%v delay=%v remaining=%d retry=%v; want %v %v %d %v",
				i, s.t, d.Allowed, d.Delay, d.Remaining, d.RetryAfter, s.allowed, s.delay, s.remaining, s.retry)
		}
	}
}

func TestLeakyBucketSteps(t *testing.T) {
	// 10 per second: a slot every 100ms, held at most 150ms.
	l := Limit{Algorithm: LeakyBucket, Limit: 10, Window: time.Second, MaxDelay: 150 * time.Millisecond, Queue: -1}
	runLeakySteps(t, l, []leakyStep{
		{0, true, 0, 1, 0},
		{0, true, 100 * time.Millisecond, 0, 0},
		// The next slot is 200ms away: 50ms over max_delay.
		{0, false, 0, 0, 50 * time.Millisecond},
		{50 * time.Millisecond, true, 150 * time.Millisecond, 0, 0},
		// An idle bucket passes the next request at once.
		{time.Second, true, 0, 1, 0},
	})
}

func TestLeakyBucketQueue(t *testing.T) {
	base := Limit{Algorithm: LeakyBucket, Limit: 10, Window: time.Second, MaxDelay: 150 * time.Millisecond}
	// queue 1: one request may wait, and for at most one slot (100ms).
	l := base
	l.Queue = 1
	runLeakySteps(t, l, []leakyStep{
		{0, true, 0, 1, 0},
		{0, true, 100 * time.Millisecond, 0, 0},
		{0, false, 0, 0, 100 * time.Millisecond},
		{50 * time.Millisecond, false, 0, 0, 50 * time.Millisecond},
		{100 * time.Millisecond, true, 100 * time.Millisecond, 0, 0},
	})
	// queue 0: nobody waits; requests pass only at their slot.
	l.Queue = 0
	runLeakySteps(t, l, []leakyStep{
		{0, true, 0, 0, 0},
		{0, false, 0, 0, 100 * time.Millisecond},
		{100 * time.Millisecond, true, 0, 0, 0},
	})
	if got := (Limit{Limit: 10, Window: time.Second, MaxDelay: 150 * time.Millisecond, Queue: 1 << 40}).Tolerance(); got != int64(150*time.Millisecond) {
		t.Fatalf("a huge queue: tolerance %v, want max_delay", time.Duration(got))
	}
}

// A refunded slot is the next request's: the queue does not grow.
func TestLeakyBucketRefund(t *testing.T) {
	l := Limit{Algorithm: LeakyBucket, Limit: 10, Window: time.Second, MaxDelay: 150 * time.Millisecond, Queue: -1}
	now := at(0).UnixNano()
	tat, _ := leakyBucketTake(0, now, l, 1)
	tat, d := leakyBucketTake(tat, now, l, 1)
	if d.Delay != 100*time.Millisecond {
		t.Fatalf("second request: %+v", d)
	}
	tat = leakyBucketRefund(tat, now, l, 1)
	if _, d = leakyBucketTake(tat, now, l, 1); !d.Allowed || d.Delay != 100*time.Millisecond {
		t.Fatalf("after a refund the slot is free again: %+v", d)
	}
	// Refunds never make a slot in the past.
	if got := leakyBucketRefund(now, now+int64(time.Second), l, 1); got != now+int64(time.Second) {
		t.Fatalf("refund of an empty bucket = %d", got)
	}
}
