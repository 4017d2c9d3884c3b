package engine

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/extauthz/extauthz/internal/config"
	"github.com/extauthz/extauthz/internal/quota"
	"github.com/extauthz/extauthz/internal/quota/local"
)

// eachRig is two local fixed-window policies of a minute, first (2) and
// second (4), taken each as envoyproxy/ratelimit counts a request's
// descriptors.
type eachRig struct {
	t             *testing.T
	m             *Metrics
	first, second *Policy
	now           time.Time
	stopOver      bool
}

func newEachRig(t *testing.T, stopOver bool) *eachRig {
	m := NewMetrics(nil)
	table, _ := local.NewTable(100)
	return &eachRig{t: t, m: m, stopOver: stopOver,
		first:  standalone(t, m, table, config.Policy{Name: "first", Limit: 2, Window: time.Minute}),
		second: standalone(t, m, table, config.Policy{Name: "second", Limit: 4, Window: time.Minute}),
		now:    time.Unix(1_700_000_040, 0), // a minute starts
	}
}

// take asks for units[i] of each policy given (nil: left out).
func (r *eachRig) take(takes ...Taken) (Outcome, []Taken) {
	r.t.Helper()
	o, asked, err := TakeEach(context.Background(), takes, r.now, nil, EachOptions{StopOver: r.stopOver})
	if err != nil || asked != len(takes) {
		r.t.Fatalf("TakeEach: %v, %d asked of %d", err, asked, len(takes))
	}
	return o, takes
}

func (r *eachRig) of(p *Policy, units int64) Taken {
	return Taken{Policy: p, Key: p.Name, Limit: p.FixedLimit(), Units: units}
}

// A request of two descriptors whose first is over: the first is denied
// and its hit still counts (the count passes the limit), the second is
// asked and counts, nothing is refunded, and each status says what its
// own count leaves, as envoyproxy/ratelimit's INCRBY per descriptor does.
func TestTakeEachCountsEveryDescriptor(t *testing.T) {
	r := newEachRig(t, false)
	for i := 0; i < 2; i++ {
		if o, _ := r.take(r.of(r.first, 1)); o != OK {
			t.Fatalf("first alone, call %d: %v", i+1, o)
		}
	}
	o, takes := r.take(r.of(r.first, 1), r.of(r.second, 1))
	if o != OverLimit || takes[0].OK || !takes[1].OK || takes[1].Decision.Remaining != 3 {
		t.Fatalf("both, the first over: %v %+v", o, takes)
	}
	// The second's hit stayed: 2 left after this one, not 3.
	if o, takes := r.take(r.of(r.second, 1)); o != OK || takes[0].Decision.Remaining != 2 {
		t.Fatalf("second alone after: %v %+v", o, takes)
	}
	// The first's count is 3: a question (0 hits) finds it over (the
	// anchor's INCRBY 0 reads 3 > 2).
	if o, takes := r.take(r.of(r.first, 0)); o != OverLimit || takes[0].OK {
		t.Fatalf("question of first: %v %+v", o, takes)
	}
	for _, c := range []struct {
		policy, result string
		want           float64
	}{{"first", "allowed", 2}, {"first", "denied", 2}, {"first", "refunded", 0}, {"second", "allowed", 2}, {"second", "refunded", 0}} {
		if got := testutil.ToFloat64(r.m.Decisions.WithLabelValues(c.policy, "local", c.result)); got != c.want {
			t.Errorf("%s %s = %v, want %v", c.policy, c.result, got, c.want)
		}
	}
}

// A limit raised after denied requests sees them: 5 hits at a limit of 2
// count 5, so at 6 one more is allowed (remaining 0), then none.
func TestTakeEachRaisedLimitSeesDeniedHits(t *testing.T) {
	r := newEachRig(t, false)
	for i := 0; i < 5; i++ {
		if o, _ := r.take(r.of(r.first, 1)); (o == OK) != (i < 2) {
			t.Fatalf("call %d at 2: %v", i+1, o)
		}
	}
	raised := r.first.NewLimit(6, time.Minute)
	take := func(units int64) (Outcome, Taken) {
		o, takes := r.take(Taken{Policy: r.first, Key: "first", Limit: raised, Units: units})
		return o, takes[0]
	}
	// A question at 5 of 6: OK, 1 remaining.
	if o, tk := take(0); o != OK || tk.Decision.Remaining != 1 || tk.Decision.Limit != 6 {
		t.Fatalf("question at 5 of 6: %v %+v", o, tk.Decision)
	}
	if o, tk := take(1); o != OK || tk.Decision.Remaining != 0 {
		t.Fatalf("at 6: %v %+v", o, tk.Decision)
	}
	// A question at exactly the limit is OK with 0 remaining, as the
	// anchor answers (our all-or-nothing question would deny it).
	if o, tk := take(0); o != OK || tk.Decision.Remaining != 0 {
		t.Fatalf("question at 6 of 6: %v %+v", o, tk.Decision)
	}
	if o, _ := take(1); o != OverLimit {
		t.Fatalf("at 7 of 6: %v", o)
	}
	if o, _ := take(0); o != OverLimit {
		t.Fatalf("question at 7 of 6: %v", o)
	}
}

// hits_addend > 1: a take of 3 at a limit of 4 leaves 1; the next 3 are
// over and counted (6), so the limit raised to 7 admits exactly 1 more.
func TestTakeEachHitsAddend(t *testing.T) {
	r := newEachRig(t, false)
	if o, takes := r.take(r.of(r.second, 3)); o != OK || takes[0].Decision.Remaining != 1 {
		t.Fatalf("3 of 4: %v %+v", o, takes)
	}
	if o, takes := r.take(r.of(r.second, 3)); o != OverLimit || takes[0].OK {
		t.Fatalf("6 of 4: %v %+v", o, takes)
	}
	// More than the limit at once is over, and counted too (as the
	// anchor's INCRBY of it is): 6 + 5 = 11.
	if o, _ := r.take(r.of(r.second, 5)); o != OverLimit {
		t.Fatalf("5 at once: %v", o)
	}
	raised := r.second.NewLimit(12, time.Minute)
	o, takes := r.take(Taken{Policy: r.second, Key: "second", Limit: raised, Units: 1})
	if o != OK || takes[0].Decision.Remaining != 0 {
		t.Fatalf("12 of 12: %v %+v", o, takes)
	}
	if o, _ := r.take(Taken{Policy: r.second, Key: "second", Limit: raised, Units: 1}); o != OverLimit {
		t.Fatalf("13 of 12: %v", o)
	}
}

// Under STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT (each_stop_when_over),
// a request with a descriptor over counts only the descriptors over: the
// second's hit is given back and its status says the remaining it found;
// the first's still counts. A request none of whose descriptors is over
// counts them all.
func TestTakeEachStopWhenOver(t *testing.T) {
	r := newEachRig(t, true)
	if o, takes := r.take(r.of(r.first, 1), r.of(r.second, 1)); o != OK || takes[0].Decision.Remaining != 1 || takes[1].Decision.Remaining != 3 {
		t.Fatalf("both within: %v %+v", o, takes)
	}
	if o, _ := r.take(r.of(r.first, 1)); o != OK {
		t.Fatalf("first at 2: %v", o)
	}
	for i := 0; i < 2; i++ {
		o, takes := r.take(r.of(r.first, 1), r.of(r.second, 1))
		if o != OverLimit || takes[0].OK || !takes[1].OK || takes[1].Decision.Remaining != 3 {
			t.Fatalf("both, the first over, call %d: %v %+v", i+1, o, takes)
		}
	}
	// The second counted 1 (the first request) only: 3 more fit.
	for i := 0; i < 3; i++ {
		if o, _ := r.take(r.of(r.second, 1)); o != OK {
			t.Fatalf("second alone, call %d: %v", i+1, o)
		}
	}
	if got := testutil.ToFloat64(r.m.Decisions.WithLabelValues("second", "local", "refunded")); got != 2 {
		t.Errorf("second refunded = %v, want 2", got)
	}
	// The first counted its denied hits: at 4 of 2, a limit raised to 4
	// answers a question OK with 0 remaining, and denies a hit.
	raised := r.first.NewLimit(4, time.Minute)
	if o, takes := r.take(Taken{Policy: r.first, Key: "first", Limit: raised, Units: 0}); o != OK || takes[0].Decision.Remaining != 0 {
		t.Fatalf("question at 4 of 4: %v %+v", o, takes)
	}
	if o, _ := r.take(Taken{Policy: r.first, Key: "first", Limit: raised, Units: 1}); o != OverLimit {
		t.Fatalf("5 of 4: %v", o)
	}
}

// In hybrid mode the denied hits of a fixed window are charged summed:
// the key's first at once, the next ones at most once per interval, the
// rest by Flush (a reload); a window that ends forgives what it held.
// (The hybrid limiter is a local one here: what is counted is the same.)
func TestTakeEachDefersHybridCharges(t *testing.T) {
	p, counting := countedWindowPolicy(t, config.ModeHybrid, 2, time.Minute)
	deferred := NewDeferredCharges(time.Second)
	start := time.Unix(1_700_000_040, 0) // a minute starts
	take := func(at time.Duration, l Limit) Outcome {
		o, _, err := TakeEach(context.Background(), []Taken{{Policy: p, Key: "k", Limit: l, Units: 1}}, start.Add(at), nil, EachOptions{Deferred: deferred})
		if err != nil {
			t.Fatal(err)
		}
		return o
	}
	for i := 0; i < 2; i++ {
		take(0, p.FixedLimit())
	}
	counting.charges = 0
	// 10 denied in the first half second: the first charged at once,
	// 9 held.
	for i := 0; i < 10; i++ {
		if o := take(time.Duration(i)*50*time.Millisecond, p.FixedLimit()); o != OverLimit {
			t.Fatalf("denied %d: %v", i, o)
		}
	}
	if counting.charges != 1 || deferred.Pending() != 9 {
		t.Fatalf("after 10 denied in 0.5s: %d charges, %d pending; want 1, 9", counting.charges, deferred.Pending())
	}
	// A second later, the next denied hit charges the 9 and itself.
	take(1100*time.Millisecond, p.FixedLimit())
	if counting.charges != 2 || deferred.Pending() != 0 {
		t.Fatalf("a second later: %d charges, %d pending; want 2, 0", counting.charges, deferred.Pending())
	}
	take(1200*time.Millisecond, p.FixedLimit()) // held
	if n := deferred.Flush(context.Background(), start.Add(1300*time.Millisecond)); n != 1 || deferred.Pending() != 0 {
		t.Fatalf("flush: %d keys, %d pending", n, deferred.Pending())
	}
	// Counted: 2 + 10 + 1 + 1 = 14; at 15 one more fits, then none.
	raised := p.NewLimit(15, time.Minute)
	if o := take(1400*time.Millisecond, raised); o != OK {
		t.Fatalf("at 15 of 15: %v", o)
	}
	if o := take(1500*time.Millisecond, raised); o != OverLimit {
		t.Fatalf("at 16 of 15: %v", o)
	}
	// Held in a window that ended: forgotten, not charged into the next.
	take(1600*time.Millisecond, raised) // held (the last charge was at 1.5s)
	if n := deferred.Flush(context.Background(), start.Add(61*time.Second)); n != 0 {
		t.Fatalf("flush in the next window charged %d keys", n)
	}
	// More than the limit at once: over until the window ends, and its
	// hits charged as the key's other denied hits are (the first at once).
	counting.charges = 0
	takes := []Taken{{Policy: p, Key: "k2", Limit: p.FixedLimit(), Units: 3}}
	o, _, err := TakeEach(context.Background(), takes, start.Add(10*time.Second), nil, EachOptions{Deferred: deferred})
	if err != nil || o != OverLimit || takes[0].Decision.ResetAfter != 50*time.Second || counting.charges != 1 {
		t.Fatalf("3 at once of 2: %v %v %+v, %d charges", o, err, takes[0].Decision, counting.charges)
	}
}

// countingLimiter counts the charges made through it, and their units.
type countingLimiter struct {
	quota.Limiter
	mu      sync.Mutex
	charges int
	units   int64
}

func (c *countingLimiter) Take(ctx context.Context, key string, l quota.Limit, n int64, now time.Time) (quota.Decision, error) {
	if l.Charges(n) {
		c.mu.Lock()
		c.charges++
		c.units += n
		c.mu.Unlock()
	}
	return c.Limiter.Take(ctx, key, l, n, now)
}

// Denied hits from many callers at once, with flushes among them: every
// hit is charged once or still held, none lost or charged twice (run
// under -race).
func TestDeferredChargesConcurrent(t *testing.T) {
	p, counting := countedWindowPolicy(t, config.ModeRedis, 1, time.Hour)
	deferred := NewDeferredCharges(time.Millisecond)
	start := time.Unix(1_700_002_800, 0) // an hour starts
	keys := []string{"a", "b", "c", "d"}
	for _, k := range keys { // each key at its limit
		TakeEach(context.Background(), []Taken{{Policy: p, Key: k, Limit: p.FixedLimit(), Units: 1}}, start, nil, EachOptions{Deferred: deferred})
	}
	const workers, each = 8, 200
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for i := 0; i < each; i++ {
				at := start.Add(time.Duration(i) * 100 * time.Microsecond)
				o, _, err := TakeEach(context.Background(), []Taken{{Policy: p, Key: keys[(w+i)%len(keys)], Limit: p.FixedLimit(), Units: 1}}, at, nil, EachOptions{Deferred: deferred})
				if err != nil || o != OverLimit {
					t.Errorf("worker %d, take %d: %v %v", w, i, o, err)
					return
				}
				if i%50 == 0 {
					deferred.Flush(context.Background(), at)
				}
			}
		}(w)
	}
	wg.Wait()
	counting.mu.Lock()
	charged := counting.units
	counting.mu.Unlock()
	if got := charged + deferred.Pending(); got != workers*each {
		t.Fatalf("%d charged + %d held = %d, want %d denied hits", charged, deferred.Pending(), got, workers*each)
	}
}

// countedWindowPolicy is a fixed-window policy "h" of limit per window in
// mode, over a local limiter that counts its calls.
func countedWindowPolicy(t *testing.T, mode config.Mode, limit int64, window time.Duration) (*Policy, *countingLimiter) {
	t.Helper()
	table, _ := local.NewTable(100)
	counting := &countingLimiter{Limiter: local.New(table)}
	p, err := NewPolicy(config.Policy{Name: "h", Mode: mode, Limit: limit, Window: window, Algorithm: config.FixedWindow},
		Limiters{mode: counting}, NewMetrics(nil))
	if err != nil {
		t.Fatal(err)
	}
	return p, counting
}
