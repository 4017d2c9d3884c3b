package check

import (
	"context"
	"time"

	grpcstatus "google.golang.org/grpc/status"
)

// holdFunc waits d, or until ctx is done, and returns ctx's error then.
type holdFunc func(ctx context.Context, d time.Duration) error

// WithHold replaces how an admitted request is held until its leaky bucket
// slot (a timer by default). Tests pass a recorder, so no test sleeps.
func WithHold(hold func(ctx context.Context, d time.Duration) error) Option {
	return func(s *Server) { s.hold = hold }
}

// sleepCtx is the default holdFunc.
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
// policies asked for (leaky bucket shaping: its slot is that far away),
// so the OK reaches Envoy when the request may go on. Shadow policies
// never delay traffic. If the caller gives up first (Envoy's timeout, the
// client leaving), the request never goes on: its units are refunded and
// the error is the context's, as a gRPC status.
func (e *engine) holdAllowed(ctx context.Context, takes []taken, now time.Time) error {
	var d time.Duration
	for i := range takes {
		if t := &takes[i]; !t.p.Shadow {
			d = max(d, t.d.Delay)
		}
	}
	if d <= 0 {
		return nil
	}
	err := e.hold(ctx, d)
	if err == nil {
		return nil
	}
	// ctx is done: refund on a context that is not, so the refunds reach
	// Redis (each call keeps the store's own timeout).
	e.refund(context.WithoutCancel(ctx), takes, now)
	return grpcstatus.FromContextError(err).Err()
}
