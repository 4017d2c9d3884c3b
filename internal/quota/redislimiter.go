package quota

import (
	"context"
	"time"
)

// Redis keeps every count in Redis: one atomic script call per decision,
// timed by the Redis server's clock, whatever the algorithm. Exact across any number of replicas,
// at the cost of a round trip per decision.
type Redis struct {
	store *Store
}

var _ Limiter = (*Redis)(nil)

// NewRedis returns a limiter whose state lives in store.
func NewRedis(store *Store) *Redis { return &Redis{store: store} }

// Take implements Limiter. now is unused: the script reads Redis TIME.
func (r *Redis) Take(ctx context.Context, key string, l Limit, _ time.Time) (Decision, error) {
	if l.Algorithm != TokenBucket {
		return r.store.decide(ctx, key, l)
	}
	ls, err := r.store.lease(ctx, key, l, 1)
	if err != nil {
		return Decision{}, err
	}
	return Decision{
		Allowed:    ls.granted == 1,
		Limit:      l.Limit,
		Remaining:  ls.remaining,
		RetryAfter: ls.wait,
		ResetAfter: ls.full,
	}, nil
}

// Refund implements Limiter.
func (r *Redis) Refund(ctx context.Context, key string, l Limit, _ time.Time) error {
	if l.Algorithm != TokenBucket {
		return r.store.refund(ctx, key, l)
	}
	return r.store.giveBack(ctx, key, 1)
}
