package quota

import (
	"context"
	"net"
	"syscall"
	"testing"
	"time"
)

// scripted is a primary limiter that answers from Redis (remaining units
// as given) until fail is set, then fails with it.
type scripted struct {
	remaining int64
	fail      error
}

func (s *scripted) Take(_ context.Context, _ string, l Limit, _ time.Time) (Decision, error) {
	if s.fail != nil {
		return Decision{}, s.fail
	}
	return Decision{Allowed: true, Limit: l.Limit, Remaining: s.remaining}, nil
}

func (s *scripted) Refund(context.Context, string, Limit, time.Time) error { return s.fail }

// admitsAt counts the fallback admissions of key at one instant, until the
// first denial.
func admitsAt(t *testing.T, r *Resilient, key string, l Limit, at time.Time) int {
	t.Helper()
	for n := 0; n < 1000; n++ {
		d, err := r.Take(context.Background(), key, l, at)
		if err != nil {
			t.Fatal(err)
		}
		if d.Degraded != DegradedFallback {
			t.Fatalf("decision %d: %+v, want a fallback decision", n, d)
		}
		if !d.Allowed {
			return n
		}
	}
	t.Fatal("never denied")
	return 0
}

// A replica that loses Redis falls back from its share of what Redis last
// reported for the key, brought forward by what the algorithm restores,
// whatever the algorithm. Three replicas, a limit of 90 per minute (a
// share of 30), every number worked out by hand from the algorithm's
// definition.
func TestFallbackShareEveryAlgorithm(t *testing.T) {
	sec := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	type step struct {
		at   time.Time
		want int // fallback admissions at that instant, until a denial
	}
	for _, tc := range []struct {
		name      string
		l         Limit
		remaining int64     // what Redis reported
		reported  time.Time // when
		steps     []step
	}{{
		// 29 left at t0: a third is 9. Two seconds later Redis would
		// have restored 3 (one per 666ms): a third of 32 is 10, and the
		// fallback bucket (30 per minute) has refilled one of its 9.
		name: "token_bucket", l: Limit{Algorithm: TokenBucket, Limit: 90, Window: time.Minute},
		remaining: 29, reported: t0,
		steps: []step{{t0, 9}, {sec(2), 1}},
	}, {
		// 30 left in the window [0s, 60s) at 10s: 10 of them here. The
		// next window owes nothing to the report: the full share, 30.
		name: "fixed_window", l: Limit{Algorithm: FixedWindow, Limit: 90, Window: time.Minute},
		remaining: 30, reported: sec(10),
		steps: []step{{sec(20), 10}, {sec(30), 0}, {sec(60), 30}},
	}, {
		// Likewise within the window; the next window weighs this one's
		// 30 local units (30 × 50/60 = 25 at 70s): 30 − 25 = 5 fit.
		name: "sliding_window", l: Limit{Algorithm: SlidingWindow, Limit: 90, Window: time.Minute},
		remaining: 30, reported: sec(10),
		steps: []step{{sec(20), 10}, {sec(70), 5}},
	}, {
		// 30 left at 10s: 20 stand-ins for the units missing from the
		// share enter the log at 10s and leave at 70s; the 10 admitted at
		// 20s leave at 80s. At 70s: 30 − 10 = 20 fit.
		name: "sliding_log", l: Limit{Algorithm: SlidingLog, Limit: 90, Window: time.Minute},
		remaining: 30, reported: sec(10),
		steps: []step{{sec(20), 10}, {sec(69), 0}, {sec(70), 20}},
	}, {
		// A slot every 666ms with 150ms of tolerance: one request fits
		// at a time, and Redis reported the one free slot at t0. A
		// third of it is none; three slots later (2s) a third of 4 is 1.
		name: "leaky_bucket", l: Limit{Algorithm: LeakyBucket, Limit: 90, Window: time.Minute, Queue: -1, MaxDelay: 150 * time.Millisecond},
		remaining: 1, reported: t0,
		steps: []step{{t0, 0}, {sec(2), 1}},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			cache, _ := NewCache(100)
			primary := &scripted{remaining: tc.remaining}
			r := NewResilient(primary, cache, fixedPeers(3), redisUp)
			if _, err := r.Take(context.Background(), "k", tc.l, tc.reported); err != nil {
				t.Fatal(err)
			}
			primary.fail = ErrStoreDown
			for i, s := range tc.steps {
				if got := admitsAt(t, r, "k", tc.l, s.at); got != s.want {
					t.Fatalf("step %d at %v: fallback admitted %d, want %d", i, s.at.Sub(t0), got, s.want)
				}
			}
		})
	}
}

// A call that failed while Redis is up (a timeout, say) may have spent
// units in Redis. For a key Redis never reported on, the fallback starts
// empty and refills at the share's rate, rather than handing out a fresh
// share; while the store is marked down, or when the call certainly did
// not run, a new key gets its fresh share.
func TestFallbackAfterAFailedCallStartsEmpty(t *testing.T) {
	cache, _ := NewCache(100)
	l := Limit{Limit: 90, Window: time.Minute, OnError: ErrorFallback}
	timedOut := NewResilient(&scripted{fail: context.DeadlineExceeded}, cache, fixedPeers(3), redisUp)
	d, err := timedOut.Take(context.Background(), "new", l, t0)
	if err != nil || d.Allowed || d.Degraded != DegradedFallback || d.RetryAfter != 2*time.Second {
		t.Fatalf("after a timeout, a key never reported on: %+v %v; want denied, retry in 2s (a share of 30 per minute)", d, err)
	}
	if got := admitsAt(t, timedOut, "new", l, t0.Add(2*time.Second)); got != 1 {
		t.Fatalf("2s later: %d admitted, want the 1 the share refilled", got)
	}
	down := NewResilient(&scripted{fail: ErrStoreDown}, cache, fixedPeers(3), redisUp)
	if got := admitsAt(t, down, "other", l, t0); got != 30 {
		t.Fatalf("store down, a key never reported on: %d admitted, want a fresh share of 30", got)
	}
	// A timeout that the breaker confirms as Redis going down is an
	// outage: a fresh share.
	outage := NewResilient(&scripted{fail: context.DeadlineExceeded}, cache, fixedPeers(3), verdict(true))
	if got := admitsAt(t, outage, "fourth", l, t0); got != 30 {
		t.Fatalf("a timeout confirmed as an outage, a key never reported on: %d admitted, want a fresh share of 30", got)
	}
	// A refused connection certainly ran nothing: a fresh share too.
	refused := NewResilient(&scripted{fail: &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}}, cache, fixedPeers(3), redisUp)
	if got := admitsAt(t, refused, "third", l, t0); got != 30 {
		t.Fatalf("connection refused, a key never reported on: %d admitted, want a fresh share of 30", got)
	}
	// A transient failure does not reset what the fallback already spent.
	if got := admitsAt(t, timedOut, "other", l, t0); got != 0 {
		t.Fatalf("after a timeout, a key whose share is spent: %d admitted, want 0", got)
	}
}

// verdict is a breaker whose verdict on every failed call is fixed.
type verdict bool

func (v verdict) AwaitVerdict(context.Context) bool { return bool(v) }

// redisUp says every failed call happened while Redis was up.
const redisUp = verdict(false)
