package quota

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/extauthz/extauthz/internal/localcache"
)

// Local keeps counts in this process. Each replica counts alone, so N
// replicas together admit up to N times the limit. Memory is bounded by the
// cache: an evicted key starts again from a full bucket.
type Local struct {
	cache *Cache
}

var _ Limiter = (*Local)(nil)

// Cache is the bounded per-key state of this process, shared by the local
// limiter, hybrid slices and fallback buckets: one LRU bound for them all.
type Cache struct {
	*localcache.Cache[*Entry]
	onEvict atomic.Pointer[func(key string, e *Entry)]
}

// NewCache returns a cache of at most maxKeys entries.
func NewCache(maxKeys int) (*Cache, error) {
	c := &Cache{}
	lc, err := localcache.New(maxKeys, func(key string, e *Entry) {
		if fn := c.onEvict.Load(); fn != nil {
			(*fn)(key, e)
		}
	})
	if err != nil {
		return nil, err
	}
	c.Cache = lc
	return c, nil
}

// Entry is the per-key state kept in the cache. Its fields are guarded by
// the lock of the cache shard that holds it.
type Entry struct {
	alg Algorithm
	// Token bucket (local mode, and the fallback bucket of Redis modes);
	// leaky bucket too, where tat is the next free slot.
	tat int64 // unix ns at which the bucket is full
	iv  int64 // the refill interval tat was computed with

	// counts holds the window counters and the sliding log, allocated only
	// for those algorithms so the buckets' entries stay small.
	counts *counts

	slice // hybrid mode's leased tokens
}

// NewLocal returns a limiter that keeps its state in cache.
func NewLocal(cache *Cache) *Local {
	return &Local{cache: cache}
}

// Take implements Limiter.
func (s *Local) Take(_ context.Context, key string, l Limit, now time.Time) (Decision, error) {
	sh := s.cache.Lock(key)
	e, ok := sh.Get(key)
	if !ok || e.alg != l.Algorithm {
		e = &Entry{alg: l.Algorithm}
		sh.Add(key, e)
	}
	d, err := e.takeLocked(l, now.UnixNano())
	sh.Unlock()
	return d, err
}

// Refund implements Limiter.
func (s *Local) Refund(_ context.Context, key string, l Limit, now time.Time) error {
	sh := s.cache.Lock(key)
	if e, ok := sh.Get(key); ok {
		e.refundLocked(l, now.UnixNano())
	}
	sh.Unlock()
	return nil
}
