package redisstore

import (
	"context"
	"crypto/rand"
	_ "embed"
	"encoding/hex"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/extauthz/extauthz/internal/quota"
)

// The scripts, embedded and run by SHA (EVALSHA, falling back to EVAL on
// NOSCRIPT after a Redis restart or failover empties the script cache).
// Each decision is one script call: read, decide and write in one atomic
// step, timed by Redis TIME unless a test injects the time. The token
// bucket's bucket_lease.lua serves redis and hybrid modes alike.
var (
	//go:embed scripts/bucket_state.lua
	bucketStateSrc string
	//go:embed scripts/bucket_lease.lua
	bucketLeaseSrc string
	//go:embed scripts/bucket_return.lua
	bucketReturnSrc string
	//go:embed scripts/peers.lua
	peersSrc string
	//go:embed scripts/epoch.lua
	epochSrc string

	//go:embed scripts/fixed_window.lua
	fixedWindowSrc string
	//go:embed scripts/sliding_window.lua
	slidingWindowSrc string
	//go:embed scripts/window_refund.lua
	windowRefundSrc string
	//go:embed scripts/sliding_log.lua
	slidingLogSrc string
	//go:embed scripts/log_refund.lua
	logRefundSrc string
	//go:embed scripts/leaky_bucket.lua
	leakyBucketSrc string

	bucketLease         = newScript("bucket_lease", bucketStateSrc+bucketLeaseSrc)
	bucketReturn        = newScript("bucket_return", bucketStateSrc+bucketReturnSrc)
	peersScript         = newScript("peers", peersSrc)
	epochScript         = newScript("epoch", epochSrc)
	fixedWindowScript   = newScript("fixed_window", windowTakeSrc+fixedWindowSrc)
	slidingWindowScript = newScript("sliding_window", slidingWindowSrc)
	windowRefundScript  = newScript("window_refund", windowRefundSrc)
	slidingLogScript    = newScript("sliding_log", slidingLogSrc)
	logRefundScript     = newScript("log_refund", logRefundSrc)
	leakyBucketScript   = newScript("leaky_bucket", leakyBucketSrc)
)

// windowTakeSrc defines window_take, the count of one fixed window that
// the fixed and calendar windows share.
//
//go:embed scripts/window_take.lua
var windowTakeSrc string

// clockSrc defines now_us, the time every script decides at.
//
//go:embed scripts/clock.lua
var clockSrc string

// scripts lists every script, for Warm; sources holds each one's whole
// source by name, for ScriptSource.
var (
	scripts []*redis.Script
	sources = map[string]string{}
)

// newScript prepends the clock to src and registers the script, under
// name, for Warm and ScriptSource.
func newScript(name, src string) *redis.Script {
	src = clockSrc + src
	s := redis.NewScript(src)
	scripts = append(scripts, s)
	sources[name] = src
	return s
}

// ScriptSource returns the whole source of the script name (its file's
// name without .lua) as it is sent to Redis, preludes included: for tests
// that run a script with arguments of their own.
func ScriptSource(name string) (string, bool) {
	src, ok := sources[name]
	return src, ok
}

// keySuffix keeps each algorithm's state in a key of its own, after the
// hash tag so it stays in the partition's Cluster slot: a reload that
// changes a policy's algorithm then never reads a hash as a sorted set
// (WRONGTYPE) or one algorithm's fields as another's. The token bucket
// keeps the bare key it has always used.
var keySuffix = [...]string{
	quota.TokenBucket:   "",
	quota.SlidingWindow: ":sw",
	quota.FixedWindow:   ":fw",
	quota.SlidingLog:    ":log",
	quota.LeakyBucket:   ":lb",
}

// algorithmKey returns the Redis key holding partition's state under
// algorithm a, such as "rl:{orders:client:ada}:sw".
func (s *Store) algorithmKey(partition string, a quota.Algorithm) string {
	return s.key(partition) + keySuffix[a]
}

// logMembers makes sliding-log members unique across replicas without a
// Redis round trip: a random prefix per process and a counter.
var logMembers = struct {
	prefix string
	seq    atomic.Uint64
}{prefix: randomHex(8)}

func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

func nextLogMember() string {
	return logMembers.prefix + "-" + strconv.FormatUint(logMembers.seq.Add(1), 36)
}

// decide is one exact decision for units of partition under l (the
// request's cost; 0 asks without spending), whatever the algorithm: one
// atomic call of its script. This is where a limit's algorithm picks its
// script; redis mode, the counters API and hybrid's limits that do not
// lease all decide here. debt (see owesFallback) is charged first: a
// token bucket's in the same call, a budget window's as a charge of its
// own just before (if the decision's call then fails, the caller owes it
// again: charged twice at worst, less admitted, never more).
func (s *Store) decide(ctx context.Context, partition string, l quota.Limit, units, debt int64) (quota.Decision, error) {
	return s.decideHolding(ctx, partition, l, units, debt, windowHold{})
}

// windowHold is what a fixed or sliding window's call holds out of the
// room of the window starting at start (unix µs; the scripts' reserve):
// the fallback's admissions there that Redis never counted (Table.FellBack).
type windowHold struct {
	units, start int64
	// until (unix ns), when not zero, is when the part of units held for
	// the other replicas' fallbacks lapses (Resilient.hold): a denial
	// the hold caused is not cached past it (Hybrid.renewLocked).
	until int64
}

// decideHolding is decide, with hold held out of a fixed or sliding
// window's room.
func (s *Store) decideHolding(ctx context.Context, partition string, l quota.Limit, units, debt int64, hold windowHold) (quota.Decision, error) {
	if debt > 0 && l.Algorithm != quota.TokenBucket && l.Overdraft {
		if _, err := s.decide(ctx, partition, l, debt, 0); err != nil {
			return quota.Decision{}, err
		}
	}
	if l.Calendar != nil {
		return s.decideCalendar(ctx, partition, l, units)
	}
	if l.Algorithm == quota.TokenBucket {
		ls, err := s.lease(ctx, partition, l, leaseAsk{want: units, need: max(units, 1), debt: debt, spent: units, charge: l.Charges(units)})
		if err != nil {
			return quota.Decision{}, err
		}
		return quota.Decision{
			Allowed:    ls.granted == units && ls.wait == 0, // a charge is granted whole
			Limit:      l.Limit,
			Remaining:  ls.remaining,
			RetryAfter: ls.wait,
			ResetAfter: ls.full,
		}, nil
	}
	key := []string{s.algorithmKey(partition, l.Algorithm)}
	now := s.nowArg(time.Microsecond)
	var v any
	var err error
	// A window or log call whose reply comes after the decision stopped
	// waiting gives back what it took (undoWindowLate, undoLogLate); a
	// charge records units already served and stays. The handler is made
	// only for the algorithm that runs (a closure passed on is allocated
	// where it is written, whichever case runs).
	undo := !l.Charges(units)
	switch l.Algorithm {
	case quota.FixedWindow, quota.SlidingWindow:
		script, name := windowScript(l.Algorithm)
		var late lateFunc
		if undo {
			late = func(v any, fate *lateFate) { s.undoWindowLate(partition, l, v, fate) }
		}
		v, err = s.runLate(ctx, name, script, key, late, windowMicros(l), l.Limit, now, units, "", "", "", "", chargeArg(l, units), blockMicros(l), hold.units, hold.start)
	case quota.SlidingLog:
		member := nextLogMember()
		var late lateFunc
		if undo {
			late = func(v any, fate *lateFate) { s.undoLogLate(partition, l, member, units, v, fate) }
		}
		v, err = s.runLate(ctx, "sliding_log", slidingLogScript, key, late, windowMicros(l), l.Limit, member, now, units)
	case quota.LeakyBucket:
		v, err = s.run(ctx, "leaky_bucket", leakyBucketScript, key, intervalMicros(l), toleranceMicros(l), now, units)
	default:
		return quota.Decision{}, fmt.Errorf("redisstore: no redis script for algorithm %s", l.Algorithm)
	}
	if err != nil {
		return quota.Decision{}, err
	}
	return decisionOf(l.Algorithm.String(), l, v)
}

// undoWindowLate gives back what a fixed or sliding window call took
// when its reply came after the decision stopped waiting for it
// (runLate), as undoLate does for the token bucket: the request in hand
// was decided without it, so Redis counted the units for nobody. They go
// back to the window the call counted them in (the reply's window start,
// the scripts' lease give-back), and only there: a window that has ended
// keeps them (a fixed window's count is gone by then; a sliding window's
// previous count takes them back), and a later window is never credited
// with units it did not count. A give-back that fails too is lost: the
// replicas then admit less, never more. The units of a request the
// fallback admitted stay counted (lateFate): they are that admission's.
func (s *Store) undoWindowLate(partition string, l quota.Limit, v any, fate *lateFate) {
	r, ok := v.([]any)
	if !ok || len(r) != 8 {
		return
	}
	granted, _ := r[5].(int64)
	ws, _ := r[6].(int64)
	if granted <= 0 {
		return
	}
	if granted = s.notKept(fate, granted); granted <= 0 {
		return
	}
	if s.giveBackWindow(context.Background(), partition, l, ws, granted) == nil {
		s.opts.Metrics.TokensReturned.WithLabelValues(string(ReturnLate)).Add(float64(granted))
	}
}

// giveBackWindow gives units back to the window of partition under l (a
// fixed or sliding window) that starts at ws (unix µs): to that window's
// count, or a sliding window's previous count once it has ended, and
// nowhere else. (window_refund.lua gives back to the window current when
// it runs, right for a refund made with the decision, not for units
// counted a window or more before.) Only l's algorithm and window are
// read: the script's take is of nothing (want and need 0), so its limit
// decides nothing, and nothing is blocked (no block_for).
func (s *Store) giveBackWindow(ctx context.Context, partition string, l quota.Limit, ws, units int64) error {
	return s.giveBackWindowAs(ctx, "return", partition, l, ws, units)
}

// windowScript is the script of window algorithm a (fixed or sliding)
// and its name as a call's op.
func windowScript(a quota.Algorithm) (*redis.Script, string) {
	if a == quota.SlidingWindow {
		return slidingWindowScript, "sliding_window"
	}
	return fixedWindowScript, "fixed_window"
}

// giveBackWindowAs is giveBackWindow, counted as op.
func (s *Store) giveBackWindowAs(ctx context.Context, op, partition string, l quota.Limit, ws, units int64) error {
	script, _ := windowScript(l.Algorithm)
	_, err := s.run(ctx, op, script, []string{s.algorithmKey(partition, l.Algorithm)},
		windowMicros(l), l.Limit, s.nowArg(time.Microsecond), 0, 0, "", ws, units, "", "")
	return err
}

// notKept returns how many of the units a late reply's call took go
// back: those the decision's fallback did not admit (lateFate.keep),
// counting the kept ones.
func (s *Store) notKept(fate *lateFate, took int64) int64 {
	kept := fate.keep(took)
	if kept > 0 {
		s.opts.Metrics.LateKept.Add(float64(kept))
	}
	return took - kept
}

// undoLogLate is undoWindowLate for a sliding log: the entries the call
// added (member, member.2, …: unique across replicas) are removed by
// name, so a late give-back takes out that take's entries and no other
// request's. Those of a request the fallback admitted stay (lateFate).
func (s *Store) undoLogLate(partition string, l quota.Limit, member string, units int64, v any, fate *lateFate) {
	r, ok := v.([]any)
	if !ok || len(r) < 1 || units <= 0 {
		return
	}
	if allowed, _ := r[0].(int64); allowed != 1 {
		return // denied: the take logged nothing
	}
	back := s.notKept(fate, units)
	if back <= 0 {
		return
	}
	args := []any{back}
	for i := units - back + 1; i <= units; i++ {
		if i == 1 {
			args = append(args, member)
		} else {
			args = append(args, member+"."+strconv.FormatInt(i, 10))
		}
	}
	if _, err := s.run(context.Background(), "return", logRefundScript, []string{s.algorithmKey(partition, l.Algorithm)}, args...); err == nil {
		s.opts.Metrics.TokensReturned.WithLabelValues(string(ReturnLate)).Add(float64(back))
	}
}

// chargeArg is the scripts' charge flag: "1" when a take of units under l
// is a charge (quota.Limit.Charges), counted whatever is left.
func chargeArg(l quota.Limit, units int64) string {
	if l.Charges(units) {
		return "1"
	}
	return ""
}

// decisionOf reads the reply every deciding script gives: {allowed,
// remaining, retry after, reset after, delay}, the durations in
// microseconds (the window scripts add what windowLease reads).
func decisionOf(script string, l quota.Limit, v any) (quota.Decision, error) {
	r, ok := v.([]any)
	if !ok || len(r) < 5 {
		return quota.Decision{}, fmt.Errorf("redisstore: %s script returned %v", script, v)
	}
	n := func(i int) int64 { x, _ := r[i].(int64); return x }
	us := func(i int) time.Duration { return time.Duration(n(i)) * time.Microsecond }
	return quota.Decision{
		Allowed:    n(0) == 1,
		Limit:      l.Limit,
		Remaining:  n(1),
		RetryAfter: us(2),
		ResetAfter: us(3),
		Delay:      us(4),
	}, nil
}

// refund gives back units that decide admitted for partition under l at
// taken (the take's instant; zero: not known). A fixed or sliding
// window's go back to the window that counted them, the one holding
// taken, and only there (giveBackWindow, as a lease's): a refund made
// after the window turned must not credit the next window, which never
// counted them (window_refund.lua, used when taken is not known, credits
// the window holding Redis's clock).
func (s *Store) refund(ctx context.Context, partition string, l quota.Limit, units int64, taken time.Time) error {
	if l.Calendar != nil {
		return s.refundCalendar(ctx, partition, l, units)
	}
	if l.Algorithm == quota.TokenBucket {
		_, err := s.giveBack(ctx, partition, units, held{})
		return err
	}
	key := []string{s.algorithmKey(partition, l.Algorithm)}
	now := s.nowArg(time.Microsecond)
	var err error
	switch l.Algorithm {
	case quota.FixedWindow, quota.SlidingWindow:
		if !taken.IsZero() {
			return s.giveBackWindowAs(ctx, "refund", partition, l, windowStartMicros(l, taken), units)
		}
		sliding := 0
		if l.Algorithm == quota.SlidingWindow {
			sliding = 1
		}
		_, err = s.run(ctx, "refund", windowRefundScript, key, windowMicros(l), sliding, now, units)
	case quota.SlidingLog:
		_, err = s.run(ctx, "refund", logRefundScript, key, units)
	case quota.LeakyBucket:
		_, err = s.run(ctx, "refund", bucketReturn, key, units, now) // a slot back: no lease to check
	default:
		return fmt.Errorf("redisstore: no redis script for algorithm %s", l.Algorithm)
	}
	return err
}

// windowMicros formats l's window in whole microseconds, the scripts'
// resolution for window boundaries.
func windowMicros(l quota.Limit) string {
	return strconv.FormatInt(max(int64(l.Window/time.Microsecond), 1), 10)
}

// toleranceMicros formats a leaky bucket's tolerance in microseconds,
// keeping the fraction.
func toleranceMicros(l quota.Limit) string {
	return strconv.FormatFloat(float64(l.Tolerance())/1e3, 'f', 3, 64)
}
