package engine

import (
	"context"
	"time"
)

// HoldFunc waits d, or until ctx is done, and returns ctx's error then.
type HoldFunc func(ctx context.Context, d time.Duration) error

// sleepCtx is the default HoldFunc.
func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// holdAllowed holds an allowed request for the longest Delay its enforcing
// policies asked for (leaky bucket shaping: its slot is that far away), so
// the answer reaches the proxy when the request may go on. Shadow policies
// never delay traffic. If the caller gives up first (the proxy's timeout,
// the client leaving), the request never goes on: its units are refunded
// and the context's error is returned.
func holdAllowed(ctx context.Context, takes []Taken, now time.Time, hold HoldFunc) error {
	var d time.Duration
	for i := range takes {
		if t := &takes[i]; !t.Policy.Shadow {
			d = max(d, t.Decision.Delay)
		}
	}
	if d <= 0 {
		return nil
	}
	err := hold(ctx, d)
	if err == nil {
		return nil
	}
	// ctx is done: refund on a context that is not, so the refunds reach
	// Redis (each call keeps the store's own timeout).
	refund(context.WithoutCancel(ctx), takes, now)
	return err
}
