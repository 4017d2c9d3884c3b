// Package quota is the core of rate limiting: a Limit, the Decision for
// one unit, the Limiter interface every store implements, and the five
// algorithms as pure functions over a key's State. It does no I/O and
// keeps no metrics; it knows nothing of Envoy, HTTP or Redis.
//
// The stores live below it: internal/quota/local keeps counts in this
// process (local mode, and the fallback buckets of the Redis modes);
// internal/quota/redisstore keeps them in Redis (redis mode, hybrid leases,
// the breaker, replica counting).
//
// Every call takes the decision instant `now` from the caller: algorithms
// never read the clock, so tests drive them with fixed instants.
package quota

import (
	"context"
	"fmt"
	"time"
)

// Algorithm names how a limit is enforced.
type Algorithm uint8

// The algorithms, in the order the configuration lists them.
const (
	TokenBucket Algorithm = iota
	SlidingWindow
	FixedWindow
	SlidingLog
	LeakyBucket
)

var algorithmNames = [...]string{"token_bucket", "sliding_window", "fixed_window", "sliding_log", "leaky_bucket"}

func (a Algorithm) String() string {
	if int(a) < len(algorithmNames) {
		return algorithmNames[a]
	}
	return fmt.Sprintf("Algorithm(%d)", uint8(a))
}

// OnError says what a Redis-backed limit does while Redis is unreachable.
type OnError uint8

// The choices of on_redis_error.
const (
	// ErrorFallback decides with a local bucket of limit ÷ peers.
	ErrorFallback OnError = iota
	// ErrorAllow admits.
	ErrorAllow
	// ErrorDeny rejects (the sidecar answers 503).
	ErrorDeny
)

// Limit describes one rate limit: Limit units per Window.
type Limit struct {
	Algorithm Algorithm
	// OnError applies to Redis-backed limiters when Redis fails.
	OnError OnError
	// Unlimited limits admit everything and count nothing (an unlimited
	// policy or plan): the engine decides them without asking a limiter,
	// and the fields below are zero. (Beside the other small fields, it
	// costs no space: limits are copied into every decision.)
	Unlimited bool
	Limit     int64         // units admitted per Window; at least 1 unless Unlimited
	Window    time.Duration // at least 1ms
	// Burst is the token bucket's capacity: how many units may be spent at
	// once after a quiet period. Zero means Limit.
	Burst int64
	// Queue (leaky bucket only) is how many admitted requests may wait for
	// their slot at once. Zero: none wait, a request passes only at its
	// slot; negative: as many as MaxDelay allows.
	Queue int64
	// MaxDelay (leaky bucket only) is the longest an admitted request is
	// held. Zero: none is held.
	MaxDelay time.Duration
	// Calendar (fixed window only), when set, aligns the windows to the
	// calendar of a time zone (see calendar.go); Window is then the
	// period's nominal length, for headers only. Nil: windows of length
	// Window aligned to the unix epoch.
	Calendar *Calendar
	// Overdraft (charge: always; token bucket and the window counters
	// only) makes every take of n > 0 units a charge: always allowed and
	// counted in full, even past the limit, into debt that refill (or a
	// fixed window's end) pays back before anything more is admitted. A
	// take of 0 units stays a question, allowed while at least one unit
	// is left. It is for counts known only after the fact, such as the
	// tokens a response reported.
	Overdraft bool
	// BlockFor (block_for; token bucket and the window counters) is the
	// penalty box: a take or question that this limit denies (never a
	// charge) blocks the key for this long, and every take and question
	// meanwhile is denied with the block's end as RetryAfter and
	// ResetAfter, counting nothing. Denials during a block do not extend
	// it. The block does not touch the algorithm's count: when it ends,
	// counting resumes as the count says. Zero: no block (a shadow
	// policy's denials never block).
	BlockFor time.Duration
}

// Charges reports whether a take of n units under l is a charge: counted
// whatever is left, never denied.
func (l Limit) Charges(n int64) bool { return l.Overdraft && n > 0 }

// bounds returns the fixed window holding ns: [start, end), unix ns.
func (l Limit) bounds(ns int64) (start, end int64) {
	if l.Calendar != nil {
		b := l.Calendar.At(ns)
		return b.Start, b.End
	}
	w := int64(l.Window)
	start = windowStart(ns, w)
	return start, start + w
}

// windowKey tells the window layouts a state may hold apart: a length for
// epoch-aligned windows, a negative period for calendar ones.
func (l Limit) windowKey() int64 {
	if l.Calendar != nil {
		return -int64(l.Calendar.Period)
	}
	return int64(l.Window)
}

// Capacity returns the bucket capacity: Burst, or Limit when Burst is zero.
func (l Limit) Capacity() int64 {
	if l.Burst > 0 {
		return l.Burst
	}
	return l.Limit
}

// Interval returns how long one unit takes to refill (Window / Limit),
// in nanoseconds, at least 1.
func (l Limit) Interval() int64 {
	iv := int64(l.Window) / l.Limit
	if iv < 1 {
		return 1
	}
	return iv
}

// Decision is the outcome of asking for units.
type Decision struct {
	Allowed bool
	// Limit is the quota advertised to clients (RateLimit-Policy q): the
	// limit's units per window.
	Limit int64
	// Remaining is how many more units would be admitted right now, after
	// this decision. For example, 99 after the first unit of a full bucket
	// of 100. Never negative: a count in debt (Limit.Overdraft) has 0
	// remaining, and its RetryAfter and ResetAfter tell how deep it is.
	Remaining int64
	// RetryAfter is the wait until the units asked for are available: 0
	// when Allowed.
	RetryAfter time.Duration
	// Delay is how long an allowed request must be held before it goes on
	// (leaky bucket shaping: its slot is that far away). 0 unless Allowed,
	// and never more than the limit's MaxDelay.
	Delay time.Duration
	// ResetAfter is the wait until the quota is fully restored: the bucket
	// full again, or the window over.
	ResetAfter time.Duration
	// Degraded says how the decision was made without Redis; zero when
	// it was made normally.
	Degraded Degraded
}

// Degraded names how a decision was made while Redis was unreachable.
type Degraded uint8

// The ways of deciding without Redis, one per OnError choice.
const (
	NotDegraded Degraded = iota
	DegradedFallback
	DegradedAllow
	DegradedDeny
)

func (d Degraded) String() string {
	return [...]string{"", "fallback", "allow", "deny"}[d]
}

// Limiter decides for one partition key at a time. Implementations are safe
// for concurrent use.
type Limiter interface {
	// Take asks for n units of key under l at now, all or none: n is the
	// request's cost, 1 for one request. n = 0 asks without spending: the
	// decision is the one one unit would get, and nothing is counted. An
	// error means the decision could not be made (for a Redis-backed
	// limiter, the store was unreachable); the Decision is then
	// meaningless.
	Take(ctx context.Context, key string, l Limit, n int64, now time.Time) (Decision, error)
	// Refund gives back n units that Take admitted for key, because another
	// policy denied the same request. It is best effort.
	Refund(ctx context.Context, key string, l Limit, n int64, now time.Time) error
}

// Peeker is a Limiter that can say what Take would decide for key at now
// without taking a unit or creating any state.
type Peeker interface {
	Peek(ctx context.Context, key string, l Limit, now time.Time) (Decision, error)
}

// Inspector is implemented by the limiters whose counts the counters API
// reads and resets, off the data path.
type Inspector interface {
	// Inspect reports key's count under l at now without spending any of
	// it: the decision one unit would get, and where the count lives.
	Inspect(ctx context.Context, key string, l Limit, now time.Time) (Inspection, error)
	// Reset forgets key's count wherever this limiter keeps it (in Redis
	// for the Redis modes), in every algorithm: the key starts afresh.
	// Other replicas forget what they hold of it through Forget.
	Reset(ctx context.Context, key string) error
	// Forget drops what this process holds of key (local counts, levels
	// Redis reported, leased hybrid tokens) without touching Redis: what
	// a replica does when another one reset the key.
	Forget(key string)
}

// Inspection is what Inspect reports of one key.
type Inspection struct {
	// Decision is what one more unit would get now; nothing was spent.
	// Remaining and ResetAfter describe the count.
	Decision Decision
	// Keys are the Redis keys holding the count; none in local mode.
	Keys []string
	// Leased (hybrid mode) is how many tokens this replica holds leased
	// from the Redis bucket and not yet spent: they are not in
	// Decision.Remaining, which counts what Redis holds.
	Leased int64
}
