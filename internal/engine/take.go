package engine

import (
	"context"
	"fmt"
	"time"

	"github.com/extauthz/extauthz/internal/quota"
)

// TakeAll decides one request's takes at now, all or nothing: it asks each
// take's limiter for its Units, counts each decision in its policy's
// metrics, refunds what was taken when any enforcing take was denied, and
// holds an allowed request for the longest leaky-bucket Delay its
// enforcing takes asked for (hold waits it out; nil: a timer). It fills
// each take's Decision and OK, and returns how the request ends:
//
//   - OK: every enforcing take allowed (shadow takes may have denied);
//   - OverLimit: an enforcing take denied; nothing stays spent;
//   - Unavailable: every enforcing denial came from on_redis_error: deny;
//   - Failed, with the limiter's error: a limiter failed in a way no
//     policy setting covers; what was taken before it is refunded;
//   - Canceled, with the context's error: the caller gave up while the
//     request was held; its units are refunded.
//
// Engine.Decide runs the takes of a Check through it, and every other door
// runs its own (internal/rls: one per rate limit descriptor) the same way,
// so the guarantees of a request's decisions hold whichever door asked.
func TakeAll(ctx context.Context, takes []Taken, now time.Time, hold HoldFunc) (Outcome, error) {
	denied := false
	for i := range takes {
		t := &takes[i]
		d, err := t.Policy.limiter.Take(ctx, t.Key, t.Limit.Limit, t.Units, now)
		if err != nil {
			refund(ctx, takes[:i], now)
			return Failed, fmt.Errorf("policy %s: %w", t.Policy.Name, err)
		}
		t.Decision, t.OK = d, d.Allowed
		if d.Degraded != quota.NotDegraded {
			t.Policy.degraded[d.Degraded].Inc()
		}
		switch {
		case d.Allowed:
			t.Policy.allowed.Inc()
		case t.Policy.Shadow:
			t.Policy.shadowDenied.Inc()
		default:
			t.Policy.denied.Inc()
			denied = true
		}
	}

	// A request denied by one policy consumes nothing from the others.
	if denied {
		refund(ctx, takes, now)
		if unavailable(takes) {
			return Unavailable, nil
		}
		return OverLimit, nil
	}
	if hold == nil {
		hold = sleepCtx
	}
	if err := holdAllowed(ctx, takes, now, hold); err != nil {
		return Canceled, err
	}
	return OK, nil
}

// refund gives back the units that allowed policies took.
func refund(ctx context.Context, takes []Taken, now time.Time) {
	for i := range takes {
		t := &takes[i]
		if t.OK {
			_ = t.Policy.limiter.Refund(ctx, t.Key, t.Limit.Limit, t.Units, now)
			t.Policy.refunded.Inc()
		}
	}
}
