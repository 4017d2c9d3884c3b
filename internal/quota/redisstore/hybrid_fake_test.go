package redisstore

import (
	"context"
	"errors"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/extauthz/extauthz/internal/quota"
	"github.com/extauthz/extauthz/internal/quota/local"
)

// fakeRedis is a leaser that answers from memory, so hybrid's own logic
// (spending, renewing, waiting, giving back, settling what Redis forgot)
// runs in milliseconds with no Redis and every figure worked out by hand.
// It keeps one token bucket that never refills (the tests' instants are
// the clock; refill is the scripts', tested against Redis in tests/quota),
// grants between need and want of what it holds, and, like
// bucket_state.lua, knows a lease by the key state it was granted under
// (k): a lease retired under another state was forgotten, and is charged
// what the replica says it owes rather than given back.
type fakeRedis struct {
	mu        sync.Mutex
	available int64      // tokens in the bucket
	k         int64      // the bucket's incarnation; forget starts another
	nextID    int64      // the last lease's id
	asks      []leaseAsk // every lease call, in order
	backs     []fakeBack // every give-back, in order
	fail      error      // lease calls fail with it when set
	// gate, when set, holds every lease call until it is closed; entered
	// hears of each call as it starts waiting there.
	gate    chan struct{}
	entered chan struct{}
}

// fakeBack is one give-back: the units handed back with the lease they
// retire, and what the fake found.
type fakeBack struct {
	n    int64
	h    held
	then returned
}

func newFakeRedis(available int64) *fakeRedis { return &fakeRedis{available: available, k: 1} }

// forget is Redis losing its state (a restart without persistence): the
// bucket starts again full, and the leases granted before are unknown.
func (f *fakeRedis) forget(full int64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.k++
	f.available = full
}

// retireLocked ends the lease h names: its unspent tokens back when the
// bucket still knows it, else what was spent of it charged.
func (f *fakeRedis) retireLocked(n int64, h held) returned {
	if h.k != 0 && h.k != f.k {
		f.available -= h.owed
		return returnedForgot
	}
	f.available += n
	return returnedKnown
}

func (f *fakeRedis) lease(ctx context.Context, _ string, _ quota.Limit, a leaseAsk) (bucketGrant, error) {
	f.mu.Lock()
	f.asks = append(f.asks, a)
	gate, fail := f.gate, f.fail
	if len(f.asks) > 1000 {
		fail = errRenewalLoop // no test makes so many: a take that renews and never spends
	}
	f.mu.Unlock()
	if gate != nil {
		f.entered <- struct{}{}
		select {
		case <-gate:
		case <-ctx.Done():
			return bucketGrant{}, ctx.Err()
		}
	}
	if fail != nil {
		return bucketGrant{}, fail
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	var r bucketGrant
	if a.retire.granted > 0 || a.retire.unspent > 0 {
		r.forgot = f.retireLocked(a.retire.unspent, a.retire) == returnedForgot
	}
	f.available -= a.debt
	if grant := min(a.want, f.available); grant >= a.need {
		f.available -= grant
		f.nextID++
		r.granted, r.id, r.k, r.g = grant, f.nextID, f.k, 1
	} else {
		r.wait = time.Second
	}
	r.remaining = f.available
	return r, nil
}

func (f *fakeRedis) giveBack(_ context.Context, _ string, n int64, h held) (returned, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	then := f.retireLocked(n, h)
	f.backs = append(f.backs, fakeBack{n: n, h: h, then: then})
	return then, nil
}

var (
	errNotModelled = errors.New("fakeRedis: not modelled")
	errRenewalLoop = errors.New("fakeRedis: more than 1000 lease calls")
)

func (f *fakeRedis) leaseWindow(context.Context, string, quota.Limit, leaseAsk, windowHold) (windowLease, error) {
	return windowLease{}, errNotModelled
}
func (f *fakeRedis) giveBackWindow(context.Context, string, quota.Limit, int64, int64) error {
	return errNotModelled
}
func (f *fakeRedis) refund(context.Context, string, quota.Limit, int64, time.Time) error {
	return errNotModelled
}
func (f *fakeRedis) decide(context.Context, string, quota.Limit, int64, int64) (quota.Decision, error) {
	return quota.Decision{}, errNotModelled
}
func (f *fakeRedis) peek(context.Context, string, quota.Limit) (quota.Inspection, error) {
	return quota.Inspection{}, errNotModelled
}
func (f *fakeRedis) reset(context.Context, string) error { return errNotModelled }
func (f *fakeRedis) wantTurn(quota.Limit, int64)         {}
func (f *fakeRedis) levelAt(now time.Time) time.Time     { return now }

// calls is a copy of the lease calls made so far.
func (f *fakeRedis) calls() []leaseAsk {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]leaseAsk(nil), f.asks...)
}

// fakeClock is the hybrid's injected clock (HybridOptions.Now).
type fakeClock struct{ ns atomic.Int64 }

func (c *fakeClock) Now() time.Time       { return time.Unix(0, c.ns.Load()) }
func (c *fakeClock) set(t time.Time)      { c.ns.Store(t.UnixNano()) }
func newFakeClock(t time.Time) *fakeClock { c := &fakeClock{}; c.set(t); return c }

// fakeBucket is the tests' limit: 100 a second, a bucket of 100. One
// replica's first lease of a key is a probe of half a life (30s) holding
// the most one lease takes, a quarter of the bucket: 25 (fitLease,
// maxSlice).
var fakeBucket = quota.Limit{Algorithm: quota.TokenBucket, Limit: 100, Window: time.Second}

// newFakeHybrid is a Hybrid over f on a clock starting at t0, alone (one
// replica). Its sweeper never runs on its own (slice_idle an hour): the
// tests sweep at the instants they name.
func newFakeHybrid(t *testing.T, f *fakeRedis) (*Hybrid, *Metrics, *fakeClock) {
	t.Helper()
	table, err := NewTable(100)
	if err != nil {
		t.Fatal(err)
	}
	m := NewMetrics(nil)
	clk := newFakeClock(t0)
	h := newHybrid(table, f, fixedPeers(1), HybridOptions{SliceIdle: time.Hour, Metrics: m, Now: clk.Now})
	t.Cleanup(func() { h.Close(context.Background()) })
	return h, m, clk
}

// take is one Take of n at at, which must not fail.
func take(t *testing.T, h *Hybrid, key string, n int64, at time.Time) quota.Decision {
	t.Helper()
	d, err := h.Take(context.Background(), key, fakeBucket, n, at)
	if err != nil {
		t.Fatalf("take %d at %v: %v", n, at.Sub(t0), err)
	}
	return d
}

// A slice is spent with no call: the first take leases 25 (a quarter of
// the bucket) and spends 1 of it at once; the next 24 are decided from
// the slice alone, allowed, one lease call in all.
func TestFakeSpendWithinASlice(t *testing.T) {
	f := newFakeRedis(100)
	h, m, _ := newFakeHybrid(t, f)
	for i := range 25 {
		if d := take(t, h, "k", 1, at(time.Duration(i)*time.Millisecond)); !d.Allowed {
			t.Fatalf("take %d: %+v, want allowed from the slice", i, d)
		}
	}
	calls := f.calls()
	if len(calls) != 1 {
		t.Fatalf("%d lease calls for 25 takes within a slice of 25, want 1: %+v", len(calls), calls)
	}
	if a := calls[0]; a.want != 25 || a.need != 1 || a.spent != 1 || a.life != 30*time.Second || a.retire != (held{}) {
		t.Fatalf("first lease asked %+v, want 25 wanted, 1 needed and spent at once, for 30s, nothing to retire", a)
	}
	if got := testutil.ToFloat64(m.TokensLeased); got != 25 {
		t.Fatalf("%v tokens leased, want 25", got)
	}
}

// A slice that runs out is renewed: the 26th take retires the first lease
// (all of it spent: nothing given back, the 24 Redis counted out named
// for retirement) and leases the next in the same call. A lease past its
// life is renewed too, its unspent tokens counted as expired and not
// given back (Redis stops counting them by itself).
func TestFakeRenewalWhenASliceRunsOut(t *testing.T) {
	t.Run("spent", func(t *testing.T) {
		f := newFakeRedis(100)
		h, m, _ := newFakeHybrid(t, f)
		for i := range 26 {
			take(t, h, "k", 1, at(time.Duration(i)*time.Millisecond))
		}
		calls := f.calls()
		if len(calls) != 2 {
			t.Fatalf("%d lease calls for 26 takes with slices of 25, want 2", len(calls))
		}
		r := calls[1].retire
		if r.id != 1 || r.granted != 24 || r.unspent != 0 || r.k != 1 || r.g != 1 || r.owed != 24 {
			t.Fatalf("the renewal retired %+v, want lease 1: 24 counted out, none unspent, owing all 24 if Redis forgot it", r)
		}
		if got := testutil.ToFloat64(m.TokensReturned.WithLabelValues(string(ReturnRenewed))); got != 0 {
			t.Fatalf("%v tokens counted renewed, want 0 (the slice was spent)", got)
		}
	})
	t.Run("expired", func(t *testing.T) {
		f := newFakeRedis(100)
		h, m, _ := newFakeHybrid(t, f)
		take(t, h, "k", 1, t0)
		take(t, h, "k", 1, at(30*time.Second)) // the 30s probe ends 1% early, at 29.7s
		calls := f.calls()
		if len(calls) != 2 {
			t.Fatalf("%d lease calls, want 2: the lease ended", len(calls))
		}
		if r := calls[1].retire; r.id != 1 || r.granted != 24 || r.unspent != 0 || r.k != 0 {
			t.Fatalf("the renewal retired %+v, want lease 1 named (24 out) with nothing unspent and no key state (it ended)", r)
		}
		if got := testutil.ToFloat64(m.TokensReturned.WithLabelValues(string(ReturnExpired))); got != 24 {
			t.Fatalf("%v tokens counted expired, want the 24 left unspent", got)
		}
	})
}

// Concurrent misses on one key make one call: while the first request's
// renewal is in flight, five more requests of the key wait for it,
// counted as lease waits, and are all served from its slice.
func TestFakeConcurrentWaitersShareOneFlight(t *testing.T) {
	f := newFakeRedis(100)
	f.gate, f.entered = make(chan struct{}), make(chan struct{}, 8)
	h, m, _ := newFakeHybrid(t, f)
	const waiters = 5
	decisions := make(chan quota.Decision, waiters+1)
	var wg sync.WaitGroup
	run := func() {
		defer wg.Done()
		d, err := h.Take(context.Background(), "k", fakeBucket, 1, t0)
		if err != nil {
			t.Error(err)
		}
		decisions <- d
	}
	wg.Add(1)
	go run()
	<-f.entered // the first request's renewal is in flight
	wg.Add(waiters)
	for range waiters {
		go run()
	}
	// Every waiter registers as demand under the key's lock before it
	// blocks on the flight.
	deadline := time.Now().Add(10 * time.Second)
	for waiting := int64(0); waiting != waiters; {
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d requests waiting for the flight after 10s", waiting, waiters)
		}
		runtime.Gosched()
		sh := h.table.Lock("k")
		if e, ok := sh.Peek("k"); ok {
			waiting = e.waiting
		}
		sh.Unlock()
	}
	close(f.gate)
	wg.Wait()
	close(decisions)
	for d := range decisions {
		if !d.Allowed {
			t.Fatalf("%+v, want every request allowed from the one slice", d)
		}
	}
	if calls := f.calls(); len(calls) != 1 {
		t.Fatalf("%d lease calls for %d concurrent requests, want 1 (one flight): %+v", len(calls), waiters+1, calls)
	}
	if got := testutil.ToFloat64(m.LeaseWaits); got != waiters {
		t.Fatalf("%v lease waits, want %d", got, waiters)
	}
}

// A request waiting for another's renewal whose caller went away (its
// context canceled, not the waiter's) leases for itself rather than fail
// for a reason not its own.
func TestFakeWaiterLeasesWhenTheRenewingCallerLeaves(t *testing.T) {
	f := newFakeRedis(100)
	f.gate, f.entered = make(chan struct{}), make(chan struct{}, 8)
	h, _, _ := newFakeHybrid(t, f)
	type result struct {
		d   quota.Decision
		err error
	}
	leaderCtx, leave := context.WithCancel(context.Background())
	leader, waiter := make(chan result, 1), make(chan result, 1)
	go func() {
		d, err := h.Take(leaderCtx, "k", fakeBucket, 1, t0)
		leader <- result{d, err}
	}()
	<-f.entered // the leader's renewal is in flight
	go func() {
		d, err := h.Take(context.Background(), "k", fakeBucket, 1, t0)
		waiter <- result{d, err}
	}()
	deadline := time.Now().Add(10 * time.Second)
	for waiting := int64(0); waiting != 1; {
		if time.Now().After(deadline) {
			t.Fatal("the second request never waited for the flight")
		}
		runtime.Gosched()
		sh := h.table.Lock("k")
		if e, ok := sh.Peek("k"); ok {
			waiting = e.waiting
		}
		sh.Unlock()
	}
	leave()
	if r := <-leader; !errors.Is(r.err, context.Canceled) {
		t.Fatalf("the leader, its caller gone: %+v, %v; want context.Canceled", r.d, r.err)
	}
	close(f.gate)
	if r := <-waiter; r.err != nil || !r.d.Allowed {
		t.Fatalf("the waiter: %+v, %v; want allowed from a lease of its own", r.d, r.err)
	}
	if calls := f.calls(); len(calls) != 2 {
		t.Fatalf("%d lease calls, want 2: the leader's, canceled, and the waiter's own", len(calls))
	}
}

// A renewal that fails goes to the fallback (Resilient answers by
// on_redis_error), and the fallback's admissions are charged with the
// next renewal that reaches Redis: each failed renewal puts back the debt
// it took, so two admissions by the fallback are two units charged.
func TestFakeFailedRenewalGoesToTheFallback(t *testing.T) {
	f := newFakeRedis(100)
	f.fail = ErrStoreDown
	h, _, _ := newFakeHybrid(t, f)
	counts, err := local.NewTable(100)
	if err != nil {
		t.Fatal(err)
	}
	r := NewResilient(h, h, local.NewFallback(counts), fixedPeers(1), redisUp)
	r.clock = func() time.Time { return t0 }
	for i := range 2 {
		d, err := r.Take(context.Background(), "k", fakeBucket, 1, t0)
		if err != nil {
			t.Fatal(err)
		}
		if !d.Allowed || d.Degraded != quota.DegradedFallback {
			t.Fatalf("take %d with Redis down: %+v, want allowed by the fallback", i, d)
		}
	}
	f.mu.Lock()
	f.fail = nil
	f.mu.Unlock()
	if d := take(t, h, "k", 1, at(time.Millisecond)); !d.Allowed {
		t.Fatalf("%+v, want allowed once Redis answers", d)
	}
	calls := f.calls()
	if len(calls) != 3 {
		t.Fatalf("%d lease calls, want 3: two failed, one granted", len(calls))
	}
	if calls[0].debt != 0 || calls[1].debt != 1 || calls[2].debt != 2 {
		t.Fatalf("debts charged %d, %d, %d; want 0, 1, 2: what the fallback admitted, kept through a failed call", calls[0].debt, calls[1].debt, calls[2].debt)
	}
	if f.available != 100-2-25 {
		t.Fatalf("the bucket holds %d, want 73: 2 charged for the fallback, a slice of 25 leased", f.available)
	}
}

// An idle lease goes back when its bucket was last seen below half full
// (other replicas may be short of its tokens), and stays to its end when
// the bucket was fuller (a give-back there costs a call and helps no one).
func TestFakeGiveBackWhenIdle(t *testing.T) {
	for _, tc := range []struct {
		name      string
		available int64 // in the bucket before the first lease
		back      int64 // given back when idle
	}{
		{"bucket full: kept", 100, 0},
		{"bucket short: given back", 30, 24}, // leased 25, 5 left in Redis
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFakeRedis(tc.available)
			h, m, _ := newFakeHybrid(t, f)
			take(t, h, "k", 1, t0)
			h.Sweep(at(999*time.Millisecond), time.Second, ReturnIdle)
			if len(f.backs) != 0 {
				t.Fatalf("gave back %+v before the lease was idle a second", f.backs)
			}
			h.Sweep(at(time.Second), time.Second, ReturnIdle)
			var n int64
			for _, b := range f.backs {
				n += b.n
				if b.h.id != 1 || b.h.granted != 24 || b.h.unspent != 24 || b.h.owed != 0 {
					t.Fatalf("gave back %+v, want lease 1 with its 24 unspent and nothing owed", b.h)
				}
			}
			if n != tc.back {
				t.Fatalf("gave back %d when idle, want %d", n, tc.back)
			}
			if got := testutil.ToFloat64(m.TokensReturned.WithLabelValues(string(ReturnIdle))); got != float64(tc.back) {
				t.Fatalf("%v tokens counted idle, want %d", got, tc.back)
			}
		})
	}
}

// A lease Redis forgot is charged, not given back: a heartbeat confirms
// the state, three units are spent, then a heartbeat finds Redis changed
// (Forgot) and Redis comes back empty. The key's next call retires the
// lease naming its 21 unspent tokens and owing the 3 spent since the
// confirmation; Redis, no longer holding the grant, charges the 3 and
// takes none of the 21 back, and the replica counts the lease forgotten,
// not its tokens returned.
func TestFakeForgottenLeaseChargedNotGivenBack(t *testing.T) {
	f := newFakeRedis(100)
	h, m, _ := newFakeHybrid(t, f)
	take(t, h, "k", 1, t0) // leases 25: 24 left
	h.Confirmed("epoch-1")
	for i := 1; i <= 3; i++ {
		take(t, h, "k", 1, at(time.Duration(i)*time.Millisecond)) // 21 left
	}
	h.Forgot("epoch-2")
	f.forget(100)
	take(t, h, "k", 1, at(10*time.Millisecond))
	calls := f.calls()
	if len(calls) != 2 {
		t.Fatalf("%d lease calls, want 2: a stopped lease is not spent", len(calls))
	}
	want := held{id: 1, granted: 24, unspent: 21, k: 1, g: 1, owed: 3, owedSince: 3, epoch: "epoch-1"}
	if r := calls[1].retire; r != want {
		t.Fatalf("retired %+v, want %+v", r, want)
	}
	if a := calls[1]; a.want != 1 {
		t.Fatalf("leased %d right after Redis forgot, want 1: exact until the others' debts land", a.want)
	}
	if f.available != 100-3-1 {
		t.Fatalf("Redis holds %d, want 96: the 3 spent charged, 1 granted, none of the 21 unspent given back", f.available)
	}
	if got := testutil.ToFloat64(m.LeasesForgotten); got != 1 {
		t.Fatalf("%v leases forgotten, want 1", got)
	}
	if got := testutil.ToFloat64(m.TokensReturned.WithLabelValues(string(ReturnRenewed))); got != 0 {
		t.Fatalf("%v tokens counted renewed, want 0: Redis took none back", got)
	}
}

// A renewal that never reached Redis (the store marked down) keeps the
// lease it was to retire, stopped, for the key's next call: there, Redis
// having lost the grant (a failover to a replica that missed it), what
// was spent of the lease since the last confirmed heartbeat is charged.
// A renewal that may have run (a timeout) may have retired the lease
// already: it is dropped, as before.
func TestFakeRefusedRenewalKeepsTheLease(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		want held // retired by the renewal once Redis answers
		left int64
	}{
		{"refused: kept and charged", ErrStoreDown, held{id: 1, granted: 24, unspent: 0, k: 1, g: 1, owed: 24, owedSince: 24, epoch: "epoch-1"}, 100 - 24 - 25},
		{"may have run: dropped", context.DeadlineExceeded, held{}, 100 - 25},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFakeRedis(100)
			h, _, _ := newFakeHybrid(t, f)
			take(t, h, "k", 1, t0) // leases 25: 24 left
			h.Confirmed("epoch-1")
			for i := 1; i <= 24; i++ {
				take(t, h, "k", 1, at(time.Duration(i)*time.Millisecond)) // spends the 24
			}
			f.mu.Lock()
			f.fail = tc.err
			f.mu.Unlock()
			if _, err := h.Take(context.Background(), "k", fakeBucket, 1, at(30*time.Millisecond)); err == nil {
				t.Fatal("the renewal succeeded with Redis failing it")
			}
			f.forget(100) // the new master never got the grant
			f.mu.Lock()
			f.fail = nil
			f.mu.Unlock()
			if d := take(t, h, "k", 1, at(40*time.Millisecond)); !d.Allowed {
				t.Fatalf("%+v, want allowed once Redis answers", d)
			}
			calls := f.calls()
			if len(calls) != 3 {
				t.Fatalf("%d lease calls, want 3", len(calls))
			}
			if r := calls[2].retire; r != tc.want {
				t.Fatalf("the renewal after Redis came back retired %+v, want %+v", r, tc.want)
			}
			if f.available != tc.left {
				t.Fatalf("Redis holds %d, want %d", f.available, tc.left)
			}
		})
	}
}
