package redisstore

import (
	"context"
	"errors"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/extauthz/extauthz/internal/quota"
	"github.com/extauthz/extauthz/internal/quota/local"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func at(d time.Duration) time.Time { return t0.Add(d) }

type fixedPeers int64

func (p fixedPeers) Count() int64 { return int64(p) }

// newResilient is a Resilient around primary with tables of its own.
func newResilient(t *testing.T, primary quota.Limiter, peers PeerCounter, breaker Breaker) *Resilient {
	t.Helper()
	counts, err := local.NewTable(100)
	if err != nil {
		t.Fatal(err)
	}
	return newResilientOn(t, counts, primary, peers, breaker)
}

// newResilientOn is newResilient with the fallback buckets in counts.
func newResilientOn(t *testing.T, counts *local.Table, primary quota.Limiter, peers PeerCounter, breaker Breaker) *Resilient {
	t.Helper()
	levels, err := NewTable(100)
	if err != nil {
		t.Fatal(err)
	}
	if s, ok := primary.(*scripted); ok {
		s.table = levels
	}
	r := NewResilient(primary, levels, local.NewFallback(counts), peers, breaker)
	r.clock = func() time.Time { return t0 } // calls take no time, unless a test says
	return r
}

// scripted is a primary limiter that answers from Redis (remaining units
// as given) until fail is set, then fails with it.
type scripted struct {
	table     *Table
	remaining int64
	fail      error
}

func (s *scripted) Take(_ context.Context, key string, l quota.Limit, _ int64, now time.Time) (quota.Decision, error) {
	if s.fail != nil {
		return quota.Decision{}, s.fail
	}
	s.table.record(key, s.remaining, now)
	return quota.Decision{Allowed: true, Limit: l.Limit, Remaining: s.remaining}, nil
}

func (s *scripted) Refund(context.Context, string, quota.Limit, int64, time.Time) error {
	return s.fail
}

// admitsAt counts the fallback admissions of key at one instant, until the
// first denial.
func admitsAt(t *testing.T, r *Resilient, key string, l quota.Limit, at time.Time) int {
	t.Helper()
	for n := 0; n < 1000; n++ {
		d, err := r.Take(context.Background(), key, l, 1, at)
		if err != nil {
			t.Fatal(err)
		}
		if d.Degraded != quota.DegradedFallback {
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
		l         quota.Limit
		remaining int64     // what Redis reported
		reported  time.Time // when
		steps     []step
	}{{
		// 29 left at t0: a third is 9. Two seconds later Redis would
		// have restored 3 (one per 666ms): a third of 32 is 10, and the
		// fallback bucket (30 per minute) has refilled one of its 9.
		name: "token_bucket", l: quota.Limit{Algorithm: quota.TokenBucket, Limit: 90, Window: time.Minute},
		remaining: 29, reported: t0,
		steps: []step{{t0, 9}, {sec(2), 1}},
	}, {
		// 30 left in the window [0s, 60s) at 10s: 10 of them here. The
		// next window owes nothing to the report: the full share, 30.
		name: "fixed_window", l: quota.Limit{Algorithm: quota.FixedWindow, Limit: 90, Window: time.Minute},
		remaining: 30, reported: sec(10),
		steps: []step{{sec(20), 10}, {sec(30), 0}, {sec(60), 30}},
	}, {
		// Likewise within the window; the next window weighs this one's
		// 30 local units (30 × 50/60 = 25 at 70s): 30 − 25 = 5 fit.
		name: "sliding_window", l: quota.Limit{Algorithm: quota.SlidingWindow, Limit: 90, Window: time.Minute},
		remaining: 30, reported: sec(10),
		steps: []step{{sec(20), 10}, {sec(70), 5}},
	}, {
		// 30 left at 10s: 20 stand-ins for the units missing from the
		// share enter the log at 10s and leave at 70s; the 10 admitted at
		// 20s leave at 80s. At 70s: 30 − 10 = 20 fit.
		name: "sliding_log", l: quota.Limit{Algorithm: quota.SlidingLog, Limit: 90, Window: time.Minute},
		remaining: 30, reported: sec(10),
		steps: []step{{sec(20), 10}, {sec(69), 0}, {sec(70), 20}},
	}, {
		// A slot every 666ms with 150ms of tolerance: one request fits
		// at a time, and Redis reported the one free slot at t0. A
		// third of it is none; three slots later (2s) a third of 4 is 1.
		name: "leaky_bucket", l: quota.Limit{Algorithm: quota.LeakyBucket, Limit: 90, Window: time.Minute, Queue: -1, MaxDelay: 150 * time.Millisecond},
		remaining: 1, reported: t0,
		steps: []step{{t0, 0}, {sec(2), 1}},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			primary := &scripted{remaining: tc.remaining}
			r := newResilient(t, primary, fixedPeers(3), redisUp)
			primary.table = r.levels.(*Table)
			if _, err := r.Take(context.Background(), "k", tc.l, 1, tc.reported); err != nil {
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
	counts, _ := local.NewTable(100)
	l := quota.Limit{Limit: 90, Window: time.Minute, OnError: quota.ErrorFallback}
	timedOut := newResilientOn(t, counts, &scripted{fail: context.DeadlineExceeded}, fixedPeers(3), redisUp)
	d, err := timedOut.Take(context.Background(), "new", l, 1, t0)
	if err != nil || d.Allowed || d.Degraded != quota.DegradedFallback || d.RetryAfter != 2*time.Second {
		t.Fatalf("after a timeout, a key never reported on: %+v %v; want denied, retry in 2s (a share of 30 per minute)", d, err)
	}
	if got := admitsAt(t, timedOut, "new", l, t0.Add(2*time.Second)); got != 1 {
		t.Fatalf("2s later: %d admitted, want the 1 the share refilled", got)
	}
	down := newResilientOn(t, counts, &scripted{fail: ErrStoreDown}, fixedPeers(3), redisUp)
	if got := admitsAt(t, down, "other", l, t0); got != 30 {
		t.Fatalf("store down, a key never reported on: %d admitted, want a fresh share of 30", got)
	}
	// A timeout that the breaker confirms as Redis going down is an
	// outage: a fresh share.
	outage := newResilientOn(t, counts, &scripted{fail: context.DeadlineExceeded}, fixedPeers(3), verdict(true))
	if got := admitsAt(t, outage, "fourth", l, t0); got != 30 {
		t.Fatalf("a timeout confirmed as an outage, a key never reported on: %d admitted, want a fresh share of 30", got)
	}
	// A refused connection certainly ran nothing: a fresh share too.
	refused := newResilientOn(t, counts, &scripted{fail: &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}}, fixedPeers(3), redisUp)
	if got := admitsAt(t, refused, "third", l, t0); got != 30 {
		t.Fatalf("connection refused, a key never reported on: %d admitted, want a fresh share of 30", got)
	}
	// A transient failure does not reset what the fallback already spent.
	if got := admitsAt(t, timedOut, "other", l, t0); got != 0 {
		t.Fatalf("after a timeout, a key whose share is spent: %d admitted, want 0", got)
	}
}

// A call that may have run leaves its key's share empty as of when it was
// sent, refilled while the call failed: the request that sent it is
// decided when the failure is known. At 10,000 a second a failure that
// took 40ms has refilled 400 units, 200 for a share of two; at 90 a minute
// (a unit every 667ms) it has refilled none, and after 4s six, three for
// the share.
func TestFailedCallRefillsWhileItFails(t *testing.T) {
	for _, tc := range []struct {
		l    quota.Limit
		took time.Duration
		want int
	}{
		{quota.Limit{Limit: 10_000, Window: time.Second, OnError: quota.ErrorFallback}, 40 * time.Millisecond, 200},
		{quota.Limit{Limit: 90, Window: time.Minute, OnError: quota.ErrorFallback}, 40 * time.Millisecond, 0},
		{quota.Limit{Limit: 90, Window: time.Minute, OnError: quota.ErrorFallback}, 4 * time.Second, 3},
	} {
		counts, _ := local.NewTable(100)
		r := newResilientOn(t, counts, &scripted{fail: context.DeadlineExceeded}, fixedPeers(2), redisUp)
		r.clock = func() time.Time { return t0.Add(tc.took) } // the first call fails tc.took after t0
		d, err := r.Take(context.Background(), "k", tc.l, 1, t0)
		if err != nil || d.Degraded != quota.DegradedFallback || d.Allowed != (tc.want > 0) {
			t.Fatalf("%+v, a call failing after %v: %+v %v; want allowed %v", tc.l, tc.took, d, err, tc.want > 0)
		}
		got := 0
		if d.Allowed {
			got = 1 + admitsAt(t, r, "k", tc.l, t0.Add(tc.took))
		}
		if got != tc.want {
			t.Fatalf("%+v, a call failing after %v: %d admitted, want %d", tc.l, tc.took, got, tc.want)
		}
	}
}

// verdict is a breaker whose verdict on every failed call is fixed.
type verdict bool

func (v verdict) AwaitVerdict(context.Context, string) bool { return bool(v) }

// redisUp says every failed call happened while Redis was up.
const redisUp = verdict(false)

// failing is a primary limiter whose store fails with err.
type failing struct{ err error }

func (f failing) Take(context.Context, string, quota.Limit, int64, time.Time) (quota.Decision, error) {
	return quota.Decision{}, f.err
}
func (f failing) Refund(context.Context, string, quota.Limit, int64, time.Time) error { return f.err }

// Each on_redis_error choice, and the fallback bucket's share of the limit.
func TestResilient(t *testing.T) {
	counts, _ := local.NewTable(100)
	r := newResilientOn(t, counts, failing{ErrStoreDown}, fixedPeers(3), redisUp)
	ctx := context.Background()
	now := t0
	l := quota.Limit{Limit: 90, Window: time.Minute, Burst: 30}
	admitted := 0
	for i := 0; i < 100; i++ {
		d, err := r.Take(ctx, "k", l, 1, now)
		if err != nil || d.Degraded != quota.DegradedFallback || d.Limit != 90 {
			t.Fatalf("fallback: %+v %v", d, err)
		}
		if d.Allowed {
			admitted++
		}
	}
	// limit 90 ÷ 3 peers, burst 30 ÷ 3: 10 at once.
	if admitted != 10 {
		t.Fatalf("fallback admitted %d, want burst 30 ÷ 3 peers = 10", admitted)
	}
	// 30 per minute: one more every 2s.
	if d, _ := r.Take(ctx, "k", l, 1, now.Add(2*time.Second)); !d.Allowed {
		t.Fatalf("after 2s: %+v", d)
	}

	l.OnError = quota.ErrorAllow
	if d, err := r.Take(ctx, "a", l, 1, now); err != nil || !d.Allowed || d.Degraded != quota.DegradedAllow {
		t.Fatalf("allow: %+v %v", d, err)
	}
	l.OnError = quota.ErrorDeny
	if d, err := r.Take(ctx, "d", l, 1, now); err != nil || d.Allowed || d.Degraded != quota.DegradedDeny || d.RetryAfter != time.Second {
		t.Fatalf("deny: %+v %v", d, err)
	}
	// A refund Redis failed is made nowhere under allow or deny, and
	// says so (the engine counts only refunds made); under fallback it
	// goes to the fallback bucket.
	for _, oe := range []quota.OnError{quota.ErrorAllow, quota.ErrorDeny} {
		l.OnError = oe
		if err := r.Refund(ctx, "d", l, 1, now); !errors.Is(err, ErrStoreDown) {
			t.Fatalf("on_redis_error %v: a refund Redis failed returned %v", oe, err)
		}
	}
	l.OnError = quota.ErrorFallback
	if err := r.Refund(ctx, "k", l, 1, now); err != nil {
		t.Fatalf("fallback: a refund returned %v", err)
	}
	// A limit smaller than the peer count still admits one at a time.
	tiny := quota.Limit{Limit: 2, Window: time.Minute}
	if d, _ := r.Take(ctx, "tiny", tiny, 1, now); !d.Allowed {
		t.Fatalf("tiny limit: %+v", d)
	}
	// A caller that gave up gets its context's error, not a decision.
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := newResilientOn(t, counts, failing{context.Canceled}, fixedPeers(1), redisUp).Take(cctx, "c", quota.Limit{Limit: 1, Window: time.Second}, 1, now); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled: %v", err)
	}
}

// With Redis down, every algorithm falls back to itself at its share: a
// window still counts in windows, a log in a log, and a leaky bucket
// still holds requests.
func TestFallbackKeepsTheAlgorithm(t *testing.T) {
	counts, _ := local.NewTable(100)
	r := newResilientOn(t, counts, failing{ErrStoreDown}, fixedPeers(4), redisUp)
	ctx := context.Background()
	for _, a := range []quota.Algorithm{quota.TokenBucket, quota.SlidingWindow, quota.FixedWindow, quota.SlidingLog, quota.LeakyBucket} {
		l := quota.Limit{Algorithm: a, Limit: 100, Window: time.Minute, Queue: -1, MaxDelay: 100 * time.Millisecond}
		admitted := 0
		var last quota.Decision
		for i := 0; i < 100; i++ {
			d, err := r.Take(ctx, "fb:"+a.String(), l, 1, at(30*time.Second))
			if err != nil || d.Degraded != quota.DegradedFallback || d.Limit != 100 {
				t.Fatalf("%s: %+v %v", a, d, err)
			}
			if d.Allowed {
				admitted++
				last = d
			}
		}
		want := 25 // 100 ÷ 4 replicas
		if a == quota.LeakyBucket {
			want = 1 // a slot every 2.4s (the share's rate): one at once
		}
		if admitted != want {
			t.Errorf("%s fallback admitted %d, want %d", a, admitted, want)
		}
		// A refund while Redis is down goes to the local fallback state.
		if err := r.Refund(ctx, "fb:"+a.String(), l, 1, at(30*time.Second)); err != nil {
			t.Fatal(err)
		}
		if d, _ := r.Take(ctx, "fb:"+a.String(), l, 1, at(30*time.Second)); !d.Allowed {
			t.Errorf("%s: after a fallback refund, denied: %+v (last admitted %+v)", a, d, last)
		}
	}
}

func TestReplicaID(t *testing.T) {
	if id := ReplicaID("pod-7"); len(id) != len("pod-7-")+8 || id[:6] != "pod-7-" {
		t.Fatalf("ReplicaID = %q", id)
	}
}

// flaky fails its first `fails` calls with err, then admits.
type flaky struct {
	fails int
	err   error
	calls int
}

func (f *flaky) Take(_ context.Context, _ string, l quota.Limit, _ int64, _ time.Time) (quota.Decision, error) {
	f.calls++
	if f.calls <= f.fails {
		return quota.Decision{}, f.err
	}
	return quota.Decision{Allowed: true, Limit: l.Limit, Remaining: 7}, nil
}
func (f *flaky) Refund(context.Context, string, quota.Limit, int64, time.Time) error { return nil }

// A call that times out while Redis answers is asked once more before the
// decision falls back; a second failure falls back; an outage does not
// wait for a second call.
func TestResilientRetriesOnceWhileRedisIsUp(t *testing.T) {
	l := quota.Limit{Limit: 90, Window: time.Minute, OnError: quota.ErrorFallback}
	ctx := context.Background()
	for _, tc := range []struct {
		name     string
		fails    int
		err      error
		breaker  verdict
		calls    int
		degraded bool
	}{
		{"one slow moment", 1, context.DeadlineExceeded, redisUp, 2, false},
		{"two in a row", 2, context.DeadlineExceeded, redisUp, 2, true},
		{"an outage", 1, context.DeadlineExceeded, verdict(true), 1, true},
		{"store marked down", 1, ErrStoreDown, redisUp, 1, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := &flaky{fails: tc.fails, err: tc.err}
			r := newResilient(t, p, fixedPeers(3), tc.breaker)
			d, err := r.Take(ctx, "k", l, 1, t0)
			if err != nil || p.calls != tc.calls || (d.Degraded != quota.NotDegraded) != tc.degraded {
				t.Fatalf("%+v %v after %d calls; want %d calls, degraded=%v", d, err, p.calls, tc.calls, tc.degraded)
			}
		})
	}
}

// waiting is a primary that answers nothing until its context is done, as
// a hybrid decision waiting for another request's lease of its key (which
// may wait for another) does on a slow link.
type waiting struct{}

func (waiting) Take(ctx context.Context, _ string, _ quota.Limit, _ int64, _ time.Time) (quota.Decision, error) {
	<-ctx.Done()
	return quota.Decision{}, ctx.Err()
}

func (waiting) Refund(context.Context, string, quota.Limit, int64, time.Time) error { return nil }

// A primary that waits on Redis until the caller's deadline must not make
// the decision an error: SPEC §7, no gRPC error reaches Envoy under a
// network fault. The primary's wait ends a tenth of the deadline early,
// and the fallback answers before the caller gives up.
func TestWaitCutByTheDeadlineIsAFallbackDecision(t *testing.T) {
	r := newResilient(t, waiting{}, fixedPeers(3), verdict(false))
	r.clock = time.Now
	l := quota.Limit{Algorithm: quota.TokenBucket, Limit: 90, Window: time.Minute, OnError: quota.ErrorFallback}
	now := time.Now()
	// 2s: the tenth kept back (200ms) outlasts any scheduling delay of a
	// loaded machine, so the test is about the reserve, not the load.
	ctx, cancel := context.WithDeadline(context.Background(), now.Add(2*time.Second))
	defer cancel()
	d, err := r.Take(ctx, "k", l, 1, now)
	if err != nil {
		t.Fatalf("Take: %v; want a fallback decision before the caller's deadline", err)
	}
	if d.Degraded != quota.DegradedFallback {
		t.Fatalf("decision %+v, want a fallback decision", d)
	}
	if ctx.Err() != nil {
		t.Fatalf("the decision came after the caller's deadline")
	}
}

// slowFailing is a primary whose call runs into its timeout: it fails
// after took, as a call on a slow link does.
type slowFailing struct{ took time.Duration }

func (s slowFailing) Take(ctx context.Context, _ string, _ quota.Limit, _ int64, _ time.Time) (quota.Decision, error) {
	select {
	case <-time.After(s.took): // the call's timeout
	case <-ctx.Done():
	}
	return quota.Decision{}, context.DeadlineExceeded
}

func (slowFailing) Refund(context.Context, string, quota.Limit, int64, time.Time) error { return nil }

// askedBreaker records whether a decision waited for its verdict.
type askedBreaker struct{ asked bool }

func (b *askedBreaker) AwaitVerdict(ctx context.Context, _ string) bool {
	b.asked = true
	<-ctx.Done() // the verdict takes as long as the decision lets it
	return false
}

// A first call that ran into its timeout (150ms of Envoy's 200ms) leaves
// too little for a second call to fare better: the fallback answers at
// once rather than wait for the breaker's verdict up to the brink of the
// caller's deadline, where a loaded machine pushes the answer past it
// (SPEC §7: no gRPC error reaches Envoy).
func TestTimedOutCallFallsBackAtOnce(t *testing.T) {
	b := &askedBreaker{}
	// Envoy's 200ms and the call's 150ms timeout scaled by ten: the same
	// share of the deadline, with 500ms left that no scheduling delay of
	// a loaded machine (the unit lane runs packages in parallel) uses up,
	// so the test is about the rule, not the load.
	r := newResilient(t, slowFailing{1500 * time.Millisecond}, fixedPeers(3), b)
	r.clock = time.Now
	l := quota.Limit{Algorithm: quota.TokenBucket, Limit: 90, Window: time.Minute, OnError: quota.ErrorFallback}
	now := time.Now()
	ctx, cancel := context.WithDeadline(context.Background(), now.Add(2*time.Second))
	defer cancel()
	d, err := r.Take(ctx, "k", l, 1, now)
	if err != nil || d.Degraded != quota.DegradedFallback {
		t.Fatalf("Take: %+v, %v; want a fallback decision", d, err)
	}
	if b.asked {
		t.Fatal("the decision waited for the breaker's verdict after a call that took 1.5s of a 2s deadline; want the fallback at once")
	}
}

// A window whose count Redis holds unseen from an instant on (a call that
// may have run, Redis out of reach within the window) starts from the
// limit's part of the window left after that instant, never above Redis's
// last report in the window: a million a second a quarter into its second
// leaves 750,000; three a second leaves 2, of which three replicas' shares
// are none; a report of 10 left caps it.
func TestRestOfWindow(t *testing.T) {
	l := quota.Limit{Algorithm: quota.FixedWindow, Limit: 1_000_000, Window: time.Second, OnError: quota.ErrorFallback}
	now := time.Unix(1_800_000_000, 0).Add(600 * time.Millisecond)
	lost := now.Add(-350 * time.Millisecond) // 250ms into the second
	if got := restOfWindow(l, nil, lost, now).Remaining; got != 750_000 {
		t.Errorf("a million a second, lost 250ms in: %d left, want 750000", got)
	}
	small := l
	small.Limit = 3
	if got := restOfWindow(small, nil, lost, now).Remaining; got != 2 {
		t.Errorf("three a second, lost 250ms in: %d left, want 2", got)
	}
	if got := restOfWindow(l, &local.Level{Remaining: 10, At: now}, lost, now).Remaining; got != 10 {
		t.Errorf("with Redis's report of 10 left: %d, want 10", got)
	}
	if got := restOfWindow(l, nil, now.Add(-2*time.Second), now).Remaining; got != 1_000_000 {
		t.Errorf("lost before the window: %d, want the whole limit", got)
	}
	day := quota.Limit{Algorithm: quota.FixedWindow, Limit: 4_000_000_000, Window: 24 * time.Hour}
	if got := restOfWindow(day, nil, time.Unix(0, 0).Add(6*time.Hour), time.Unix(0, 0).Add(6*time.Hour)).Remaining; got != 3_000_000_000 {
		t.Errorf("four billion a day, lost 6h in: %d left, want 3e9 (no overflow)", got)
	}
}
