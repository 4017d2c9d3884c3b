package quota

import (
	"testing"
	"time"
)

func TestSlidingLogSteps(t *testing.T) {
	l := Limit{Algorithm: SlidingLog, Limit: 3, Window: 10 * time.Second}
	g := &timeLog{}
	for i, s := range []windowStep{
		{1 * time.Second, true, 2, 0, 10 * time.Second},
		{2 * time.Second, true, 1, 0, 10 * time.Second},
		{4 * time.Second, true, 0, 0, 10 * time.Second},
		// Full: the entry at +1s leaves at +11s; the newest at +14s.
		{5 * time.Second, false, 0, 6 * time.Second, 9 * time.Second},
		// At +11s the entry at +1s is out of (1s, 11s]: exactly then.
		{11 * time.Second, true, 0, 0, 10 * time.Second},
		{11 * time.Second, false, 0, time.Second, 10 * time.Second},
		{30 * time.Second, true, 2, 0, 10 * time.Second},
	} {
		d := slidingLogTake(g, at(s.t).UnixNano(), l, 1)
		if d.Allowed != s.allowed || d.Remaining != s.remaining || d.RetryAfter != s.retry || d.ResetAfter != s.reset {
			t.Fatalf("step %d at +%v: got allowed=%v remaining=%d retry=%v reset=%v; want %v %d %v %v",
				i, s.t, d.Allowed, d.Remaining, d.RetryAfter, d.ResetAfter, s.allowed, s.remaining, s.retry, s.reset)
		}
	}
	if g.n != 1 || len(g.ts) > 3 {
		t.Fatalf("log holds %d entries in a ring of %d, want 1 in at most 3", g.n, len(g.ts))
	}
}

// The ring never holds more than the limit, and a lowered limit makes the
// newest entries decide.
func TestSlidingLogBoundedByLimit(t *testing.T) {
	l := Limit{Algorithm: SlidingLog, Limit: 1000, Window: time.Hour}
	g := &timeLog{}
	for i := 0; i < 5000; i++ {
		slidingLogTake(g, at(time.Duration(i)*time.Millisecond).UnixNano(), l, 1)
	}
	if g.n != 1000 || len(g.ts) != 1000 {
		t.Fatalf("%d entries in a ring of %d; want both 1000", g.n, len(g.ts))
	}
	l.Limit = 10
	d := slidingLogTake(g, at(5*time.Second).UnixNano(), l, 1)
	// The newest 10 were admitted at +990ms..+999ms; the oldest of them
	// leaves at +990ms + 1h.
	if d.Allowed || d.RetryAfter != time.Hour+990*time.Millisecond-5*time.Second {
		t.Fatalf("after lowering the limit: %+v", d)
	}
	// Everything expires: the ring's memory is released.
	slidingLogTake(g, at(3*time.Hour).UnixNano(), l, 1)
	if g.n != 1 || len(g.ts) != 8 {
		t.Fatalf("after expiry: %d entries in a ring of %d", g.n, len(g.ts))
	}
}
