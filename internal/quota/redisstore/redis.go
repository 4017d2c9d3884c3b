package redisstore

import (
	"context"
	"time"

	"github.com/extauthz/extauthz/internal/quota"
)

// Redis is redis mode: every count in Redis, one atomic script call per
// decision, timed by the Redis server's clock, whatever the algorithm.
// Exact across any number of replicas, at the cost of a round trip per
// decision. For limits that fall back when Redis fails, each decision's
// remaining count is kept in the table: the level a fallback starts from.
type Redis struct {
	store *Store
	table *Table
}

var _ quota.Limiter = (*Redis)(nil)

// NewRedis returns a limiter whose counts live in store, keeping the
// levels Redis reports in table.
func NewRedis(store *Store, table *Table) *Redis { return &Redis{store: store, table: table} }

// Take implements quota.Limiter. The decision is made at Redis TIME; now
// only stamps the level kept for a fallback.
func (r *Redis) Take(ctx context.Context, key string, l quota.Limit, n int64, now time.Time) (quota.Decision, error) {
	if l.OnError == quota.ErrorFallback {
		r.store.wantTurn(l, now.UnixNano())
	}
	var debt int64
	if owesFallback(l) {
		debt = r.table.takeDebt(key)
	}
	d, err := r.store.decideHolding(ctx, key, l, n, debt, holdFrom(ctx))
	if err != nil {
		// Charged again next time: if this call ran after all, the
		// replicas admit less, never more.
		r.table.Owe(key, debt)
		return quota.Decision{}, err
	}
	if l.OnError == quota.ErrorFallback {
		// One table operation beside a Redis round trip.
		r.table.record(key, d.Remaining, r.store.levelAt(now))
	}
	return d, nil
}

// Refund implements quota.Limiter.
func (r *Redis) Refund(ctx context.Context, key string, l quota.Limit, n int64, now time.Time) error {
	return r.store.refund(ctx, key, l, n, now)
}
