package redisstore

import (
	"context"
	"errors"
	"time"

	"github.com/extauthz/extauthz/internal/quota"
	"github.com/extauthz/extauthz/internal/quota/local"
)

// Resilient wraps a Redis-backed limiter (Redis or Hybrid) so that a Redis
// failure is never an error to the caller: each limit follows its OnError.
// With ErrorFallback the key is decided by local.Fallback, with the limit's
// own algorithm, at limit ÷ peers, so the replicas together stay close to
// the limit while each decides alone.
//
// A fallback never starts from a fresh budget when Redis told this replica
// something about the key: every decision Redis made (and, in hybrid mode,
// every lease) left the key's remaining count in the Table, and the
// fallback bucket holds at most this replica's share of it, brought
// forward by what the algorithm restores since. That matters most after a
// call that failed but may have run: a timed-out script may have spent
// units in Redis. For the same reason, a key Redis has never reported on
// starts empty after such a call while Redis is up (it refills at the
// share's rate). A key new to this replica gets a fresh share while the
// store is marked down, or when the call certainly did not run (a refused
// connection, say, to one failed master of a Cluster).
type Resilient struct {
	primary  quota.Limiter
	levels   LevelSource
	fallback *local.Fallback
	peers    PeerCounter
	breaker  Breaker
	// clock says when a failure is known (time.Now; tests give the clock
	// their decisions' times come from): a call that may have run leaves
	// its key's share empty as of the decision's time, refilled until
	// then (local.StartEmpty). Read on failures only.
	clock func() time.Time
	// downUntil and downSince say until when Redis may be out of the
	// replicas' reach and since when it has been without answering this
	// one (Store.DownUntil, Store.DownSince; nil: never known), for
	// windows (windowLevel, hold).
	downUntil, downSince func() time.Time
	// chargesFellBack says whether every replica charges its windows'
	// fallback units to Redis as it comes back (Store.ChargesFellBack):
	// then hold keeps the others' shares only while they may still be
	// falling back. Nil: never (held for the rest of the window).
	chargesFellBack func() bool
}

// outageClock is what a Breaker may also tell: Store's.
type outageClock interface {
	DownUntil() time.Time
	DownSince() time.Time
	ChargesFellBack() bool
}

var _ quota.Limiter = (*Resilient)(nil)

// LevelSource says what Redis last reported for a key under l (at most),
// and keeps what the fallback admitted for Redis to be charged: Table for
// redis mode, Hybrid for hybrid mode.
type LevelSource interface {
	Level(key string, l quota.Limit) (local.Level, bool)
	OweUnder(key string, l quota.Limit, units int64)
	// FellBack and FellBackIn keep what the fallback admitted of a
	// window (Table.FellBack).
	FellBack(key string, l quota.Limit, start, took int64)
	FellBackIn(key string, start int64) int64
}

// Breaker tells whether a failed call was Redis going down (Store).
type Breaker interface {
	AwaitVerdict(ctx context.Context, partition string) (down bool)
}

// NewResilient returns primary with the behaviour above: levels are what
// the primary recorded, fallback the buckets it falls back to, peers the
// replica count, breaker the judge of whether a failed call was an outage.
func NewResilient(primary quota.Limiter, levels LevelSource, fallback *local.Fallback, peers PeerCounter, breaker Breaker) *Resilient {
	r := &Resilient{primary: primary, levels: levels, fallback: fallback, peers: peers, breaker: breaker, clock: time.Now}
	if c, ok := breaker.(outageClock); ok {
		r.downUntil, r.downSince, r.chargesFellBack = c.DownUntil, c.DownSince, c.ChargesFellBack
	}
	return r
}

// WithClock makes r tell when a failure is known by now (time.Now by
// default), for tests whose decisions' times come from a clock of their
// own. It returns r.
func (r *Resilient) WithClock(now func() time.Time) *Resilient {
	r.clock = now
	return r
}

// localTaker is a primary that decides some takes from memory alone
// (hybrid's slices), asked before a deadline is set up for a call.
type localTaker interface {
	TakeLocal(key string, l quota.Limit, n int64, now time.Time) (quota.Decision, bool)
}

// Take implements quota.Limiter. It returns an error only when ctx is done.
func (r *Resilient) Take(ctx context.Context, key string, l quota.Limit, n int64, now time.Time) (quota.Decision, error) {
	if lt, ok := r.primary.(localTaker); ok {
		if d, ok := lt.TakeLocal(key, l, n, now); ok {
			return d, nil // from memory: no call to time, no hold to keep
		}
	}
	// The primary answers within the caller's deadline less a tenth of
	// what was left of it when the decision began, so that a decision by
	// on_redis_error still arrives in time: each Redis call keeps that
	// tenth (Store.timeout), but a decision may also wait without
	// calling (hybrid's wait for another request's lease of the key,
	// which may itself wait for another), and a wait cut off only by the
	// caller's own deadline is an error at Envoy, not a decision.
	pctx := ctx
	if dl, ok := ctx.Deadline(); ok {
		var cancel context.CancelFunc
		pctx, cancel = context.WithDeadline(ctx, dl.Add(-max(dl.Sub(now), 0)/10))
		defer cancel()
	}
	if countsWindow(l) {
		pctx = withHold(pctx, r.hold(key, l, now))
	}
	d, err := r.primary.Take(pctx, key, l, n, now)
	if err == nil {
		return d, nil
	}
	// The fates of the calls this decision stopped waiting for (two at
	// most: a second call below), settled with the decision: a late reply
	// may stand as the fallback's admission (lateFate).
	fates := [2]*lateFate{fateOf(err)}
	admitted := int64(0)
	defer func() {
		for _, f := range fates {
			if f != nil {
				f.settle(admitted)
				admitted = 0 // one take stands for the admission
			}
		}
	}()
	down := errors.Is(err, ErrStoreDown)
	if ctxErr := ctx.Err(); ctxErr != nil && !down {
		return quota.Decision{}, ctxErr // the caller gave up; nobody will read a decision
	}
	if !down && unavailable(err) && r.timeLeft(pctx, now) {
		// A timeout or a broken connection: wait for the breaker's
		// verdict. An outage is answered as one; while Redis answers,
		// ask once more, within what is left of the caller's deadline:
		// a slow moment should not cost a decision made without Redis.
		// (A first call that ran and whose reply came late is given back
		// when the reply arrives, Store.undoLate; one whose reply never
		// came spends twice: the replicas then admit less, never more.)
		// The wait and the second call keep the primary's deadline, so
		// that the decision, by on_redis_error if it comes to that,
		// arrives before the caller's: after a first call that ran into
		// its share of the deadline, nothing is asked again.
		if down = r.breaker.AwaitVerdict(pctx, key); !down && pctx.Err() == nil {
			d, err2 := r.primary.Take(pctx, key, l, n, now)
			if err2 == nil {
				return d, nil
			}
			fates[1] = fateOf(err2)
			if errors.Is(err2, ErrStoreDown) {
				down = true
			}
		}
		if ctxErr := ctx.Err(); ctxErr != nil && !down {
			return quota.Decision{}, ctxErr
		}
	}
	ran := !down && mayHaveRun(err)
	switch l.OnError {
	case quota.ErrorAllow:
		return quota.Decision{Allowed: true, Limit: l.Limit, Remaining: l.Limit - 1, Degraded: quota.DegradedAllow}, nil
	case quota.ErrorDeny:
		return quota.Decision{Limit: l.Limit, RetryAfter: time.Second, Degraded: quota.DegradedDeny}, nil
	}
	var level *local.Level
	if lv, ok := r.levels.Level(key, l); ok {
		level = &lv
	}
	window := countsWindow(l)
	if window {
		level = r.windowLevel(l, level, ran, now)
	}
	start, sentAt := local.StartFresh, now
	if ran {
		// Empty when the decision began (now, the call sent just after),
		// and refilled while the call failed: the fallback decides once
		// the failure is known. (Else a request whose own call failed in
		// flight would be denied by a share emptied that instant, whatever
		// the policy's rate.)
		start = local.StartEmpty
		// A window's request is decided at its own instant, in the
		// window its call was sent in, as Redis would have counted it:
		// the call's take, when its reply comes late, stands as this
		// admission's count (lateFate), and counted in that window it
		// must be this admission's window too. (Decided when the failure
		// is known, a call sent just before the window turned was counted
		// in one window by Redis and admitted in the next by the
		// fallback, on top of that one's limit.)
		if known := r.clock(); known.After(now) && !window {
			now = known
		}
	}
	peers := r.peers.Count()
	d, err = r.fallback.Take(key, l, n, peers, now, level, start, sentAt)
	if err != nil {
		return quota.Decision{}, err
	}
	if d.Allowed && owesFallback(l) {
		r.levels.OweUnder(key, l, n) // charged to the Redis bucket when it answers again
	}
	if ran && d.Allowed {
		// A call that ran late took these units: they stand (the windows'
		// and the log's late replies keep them; a token bucket's, whose
		// fallback admissions are charged as debt, gives back whatever).
		admitted = n
	}
	if window && !ran {
		// Redis counted none of what the replicas' fallbacks admit in
		// this window: held out of its room when it answers again
		// within the window (Table.FellBack).
		var took int64
		if d.Allowed {
			took = n
		}
		r.levels.FellBack(key, l, windowStartMicros(l, sentAt), took)
	}
	d.Degraded = quota.DegradedFallback
	return d, nil
}

// windowLevel is the level a window's fallback starts from in the
// window holding now, given what Redis last reported for the key (level,
// nil: nothing). The fallback's share of a window adds to what Redis
// counted in it, so it must not start from a full share in a window
// Redis may have counted in without this replica knowing how much:
//
//   - after a call that may have run while Redis answers (ran), the
//     other replicas go on counting in Redis, and this replica no longer
//     knows the window's count from the instant the call was sent;
//   - when Redis went out of reach within the window, the window was
//     counted in Redis until then, and may still be by replicas whose
//     breakers have not opened;
//
// in both, the share starts from what Redis last reported in this window
// and never holds more than the limit's part of the window left after the
// instant the count became unknown (restOfWindow): what the policy's rate
// admits from then on, as a token bucket's fallback refills from then on.
// A key over the limit before that instant may so admit, in that one
// window, up to that part again (a window whose last tenth is left: a
// tenth of the limit), and a key below it is not denied for the rest of
// the window for want of a count: a brand-new client of a generous limit
// is admitted through an outage (tests/rls_test.go,
// TestRLSRedisKilledUnderLoad), while a small limit's share of that part
// rounds down to nothing (3 a second over three replicas: none). The
// window's calls to Redis hold the fallbacks' admissions out of its room
// if it comes back before the window ends (hold).
//
//   - when Redis has been out of this replica's reach since before the
//     window began, the window is the fallback's as far as this replica
//     can tell (an outage takes Redis from every replica alike) and it
//     has its full share. A fault on this replica's link alone leaves the
//     others counting in Redis: then this share is admitted on top of the
//     window, once per window of the fault.
func (r *Resilient) windowLevel(l quota.Limit, level *local.Level, ran bool, now time.Time) *local.Level {
	start := windowStartMicros(l, now)
	known := level
	if known != nil && windowStartMicros(l, known.At) != start {
		known = nil // an older window's count
	}
	if ran {
		return restOfWindow(l, known, now, now)
	}
	if known != nil {
		return known // Redis's own count of this window
	}
	if r.downSince == nil {
		return level // a Breaker that cannot tell (tests'): a full share
	}
	since := r.downSince()
	if !since.IsZero() && since.UnixMicro() < start {
		return level // out of reach since before the window: a full share
	}
	if since.IsZero() || since.After(now) {
		since = now
	}
	return restOfWindow(l, nil, since, now)
}

// restOfWindow is the level of l's window holding now whose count this
// replica has not known since lost: the limit's part of the window left
// after lost, and no more than known (Redis's last report in the window),
// at now.
func restOfWindow(l quota.Limit, known *local.Level, lost, now time.Time) *local.Level {
	w := max(int64(l.Window/time.Microsecond), 1)
	left := min(max(windowStartMicros(l, now)+w-lost.UnixMicro(), 0), w)
	rest := int64(float64(l.Limit) * float64(left) / float64(w)) // no overflow for a day's window of a large limit
	if known != nil {
		rest = min(rest, known.Remaining)
	}
	return &local.Level{Remaining: rest, At: now}
}

// hold is what a call to Redis for key's window (fixed or sliding) under
// l at now holds out of the window's room: what this replica's fallback
// admitted of the key in this window, which Redis never counted, and,
// when Redis may have been out of the replicas' reach at some instant of
// the window (Store.DownUntil: out of this one's, or within a probe round
// after), what the other replicas' fallbacks may have admitted of it
// meanwhile, a share each (quota.Share): an outage takes Redis from every
// replica alike, each replica's breaker lets Redis back at an instant of
// its own, and a replica cannot know what the others admitted, only that
// none admitted more than its share. Without it, a window in which Redis
// came back admitted the replicas' fallback shares and then the whole
// limit again from Redis. The price is under-use: when the others
// admitted less than their shares, the window is denied what they did
// not use while their shares are held. Where every replica charges its
// fallback's units to Redis as it comes back (Store.ChargesFellBack), the
// others' shares are held until DownUntil only, the last instant another
// replica may still be falling back: from then on each one's admissions
// are in Redis's count. (Else for the rest of the window: the window in
// which an outage ended admitted a third of the limit over three
// replicas, and an hour's window, for the rest of its hour.)
func (r *Resilient) hold(key string, l quota.Limit, now time.Time) windowHold {
	h := windowHold{start: windowStartMicros(l, now)}
	h.units = r.levels.FellBackIn(key, h.start)
	if r.downUntil == nil {
		return h
	}
	until := r.downUntil()
	if until.UnixMicro() < h.start {
		return h
	}
	charged := r.chargesFellBack != nil && r.chargesFellBack()
	if !charged || until.After(now) {
		peers := max(r.peers.Count(), 1)
		h.units += (peers - 1) * quota.Share(l, peers).Limit
		if charged {
			h.until = until.UnixNano()
		}
	}
	return h
}

type holdKey struct{}

// withHold carries a window call's hold to the primary (Redis, Hybrid)
// across quota.Limiter.
func withHold(ctx context.Context, h windowHold) context.Context {
	if h.units <= 0 {
		return ctx
	}
	return context.WithValue(ctx, holdKey{}, h)
}

// holdFrom is the hold Resilient put in ctx; none when it put none.
func holdFrom(ctx context.Context) windowHold {
	h, _ := ctx.Value(holdKey{}).(windowHold)
	return h
}

// countsWindow says whether l counts fixed or sliding windows of its own
// length that the fallback's decisions are kept against (FellBack): not a
// calendar's (its windows are not epoch aligned) nor a budget's (its
// fallback admissions are charged as debt, owesFallback).
func countsWindow(l quota.Limit) bool {
	return l.OnError == quota.ErrorFallback && (l.Algorithm == quota.FixedWindow || l.Algorithm == quota.SlidingWindow) && l.Calendar == nil && !l.Overdraft
}

// windowStartMicros is the start (unix µs) of l's window holding t, as
// the window scripts count it: epoch aligned.
func windowStartMicros(l quota.Limit, t time.Time) int64 {
	w := max(int64(l.Window/time.Microsecond), 1)
	us := t.UnixMicro()
	return us - us%w
}

// timeLeft says whether what is left of the primary's deadline is worth
// a wait for the breaker's verdict and a second call: at least as long
// as the decision has taken so far. A first call that ran into its
// timeout leaves too little for a second to fare better on the same
// link, and the wait would only bring the answer to the brink of the
// caller's deadline, where a loaded machine pushes it past (an error at
// Envoy). The fallback then answers at once, as after a call that may
// have run. A refused or broken connection fails fast and leaves time.
func (r *Resilient) timeLeft(pctx context.Context, now time.Time) bool {
	dl, ok := pctx.Deadline()
	if !ok {
		return true
	}
	at := r.clock()
	return dl.Sub(at) >= at.Sub(now)
}

// Refund implements quota.Limiter: to Redis when it answers, else to the
// local fallback bucket; under on_redis_error allow or deny, nowhere, and
// Redis's error says so (the units stay spent: less admitted, never more).
func (r *Resilient) Refund(ctx context.Context, key string, l quota.Limit, n int64, now time.Time) error {
	if err := r.primary.Refund(ctx, key, l, n, now); err == nil || l.OnError != quota.ErrorFallback {
		return err
	}
	// The debt stays: the unit may have been one Redis admitted, and a
	// debt too high only makes the replicas admit less, never more.
	r.fallback.Refund(key, l, n, r.peers.Count(), now)
	return nil
}

// owesFallback says whether what the fallback admits for a key under l is
// owed to its Redis count, charged with the key's next call once Redis
// answers: a token bucket's, whose level carries on; not a window's, whose
// fallback count ends with its window (its Redis count is the window's
// own), unless the window's takes are charges (charge: always): a token
// budget's charges are facts, the tokens a response reported, and a
// budget's window (a day, a month) outlasts an outage, so they are
// charged to the window's count too (to the window holding Redis TIME
// when it answers: after a window turned in the outage, to the new one:
// less admitted, never more). The one place that rule is written: redis
// mode, hybrid leases and budgets, and the fallback all ask here.
func owesFallback(l quota.Limit) bool {
	return l.OnError == quota.ErrorFallback && (l.Algorithm == quota.TokenBucket || l.Overdraft)
}
