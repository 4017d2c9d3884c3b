package quota

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/extauthz/extauthz/internal/config"
)

// FuzzLimitArithmetic runs every algorithm's arithmetic on limits the
// configuration accepts, extreme ones included: limits up to 2^40, windows
// from 1ms to 366 days, bursts up to 2^40, any queue and max_delay. The
// fuzzer's values go through config.Parse, so a configuration that would
// not load is skipped and one that would is held to the algorithms'
// promises, at instants from nanoseconds to years apart:
//
//   - a fresh key admits its first request, and so does each replica's
//     fresh share of the limit (Share);
//   - Remaining, RetryAfter, ResetAfter and Delay stay within what the
//     algorithm can mean (a token bucket's wait is at most one interval,
//     its reset at most the time to refill from empty; a window's wait and
//     reset at most two windows; a hold at most max_delay);
//   - a denied request retried exactly RetryAfter later is admitted;
//   - Peek foretells Take;
//   - a key evicted and back (StartEmpty) admits no more than it would
//     have, had it stayed.
//
// An overflow shows as a first request denied or a wait of decades (a
// burst of 200,000 at one a day that overflows answers its first request
// with Retry-After: 1166830474).
func FuzzLimitArithmetic(f *testing.F) {
	day := int64(24 * time.Hour)
	for _, seed := range []struct {
		alg                                   uint8
		limit, window, burst, queue, maxDelay int64
		peers                                 int64
		ops                                   []byte
	}{
		{0, 1, day, 200_000, 0, 0, 1, []byte{0, 0, 1, 2}},   // the overflow above
		{0, 1, day, 366, 0, 0, 2, []byte{0, 3, 0, 5, 1, 9}}, // the longest refill allowed
		{0, 1 << 40, int64(time.Millisecond), 1 << 40, 0, 0, 3, []byte{0, 1, 2, 3, 4, 5}},
		{0, 1 << 40, 366 * day, 1 << 40, 0, 0, 1000, []byte{0, 7, 0, 7, 3, 3}},
		{1, 1 << 40, 366 * day, 0, 0, 0, 7, []byte{0, 1, 0, 8, 2, 6}}, // sliding window
		{1, 3, int64(time.Millisecond), 0, 0, 0, 2, []byte{0, 0, 0, 0, 6, 4}},
		{2, 1 << 40, 366 * day, 0, 0, 0, 5, []byte{0, 0, 1, 6, 2, 7}}, // fixed window
		{3, 100_000, 366 * day, 0, 0, 0, 9, []byte{0, 0, 0, 8, 1, 2}}, // sliding log at its cap
		{3, 1, int64(time.Millisecond), 0, 0, 0, 1, []byte{0, 0, 2, 3, 0, 4}},
		{4, 1 << 40, 366 * day, 0, 100_000, int64(150 * time.Millisecond), 4, []byte{0, 0, 0, 1, 2, 3}}, // leaky bucket
		{4, 1, 366 * day, 0, 0, 1, 1, []byte{0, 0, 5, 0}},
		{4, 1 << 40, int64(time.Millisecond), 0, -1, int64(150 * time.Millisecond), 2, []byte{0, 0, 0, 0}},
		// Evicted and back (op 4), for each algorithm.
		{0, 10, int64(time.Minute), 0, 0, 0, 1, []byte{0, 0, 4, 1, 0, 0, 4, 5, 0, 0}},
		{1, 10, int64(time.Minute), 0, 0, 0, 1, []byte{0, 0, 0, 0, 4, 6, 0, 0, 4, 1}},
		{1, 3, int64(time.Minute), 0, 0, 0, 1, []byte{0, 0, 4, 20, 0, 0}}, // back in the next window
		{2, 10, int64(time.Minute), 0, 0, 0, 1, []byte{0, 0, 4, 1, 0, 0}},
		{3, 10, int64(time.Minute), 0, 0, 0, 1, []byte{0, 0, 4, 4, 0, 0}},
		{4, 10, int64(time.Second), 0, 2, int64(150 * time.Millisecond), 1, []byte{0, 0, 0, 0, 4, 1, 0, 0}},
	} {
		f.Add(seed.alg, seed.limit, seed.window, seed.burst, seed.queue, seed.maxDelay, seed.peers, seed.ops)
	}
	f.Fuzz(func(t *testing.T, alg uint8, limit, window, burst, queue, maxDelay, peers int64, ops []byte) {
		l, ok := validLimit(Algorithm(alg%5), limit, window, burst, queue, maxDelay)
		if !ok {
			return
		}
		if len(ops) > 64 {
			ops = ops[:64]
		}
		peers = clamp(peers, 1, 10_000)
		now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano()
		fl := Share(l, peers)
		if fl.Limit < 1 || fl.Capacity() < 1 {
			t.Fatalf("Share(%+v, %d) = %+v: no unit for the replica", l, peers, fl)
		}
		var s, share State
		checkTake(t, &s, l, now, true)
		checkTake(t, &share, fl, now, true)
		for i := 0; i+1 < len(ops); i += 2 {
			now += fuzzStep(l, ops[i+1])
			switch ops[i] % 5 {
			case 0, 1:
				checkTake(t, &s, l, now, false)
			case 2:
				s.Refund(l, 1, now)
			case 3:
				// What Redis reported for the key a moment ago, as a
				// fallback share receives it.
				remote := int64(ops[i+1]) * l.Capacity() / 255
				share.CapToShare(l, fl, now, peers, remote, now-fuzzStep(l, ops[i+1]/2))
				checkTake(t, &share, fl, now, false)
			case 4:
				// Evicted now, back a step later.
				back := now + fuzzStep(l, ops[i+1]/3)
				var again State
				again.StartEmpty(l, now, back)
				if got, had := admits(&again, l, back), admits(&s, l, back); got > had {
					t.Fatalf("%+v: evicted at %d and back at %d, the key admits %d; had it stayed, %d", l, now, back, got, had)
				}
				s, now = again, back
				checkTake(t, &s, l, now, false)
			}
		}
	})
}

// validLimit builds the policy the fuzzer's values describe, clamped into
// each field's documented range, and returns its quota.Limit when
// config.Parse accepts it.
func validLimit(alg Algorithm, limit, window, burst, queue, maxDelay int64) (Limit, bool) {
	l := Limit{
		Algorithm: alg,
		Limit:     clamp(limit, 1, 1<<40),
		Window:    time.Duration(clamp(window, int64(time.Millisecond), int64(366*24*time.Hour))),
	}
	yaml := fmt.Sprintf("policies:\n  - {name: p, algorithm: %s, limit: %d, window: %s", alg, l.Limit, l.Window)
	switch alg {
	case TokenBucket:
		l.Burst = clamp(burst, 0, 1<<40)
		yaml += fmt.Sprintf(", burst: %d", l.Burst)
	case LeakyBucket:
		l.Queue = clamp(queue, -1, 100_000)
		l.MaxDelay = time.Duration(clamp(maxDelay, 1, int64(150*time.Millisecond)))
		if l.Queue >= 0 {
			yaml += fmt.Sprintf(", queue: %d", l.Queue)
		}
		yaml += fmt.Sprintf(", max_delay: %s", l.MaxDelay)
	}
	cfg, err := config.Parse([]byte(yaml+"}\n"), "fuzz")
	if err != nil {
		return Limit{}, false
	}
	p := cfg.Policies[0]
	if p.Limit != l.Limit || p.Window != l.Window || p.Burst != l.Burst || (alg == LeakyBucket && (p.Queue != l.Queue || p.MaxDelay != l.MaxDelay)) {
		panic(fmt.Sprintf("config read %s as %+v", yaml, p))
	}
	return l, true
}

// clamp maps x into [lo, hi], leaving values already there alone, so the
// seeds mean what they say.
func clamp(x, lo, hi int64) int64 {
	if x >= lo && x <= hi {
		return x
	}
	return lo + int64(uint64(x)%uint64(hi-lo+1))
}

// fuzzStep is how far time moves before an operation, chosen by b among the
// distances that matter to l: none, a nanosecond, around one interval,
// half a window, a window, two windows, the time to refill from empty.
func fuzzStep(l Limit, b byte) int64 {
	iv, w := l.Interval(), int64(l.Window)
	switch b % 10 {
	case 0:
		return 0
	case 1:
		return 1
	case 2:
		return iv - 1
	case 3:
		return iv
	case 4:
		return iv + 1
	case 5:
		return w / 2
	case 6:
		return w
	case 7:
		return 2 * w
	case 8:
		return l.Capacity() * iv
	}
	return int64(b) * iv / 16
}

// checkTake takes one unit of s under l at now and checks the decision
// against the algorithm's bounds; a denial is retried, on a copy, when it
// says to. first says the state is fresh: the unit must be granted.
func checkTake(t *testing.T, s *State, l Limit, now int64, first bool) {
	t.Helper()
	before := clone(s)
	peeked, _ := s.Peek(l, 1, now)
	d, err := s.Take(l, 1, now)
	if err != nil {
		t.Fatal(err)
	}
	if peeked != d {
		t.Fatalf("%+v at %d: Peek said %+v, Take decided %+v", l, now, peeked, d)
	}
	iv, w := l.Interval(), int64(l.Window)
	var maxRemaining, maxRetry, maxReset int64
	switch l.Algorithm {
	case TokenBucket:
		maxRemaining, maxRetry, maxReset = l.Capacity(), iv, l.Capacity()*iv
	case LeakyBucket:
		maxRemaining, maxRetry, maxReset = l.Tolerance()/iv+1, iv, l.Tolerance()+iv
	case FixedWindow, SlidingLog:
		maxRemaining, maxRetry, maxReset = l.Limit, w, w
	case SlidingWindow:
		maxRemaining, maxRetry, maxReset = l.Limit, 2*w, 2*w
	}
	bad := d.Limit != l.Limit || d.Remaining < 0 || d.Remaining > maxRemaining ||
		d.RetryAfter < 0 || int64(d.RetryAfter) > maxRetry || (d.Allowed != (d.RetryAfter == 0)) ||
		d.ResetAfter < 0 || int64(d.ResetAfter) > maxReset ||
		d.Delay < 0 || d.Delay > l.MaxDelay || (!d.Allowed && d.Delay != 0)
	if bad || (first && !d.Allowed) {
		t.Fatalf("%+v at %d (first %v): %+v; bounds: remaining ≤ %d, retry ≤ %v, reset ≤ %v",
			l, now, first, d, maxRemaining, time.Duration(maxRetry), time.Duration(maxReset))
	}
	if !d.Allowed {
		retry := clone(before)
		if again, _ := retry.Take(l, 1, now+int64(d.RetryAfter)); !again.Allowed {
			t.Fatalf("%+v: denied at %d with RetryAfter %v, and denied again then: %+v", l, now, d.RetryAfter, again)
		}
	}
}

// admits counts the units a copy of s grants at ns, up to 64.
func admits(s *State, l Limit, ns int64) int {
	c := clone(s)
	n := 0
	for ; n < 64; n++ {
		if d, _ := c.Take(l, 1, ns); !d.Allowed {
			break
		}
	}
	return n
}

// clone deep-copies a state, so a decision can be tried without spending.
func clone(s *State) *State {
	c := *s
	if s.counts != nil {
		cc := *s.counts
		cc.log.ts = slices.Clone(s.counts.log.ts)
		c.counts = &cc
	}
	return &c
}
