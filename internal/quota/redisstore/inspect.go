package redisstore

import (
	"context"
	_ "embed"
	"errors"
	"time"

	"github.com/extauthz/extauthz/internal/quota"
)

// The counters API's operations on counts kept in Redis: read a key's
// count without spending it, and reset it. They go through Store.run, so
// they keep the store's timeouts, breaker and metrics, and they run on
// the admin listener, never in a decision.
//
// A reset deletes the partition's keys in Redis. Replicas also hold some
// of a key's state themselves: the level Redis last reported (where a
// fallback starts from), hybrid mode's leased tokens and its cached
// denial, the fallback bucket. The replica that resets forgets its own at
// once, and publishes the key (Resets) so that every other replica forgets
// its own too. Leased tokens are dropped, not returned: they were taken
// from the budget before the reset, and returning them to the new one
// would add to it.

//go:embed scripts/reset.lua
var resetSrc string

var resetScript = newScript("reset", resetSrc)

// partitionKeys lists every Redis key that may hold partition's counts.
func (s *Store) partitionKeys(partition string) []string {
	keys := make([]string, 0, len(keySuffix)+1)
	for _, suffix := range keySuffix {
		keys = append(keys, s.key(partition)+suffix)
	}
	return append(keys, s.calendarKey(partition))
}

// stateKey is the Redis key holding partition's count under l.
func (s *Store) stateKey(partition string, l quota.Limit) string {
	if l.Calendar != nil {
		return s.calendarKey(partition)
	}
	return s.algorithmKey(partition, l.Algorithm)
}

// peek is the decision one unit of partition would get under l now,
// spending nothing: a question to the limit's own script.
func (s *Store) peek(ctx context.Context, partition string, l quota.Limit) (quota.Inspection, error) {
	l.BlockFor = 0 // reading a count denied must not block it; a block set is reported all the same
	d, err := s.decide(ctx, partition, l, 0, 0)
	if err != nil {
		return quota.Inspection{}, err
	}
	return quota.Inspection{Decision: d, Keys: []string{s.stateKey(partition, l)}}, nil
}

// reset deletes every key holding partition's counts.
func (s *Store) reset(ctx context.Context, partition string) error {
	_, err := s.run(ctx, "reset", resetScript, s.partitionKeys(partition))
	return err
}

// Forget drops what the table holds of key: the level Redis last
// reported, and a hybrid slice's tokens and cached denial (dropped, not
// returned: see the note above).
func (t *Table) Forget(key string) {
	sh := t.Lock(key)
	if e, ok := sh.Peek(key); ok {
		e.remote, e.remoteAt = 0, 0
		e.lease.forget()
		e.deniedUntil, e.fullAt, e.count = 0, 0, 0
	}
	sh.Unlock()
}

var (
	_ quota.Inspector = (*Redis)(nil)
	_ quota.Inspector = (*Hybrid)(nil)
	_ quota.Inspector = (*Resilient)(nil)
)

// Inspect implements quota.Inspector.
func (r *Redis) Inspect(ctx context.Context, key string, l quota.Limit, _ time.Time) (quota.Inspection, error) {
	return r.store.peek(ctx, key, l)
}

// Reset implements quota.Inspector.
func (r *Redis) Reset(ctx context.Context, key string) error {
	err := r.store.reset(ctx, key)
	r.table.Forget(key)
	return err
}

// Forget implements quota.Inspector.
func (r *Redis) Forget(key string) { r.table.Forget(key) }

// Inspect implements quota.Inspector: what the Redis bucket holds, and
// the tokens this replica leased from it and has not spent.
func (h *Hybrid) Inspect(ctx context.Context, key string, l quota.Limit, _ time.Time) (quota.Inspection, error) {
	in, err := h.store.peek(ctx, key, l)
	if err != nil || !leases(l) {
		return in, err
	}
	sh := h.table.Lock(key)
	if e, ok := sh.Peek(key); ok {
		in.Leased = e.tokens
	}
	sh.Unlock()
	return in, nil
}

// Reset implements quota.Inspector.
func (h *Hybrid) Reset(ctx context.Context, key string) error {
	err := h.store.reset(ctx, key)
	h.table.Forget(key)
	return err
}

// Forget implements quota.Inspector.
func (h *Hybrid) Forget(key string) { h.table.Forget(key) }

// errNoInspector is returned for a primary limiter the counters API
// cannot read (none of this package's).
var errNoInspector = errors.New("redisstore: this limiter's counts cannot be inspected")

// Inspect implements quota.Inspector. While Redis is unreachable it
// reports the error: the count lives there.
func (r *Resilient) Inspect(ctx context.Context, key string, l quota.Limit, now time.Time) (quota.Inspection, error) {
	in, ok := r.primary.(quota.Inspector)
	if !ok {
		return quota.Inspection{}, errNoInspector
	}
	return in.Inspect(ctx, key, l, now)
}

// Reset implements quota.Inspector: Redis's count, and this replica's
// fallback bucket.
func (r *Resilient) Reset(ctx context.Context, key string) error {
	r.fallback.Forget(key)
	in, ok := r.primary.(quota.Inspector)
	if !ok {
		return errNoInspector
	}
	return in.Reset(ctx, key)
}

// Forget implements quota.Inspector.
func (r *Resilient) Forget(key string) {
	r.fallback.Forget(key)
	if in, ok := r.primary.(quota.Inspector); ok {
		in.Forget(key)
	}
}
