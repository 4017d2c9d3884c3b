package engine

import (
	"context"
	"fmt"
	"time"

	"github.com/extauthz/extauthz/internal/config"
	"github.com/extauthz/extauthz/internal/quota"
)

// TakeAll decides one request's takes at now, all or nothing: it asks each
// take's limiter for its Units in order, counts each decision in its
// policy's metrics, stops at the first enforcing denial (the takes after
// it are not asked, so a denied request creates no state in them: a
// caller cannot fill a table with keys a denied request names), refunds
// what was taken when an enforcing take was denied, and
// holds an allowed request for the longest leaky-bucket Delay its
// enforcing takes asked for (hold waits it out; nil: a timer). It fills
// each asked take's Decision and OK, and returns how many takes it asked
// (all of them unless one denied) and how the request ends:
//
//   - OK: every enforcing take allowed (shadow takes may have denied);
//   - OverLimit: an enforcing take denied; nothing stays spent;
//   - Unavailable: every enforcing denial came from on_redis_error: deny;
//   - Failed, with the limiter's error: a limiter failed in a way no
//     policy setting covers; what was taken before it is refunded;
//   - Canceled, with the context's error: the caller gave up while the
//     request was held; its units are refunded.
//
// A charge (a take of units under charge: always, quota.Limit.Charges) is
// a fact, not a request: it is never denied, never refunded, and still
// made when another take denied the request, so no reported unit is
// lost. The other takes stay all or none among themselves.
//
// Engine.Decide runs the takes of a Check through it, and every other door
// runs its own (internal/rls: one per rate limit descriptor) the same way,
// so the guarantees of a request's decisions hold whichever door asked.
func TakeAll(ctx context.Context, takes []Taken, now time.Time, hold HoldFunc) (Outcome, int, error) {
	denied := false
	ns := now.UnixNano()
	for i := range takes {
		t := &takes[i]
		if t.unlimited(ns) {
			continue
		}
		var d quota.Decision
		switch {
		case t.Units > t.Limit.MaxCost():
			// A cost the limit can never grant: denied without asking
			// the limiter, whose wait for it would be meaningless (a
			// token bucket's refill time for 2^32 tokens). A Check's is
			// denied before TakeAll (Engine.Decide); another door's,
			// such as a rate limit descriptor's hits_addend, here.
			d = tooCostly(t.Limit)
		default:
			var err error
			d, err = t.Policy.limiter.Take(ctx, t.Key, t.Limit.Limit, t.Units, now)
			if err != nil {
				refund(ctx, takes[:i], now)
				return Failed, i, fmt.Errorf("policy %s: %w", t.Policy.Name, err)
			}
		}
		if t.record(d) == enforcedDenial {
			denied = true
		}
		if denied {
			// A request denied by one policy consumes nothing from the
			// others, but for its charges.
			chargeRest(ctx, takes[i+1:], now)
			takes = takes[:i+1]
			refund(ctx, takes, now)
			return deniedOutcome(takes)
		}
	}
	return allowedOutcome(ctx, takes, now, hold)
}

// unlimited shows t to the counters API's top keys (Check's policies)
// at ns and, when its limit is unlimited, allows it without asking and
// reports true.
func (t *Taken) unlimited(ns int64) bool {
	if t.Policy.top != nil {
		t.Policy.top.Observe(t.Key, ns, t.Policy.usageAux(&t.Limit))
	}
	if !t.Limit.Unlimited {
		return false
	}
	t.Decision, t.OK = quota.Decision{Allowed: true}, true
	t.Policy.unlimited.Inc()
	return true
}

// takeResult is what a take's decision was to its request.
type takeResult int

const (
	takeAllowed    takeResult = iota
	shadowDenial              // denied under a shadow policy: counted, not enforced
	enforcedDenial            // denied: the request is denied
)

// record keeps d as t's decision and counts it in t's policy's metrics.
func (t *Taken) record(d quota.Decision) takeResult {
	t.Decision, t.OK = d, d.Allowed
	if d.Degraded != quota.NotDegraded {
		t.Policy.degraded[d.Degraded].Inc()
	}
	switch {
	case d.Allowed:
		t.Policy.allowed.Inc()
		return takeAllowed
	case t.Policy.Shadow:
		t.Policy.shadowDenied.Inc()
		return shadowDenial
	default:
		t.Policy.denied.Inc()
		return enforcedDenial
	}
}

// deniedOutcome is how a request its takes denied ends: Unavailable when
// every enforcing denial came from on_redis_error: deny, else OverLimit.
func deniedOutcome(takes []Taken) (Outcome, int, error) {
	if unavailable(takes) {
		return Unavailable, len(takes), nil
	}
	return OverLimit, len(takes), nil
}

// allowedOutcome holds an allowed request for its takes' delays (hold;
// nil: a timer) and ends it OK, or Canceled when the caller gave up.
func allowedOutcome(ctx context.Context, takes []Taken, now time.Time, hold HoldFunc) (Outcome, int, error) {
	if hold == nil {
		hold = sleepCtx
	}
	if err := holdAllowed(ctx, takes, now, hold); err != nil {
		return Canceled, len(takes), err
	}
	return OK, len(takes), nil
}

// chargeRest makes the charges among the takes a denial left unasked.
// They are counted in their policies' metrics as allowed; their decisions
// are not reported (the request is denied; Envoy ignores the answer to a
// stream-done call anyway). A charge that fails is lost, as any take whose
// limiter fails.
func chargeRest(ctx context.Context, takes []Taken, now time.Time) {
	for i := range takes {
		t := &takes[i]
		if t.Limit.Unlimited || !t.Limit.Charges(t.Units) {
			continue
		}
		if _, err := t.Policy.limiter.Take(ctx, t.Key, t.Limit.Limit, t.Units, now); err == nil {
			t.Policy.allowed.Inc()
		}
	}
}

// refund gives back the units that allowed policies took; charges stay.
// A policy's refunded count moves only for a refund its limiter made (or,
// in hybrid mode, queued to Redis): one that failed left the units spent.
func refund(ctx context.Context, takes []Taken, now time.Time) {
	for i := range takes {
		t := &takes[i]
		if t.OK && t.Units > 0 && !t.Limit.Unlimited && !t.Limit.Charges(t.Units) {
			if err := t.Policy.limiter.Refund(ctx, t.Key, t.Limit.Limit, t.Units, now); err == nil {
				t.Policy.refunded.Inc()
			}
		}
	}
}

// TakeEach decides one request's takes at now as envoyproxy/ratelimit
// counts a RateLimitRequest's descriptors: every take is asked (a denial
// does not stop the others), each decides on its own, and each counts
// its units whether it was allowed or denied: a denied take's units are
// charged after its denial (quota.Limit.Overdraft, the path of charge:
// always), so its count passes the limit as the anchor's INCRBY does, and
// a limit raised later sees them. Nothing is refunded. Under
// opts.StopOver (rls.counting: each_stop_when_over), when any take was denied (shadow ones included, as the
// anchor's check is), the allowed takes are refunded (the anchor does not
// increment them) and report the remaining they found before their own
// units; the denied ones are still counted.
//
// A denied take's count is a limiter call of its own (the charge); in
// redis and hybrid mode the charges of a fixed window wait in
// opts.Deferred (when set), summed per key and made at most once per its
// interval (DeferredCharges), so that an over-limit flood costs Redis
// about what all or nothing costs it. Only fixed
// windows count a denied take's units (charges). The outcome is
// TakeAll's; it returns len(takes) asked.
func TakeEach(ctx context.Context, takes []Taken, now time.Time, hold HoldFunc, opts EachOptions) (Outcome, int, error) {
	ns := now.UnixNano()
	anyDenied, enforcingDenied := false, false
	for i := range takes {
		t := &takes[i]
		if t.unlimited(ns) {
			continue
		}
		var d quota.Decision
		charged := false
		switch {
		case t.Units > t.Limit.MaxCost() && opts.Deferred != nil && defers(t) && t.Policy.Mode == config.ModeHybrid:
			// The same in hybrid mode, where the charge waits with the
			// key's other denied hits (a charge made now would also
			// retire the key's lease): over until the window ends.
			d = tooCostly(t.Limit)
			w := int64(t.Limit.Window)
			d.RetryAfter = time.Duration(w - ns%w)
			d.ResetAfter = d.RetryAfter
		case t.Units > t.Limit.MaxCost() && charges(t.Limit.Algorithm):
			// More than the limit at once: over, and counted (the
			// anchor's INCRBY of it), in one call, the charge; its
			// decision says when the count resets.
			l := t.Limit.Limit
			l.Overdraft = true
			var err error
			d, err = t.Policy.limiter.Take(ctx, t.Key, l, t.Units, now)
			if err != nil {
				return Failed, i, fmt.Errorf("policy %s: %w", t.Policy.Name, err)
			}
			d.Allowed, d.Remaining, d.RetryAfter, charged = false, 0, max(d.RetryAfter, d.ResetAfter), true
		case t.Units > t.Limit.MaxCost():
			d = tooCostly(t.Limit)
		default:
			l, question := t.Limit.Limit, anchorQuestion(t)
			if question {
				l.Limit++ // see anchorQuestion
			}
			var err error
			d, err = t.Policy.limiter.Take(ctx, t.Key, l, t.Units, now)
			if err != nil {
				return Failed, i, fmt.Errorf("policy %s: %w", t.Policy.Name, err)
			}
			if question {
				d.Limit, d.Remaining = t.Limit.Limit.Limit, max(d.Remaining-1, 0)
			}
		}
		switch t.record(d) {
		case shadowDenial:
			anyDenied = true
		case enforcedDenial:
			anyDenied, enforcingDenied = true, true
		}
		if !d.Allowed && !charged {
			chargeDenied(ctx, t, now, opts.Deferred)
		}
	}
	if opts.StopOver && anyDenied {
		for i := range takes {
			t := &takes[i]
			if t.OK && t.Units > 0 && !t.Limit.Unlimited && !t.Limit.Charges(t.Units) {
				if err := t.Policy.limiter.Refund(ctx, t.Key, t.Limit.Limit, t.Units, now); err == nil {
					t.Policy.refunded.Inc()
					t.Decision.Remaining = min(t.Decision.Remaining+t.Units, t.Limit.Limit.Limit)
				}
			}
		}
	}
	if enforcingDenied {
		return deniedOutcome(takes)
	}
	return allowedOutcome(ctx, takes, now, hold)
}

// anchorQuestion reports whether t is a question (0 units) that TakeEach
// asks under its limit plus one: envoyproxy/ratelimit answers a question
// OK while the count is at most the limit (its INCRBY 0 finds the count
// not over), where a question of our limiters asks whether one more unit
// fits (the count below the limit). Asked under limit + 1, a fixed
// window's question is allowed exactly while count <= limit, and its
// remaining, less one, is limit - count, the anchor's. Only a fixed
// window outside hybrid mode (where a lease sized by another limit would
// be retired) is asked so; other questions keep our meaning.
func anchorQuestion(t *Taken) bool {
	return t.Units == 0 && t.Limit.Algorithm == quota.FixedWindow && t.Policy.Mode != config.ModeHybrid
}

// chargeDenied counts the units of a denied take t past its limit, as a
// charge (the decision stays the denial). A take denied by
// on_redis_error: deny is not charged (Redis is unreachable), nor is one
// of an algorithm that cannot charge; one the fallback denied is charged
// to the fallback, which owes it to Redis as it owes any charge.
func chargeDenied(ctx context.Context, t *Taken, now time.Time, deferred *DeferredCharges) {
	l := t.Limit.Limit
	if t.Units <= 0 || t.Decision.Degraded == quota.DegradedDeny || !charges(l.Algorithm) {
		return
	}
	n := t.Units
	l.Overdraft = true
	if deferred != nil && defers(t) {
		if n, l = deferred.add(t, now); n == 0 {
			return
		}
	}
	_, _ = t.Policy.limiter.Take(ctx, t.Key, l, n, now) // a count lost with an unreachable store, as any take's
}

// EachOptions are TakeEach's.
type EachOptions struct {
	// StopOver counts only the denied takes when one is (rls.counting:
	// each_stop_when_over, STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT).
	StopOver bool
	// Deferred, when set, holds the denied hits of hybrid fixed windows
	// to charge them summed (nil: each is charged at once).
	Deferred *DeferredCharges
}

// charges reports whether TakeEach counts a denied take's hits under
// algorithm a: the fixed window only, envoyproxy/ratelimit's counter,
// whose end forgives what passed the limit. A token bucket would go
// into debt without end under a flood faster than its refill, and the
// other algorithms (set in extauthz's own configuration) have no such
// counter: their denied takes count nothing.
func charges(a quota.Algorithm) bool { return a == quota.FixedWindow }
