package quota_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/extauthz/extauthz/internal/quota"
	"github.com/extauthz/extauthz/internal/quota/local"
)

// The published numbers of the five algorithms, reproduced with injected
// time in local mode (Go, this process) and redis mode (the Lua scripts on
// a real redis-server, with StoreOptions.Clock standing in for Redis TIME).

func (c *clock) Set(t time.Time) { c.ns.Store(t.UnixNano()) }

// backend is one place an algorithm runs, with the clock that drives it.
type backend struct {
	name string
	lim  quota.Limiter
	clk  *clock
}

func (b backend) take(t *testing.T, key string, l quota.Limit) quota.Decision {
	t.Helper()
	d, err := b.lim.Take(context.Background(), key, l, 1, b.clk.Now())
	if err != nil {
		t.Fatalf("%s: Take: %v", b.name, err)
	}
	return d
}

// burst asks for n units at the current instant and returns how many were
// admitted and the first rejection.
func (b backend) burst(t *testing.T, key string, l quota.Limit, n int) (int, quota.Decision) {
	t.Helper()
	admitted, first, rejected := 0, quota.Decision{}, false
	for i := 0; i < n; i++ {
		d := b.take(t, key, l)
		switch {
		case d.Allowed:
			admitted++
		case !rejected:
			first, rejected = d, true
		}
	}
	return admitted, first
}

// backends returns the local and the redis limiter, each on its own clock.
func backends(t *testing.T) []backend {
	t.Helper()
	cache, err := local.NewTable(10000)
	if err != nil {
		t.Fatal(err)
	}
	rclk := newClock()
	store, _, _ := newTestStore(t, rclk)
	return []backend{
		{name: "local", lim: local.New(cache), clk: newClock()},
		{name: "redis", lim: newRedis(t, store), clk: rclk},
	}
}

var allAlgorithms = []quota.Algorithm{quota.TokenBucket, quota.SlidingWindow, quota.FixedWindow, quota.SlidingLog, quota.LeakyBucket}

// perMinute is the limit of the published scenarios: 100 per minute (a
// leaky bucket holding requests up to 100ms, as configured by default).
func perMinute(a quota.Algorithm) quota.Limit {
	return quota.Limit{Algorithm: a, Limit: 100, Window: time.Minute, Queue: -1, MaxDelay: 100 * time.Millisecond}
}

// Boundary burst: 100 requests at second 59.9 of a window and 100 at 60.1,
// then 100 more at second 90. t0 is on a minute, so second 60 is a window
// boundary.
func TestBoundaryBurst(t *testing.T) {
	type row struct {
		first, second, at90 int
		wait                time.Duration // of the first rejection at 60.1
	}
	want := map[quota.Algorithm]row{
		// 0.2s × 100/min = 0.33 tokens refill between the bursts:
		// nothing; the next token is due at 60.5. 30.1s later, 50.
		quota.TokenBucket: {100, 0, 50, 400 * time.Millisecond},
		// The previous window weighs 99.83 at 60.1: nothing fits until
		// 100 × (1 − t/60s) + 1 ≤ 100, t = 0.6s: a 500ms wait. At 90 it
		// weighs 50: 50 fit.
		quota.SlidingWindow: {100, 0, 50, 500 * time.Millisecond},
		// A new window at 60: another 100, and nothing more until 120.
		quota.FixedWindow: {100, 100, 0, 59900 * time.Millisecond},
		// Exact: the 100 of 59.9 leave the log at 119.9.
		quota.SlidingLog: {100, 0, 0, 59800 * time.Millisecond},
		// Shaping: one at once, the next slot 600ms later, beyond
		// max_delay; at 60.1 the slot of 60.5 is 400ms away, 300ms too far.
		quota.LeakyBucket: {1, 0, 1, 300 * time.Millisecond},
	}
	var table []string
	for _, b := range backends(t) {
		for _, a := range allAlgorithms {
			l := perMinute(a)
			key := "burst:" + a.String()
			b.clk.Set(at(59900 * time.Millisecond))
			n1, _ := b.burst(t, key, l, 100)
			b.clk.Set(at(60100 * time.Millisecond))
			n2, first := b.burst(t, key, l, 100)
			if a == quota.FixedWindow {
				_, first = b.burst(t, key, l, 1) // the 201st
			}
			b.clk.Set(at(90 * time.Second))
			n3, _ := b.burst(t, key, l, 100)
			got := row{n1, n2, n3, first.RetryAfter}
			if absDur(got.wait-want[a].wait) <= time.Microsecond {
				got.wait = want[a].wait // the scripts round waits up to the µs
			}
			table = append(table, fmt.Sprintf("%-6s %-15s %5d %5d %5d %7d %10v %6d",
				b.name, a, n1, n2, n1+n2, n3, first.RetryAfter, retryAfterHeader(first.RetryAfter)))
			if got != want[a] {
				t.Errorf("%s %s: admitted %d at 59.9, %d at 60.1, %d at 90, first wait %v; want %+v",
					b.name, a, n1, n2, n3, first.RetryAfter, want[a])
			}
		}
	}
	t.Logf("limit 100/min; 100 requests at 59.9s, 100 at 60.1s, 100 at 90s\n%-6s %-15s %5s %5s %5s %7s %10s %6s\n%s",
		"mode", "algorithm", "59.9", "60.1", "total", "at 90", "wait", "Retry-After", strings.Join(table, "\n"))
}

// retryAfterHeader is Retry-After as internal/check renders it: whole
// seconds rounded up, at least 1.
func retryAfterHeader(d time.Duration) int64 {
	return max(int64((d+time.Second-1)/time.Second), 1)
}

// 70 requests at second 30 of one window, then as many as fit at second 75
// (15s into the next): the count the script admits is the formula's.
func TestSlidingWindowMatchesFormula(t *testing.T) {
	const limit, prev = 100, 70
	w := time.Minute
	e := 15 * time.Second
	// Worked by hand: at 15s the previous window weighs 70 × 45/60 =
	// 52.5, so cur may reach ⌊100 − 52.5⌋ = 47. The 48th fits once
	// 70 × (60 − t)/60 + 48 ≤ 100, at t = 60 × 18/70 = 15.428571428…s:
	// 428.571429ms (rounded up) after 15s.
	const weighted, want = 52.5, 47
	const wantWait = 428571429 * time.Nanosecond
	for _, b := range backends(t) {
		l := perMinute(quota.SlidingWindow)
		b.clk.Set(at(30 * time.Second))
		if n, _ := b.burst(t, "formula", l, prev); n != prev {
			t.Fatalf("%s: admitted %d of the first %d", b.name, n, prev)
		}
		b.clk.Set(at(w + e))
		n, first := b.burst(t, "formula", l, 100)
		t.Logf("%s: at 75s the previous window weighs %.1f; admitted %d (formula %d), first wait %v (formula %v)",
			b.name, weighted, n, want, first.RetryAfter, wantWait)
		if n != want {
			t.Errorf("%s: admitted %d at 75s, formula says %d", b.name, n, want)
		}
		if absDur(first.RetryAfter-wantWait) > time.Microsecond {
			t.Errorf("%s: wait %v, formula says %v", b.name, first.RetryAfter, wantWait)
		}
	}
}

// Random arrivals, bursts and pauses: the sliding log never admits more
// than the limit in any window-long interval, and rejects only when the
// last window already holds the limit.
func TestSlidingLogNeverOverLimit(t *testing.T) {
	const limit = 100
	w := time.Minute
	for _, b := range backends(t) {
		rng := rand.New(rand.NewPCG(11, 12))
		l := perMinute(quota.SlidingLog)
		b.clk.Set(at(0))
		var admitted []time.Time // in order
		inWindow := func(end time.Time) int {
			n := 0
			for i := len(admitted) - 1; i >= 0 && admitted[i].After(end.Add(-w)); i-- {
				n++
			}
			return n
		}
		rejected, maxSeen := 0, 0
		for i := 0; i < 3000; i++ {
			if rng.IntN(3) > 0 {
				b.clk.Advance(time.Duration(rng.Int64N(int64(2 * time.Second))))
			}
			now := b.clk.Now()
			d := b.take(t, "log", l)
			before := inWindow(now)
			if d.Allowed {
				if before >= limit {
					t.Fatalf("%s: admitted at %v with %d already in the last minute", b.name, now.Sub(t0), before)
				}
				admitted = append(admitted, now)
				maxSeen = max(maxSeen, before+1)
				continue
			}
			rejected++
			if before != limit {
				t.Fatalf("%s: rejected at %v with only %d in the last minute", b.name, now.Sub(t0), before)
			}
			// The wait is exact: the oldest of those 100 leaves then.
			oldest := admitted[len(admitted)-limit]
			if wantWait := oldest.Add(w).Sub(now); absDur(d.RetryAfter-wantWait) > time.Microsecond {
				t.Fatalf("%s: wait %v, want %v", b.name, d.RetryAfter, wantWait)
			}
		}
		t.Logf("%s: %d admitted, %d rejected over %v; at most %d in any minute", b.name, len(admitted), rejected, b.clk.Now().Sub(t0).Round(time.Second), maxSeen)
		if rejected == 0 || maxSeen != limit {
			t.Fatalf("%s: the run never reached the limit (max %d in a minute, %d rejected): it tests nothing", b.name, maxSeen, rejected)
		}
	}
}

// Every algorithm gives back what another policy's denial refunds: after
// k takes and a refund, the next decision is the one after k−1 takes.
func TestRefundUndoesTake(t *testing.T) {
	ctx := context.Background()
	for _, b := range backends(t) {
		for _, a := range allAlgorithms {
			l := quota.Limit{Algorithm: a, Limit: 5, Window: time.Minute, Queue: -1, MaxDelay: 150 * time.Millisecond}
			if a == quota.LeakyBucket {
				// A slot every 50ms, held up to 150ms: four at once.
				l.Window = 250 * time.Millisecond
			}
			for k := 1; k <= 3; k++ {
				b.clk.Set(at(time.Duration(k) * time.Hour))
				ref, got := fmt.Sprintf("ref:%s:%d", a, k), fmt.Sprintf("refunded:%s:%d", a, k)
				for i := 0; i < k-1; i++ {
					b.take(t, ref, l)
				}
				for i := 0; i < k; i++ {
					b.take(t, got, l)
				}
				if err := b.lim.Refund(ctx, got, l, 1, b.clk.Now()); err != nil {
					t.Fatalf("%s %s: Refund: %v", b.name, a, err)
				}
				want, have := b.take(t, ref, l), b.take(t, got, l)
				if want.Allowed != have.Allowed || want.Remaining != have.Remaining || want.Delay != have.Delay || want.RetryAfter != have.RetryAfter {
					t.Fatalf("%s %s k=%d: after a refund %+v, without the refunded take %+v", b.name, a, k, have, want)
				}
			}
		}
	}
}

// The Lua scripts and the Go algorithms make the same decisions for the
// same instants (waits may differ by a microsecond: the scripts count in
// microseconds and round up).
func TestScriptsMatchLocal(t *testing.T) {
	bs := backends(t)
	local, rds := bs[0], bs[1]
	limits := []quota.Limit{
		{Limit: 10, Window: 10 * time.Second},
		{Limit: 7, Window: 2 * time.Second},
		{Limit: 50, Window: time.Minute},
	}
	for _, a := range allAlgorithms[1:] {
		for li, base := range limits {
			l := base
			l.Algorithm, l.Queue, l.MaxDelay = a, -1, 150*time.Millisecond
			if a == quota.LeakyBucket && li == 1 {
				l.Queue = 1
			}
			rng := rand.New(rand.NewPCG(uint64(a), uint64(li)))
			key := fmt.Sprintf("agree:%s:%d", a, li)
			local.clk.Set(at(0))
			rds.clk.Set(at(0))
			for i := 0; i < 300; i++ {
				step := time.Duration(rng.Int64N(int64(l.Window/time.Duration(l.Limit)*2/time.Millisecond))) * time.Millisecond
				local.clk.Advance(step)
				rds.clk.Advance(step)
				want, got := local.take(t, key, l), rds.take(t, key, l)
				if got.Allowed != want.Allowed || got.Remaining != want.Remaining ||
					absDur(got.RetryAfter-want.RetryAfter) > time.Microsecond ||
					absDur(got.ResetAfter-want.ResetAfter) > time.Microsecond ||
					absDur(got.Delay-want.Delay) > time.Microsecond {
					t.Fatalf("%s %+v step %d at +%v: redis %+v, local %+v", a, l, i, local.clk.Now().Sub(t0), got, want)
				}
				if rng.IntN(10) == 0 && want.Allowed {
					local.lim.Refund(context.Background(), key, l, 1, local.clk.Now())
					rds.lim.Refund(context.Background(), key, l, 1, rds.clk.Now())
				}
			}
		}
	}
}

// Requests of several units, questions (0 units) and refunds of several:
// the Lua scripts and the Go algorithms still decide alike, every
// algorithm included.
func TestScriptsMatchLocalWithCosts(t *testing.T) {
	bs := backends(t)
	local, rds := bs[0], bs[1]
	ctx := context.Background()
	for _, a := range allAlgorithms {
		l := quota.Limit{Algorithm: a, Limit: 12, Window: 12 * time.Second, Queue: -1, MaxDelay: 150 * time.Millisecond}
		if a == quota.LeakyBucket {
			l.MaxDelay = 5 * time.Second // several slots may wait: costs queue up
		}
		rng := rand.New(rand.NewPCG(uint64(a), 99))
		key := fmt.Sprintf("costs:%s", a)
		local.clk.Set(at(0))
		rds.clk.Set(at(0))
		for i := 0; i < 400; i++ {
			step := time.Duration(rng.Int64N(1500)) * time.Millisecond
			local.clk.Advance(step)
			rds.clk.Advance(step)
			units := []int64{0, 1, 1, 2, 3, 5}[rng.IntN(6)]
			want, err := local.lim.Take(ctx, key, l, units, local.clk.Now())
			if err != nil {
				t.Fatal(err)
			}
			got, err := rds.lim.Take(ctx, key, l, units, rds.clk.Now())
			if err != nil {
				t.Fatal(err)
			}
			if got.Allowed != want.Allowed || got.Remaining != want.Remaining ||
				absDur(got.RetryAfter-want.RetryAfter) > 2*time.Microsecond ||
				absDur(got.ResetAfter-want.ResetAfter) > 2*time.Microsecond ||
				absDur(got.Delay-want.Delay) > 2*time.Microsecond {
				t.Fatalf("%s step %d (%d units) at +%v: redis %+v, local %+v", a, i, units, local.clk.Now().Sub(t0), got, want)
			}
			if units > 0 && want.Allowed && rng.IntN(8) == 0 {
				local.lim.Refund(ctx, key, l, units, local.clk.Now())
				rds.lim.Refund(ctx, key, l, units, rds.clk.Now())
			}
		}
	}
}
