package engine

import (
	"context"
	"time"
)

// GiveBack returns n of the units a take TakeAll allowed took, for a door
// that takes units ahead of their use and learns that part of them will
// not be spent: Envoy's rate limit quota service (internal/rlqs), when a
// new assignment replaces one whose refill was paid further ahead than
// Envoy can now spend it. Best effort, as TakeAll's refunds are; counted
// under the policy's refunded decisions. Nothing is given back under an
// unlimited limit or for a charge.
func GiveBack(ctx context.Context, t *Taken, n int64, now time.Time) error {
	if n <= 0 || t.Limit.Unlimited || t.Limit.Charges(n) {
		return nil
	}
	t.Policy.refunded.Inc()
	return t.Policy.limiter.Refund(ctx, t.Key, t.Limit.Limit, n, now)
}
