package quota

import (
	"context"
	"errors"
	"time"
)

// Resilient wraps a Redis-backed limiter so that a Redis failure is never
// an error to the caller: each limit follows its OnError. With
// ErrorFallback the key is decided locally, with the limit's own
// algorithm, at limit ÷ peers (a token bucket's burst likewise, at least
// one token; a leaky bucket's queue likewise), peers being the replica
// count last observed through Redis, so the replicas together stay close
// to the limit while each decides alone.
type Resilient struct {
	primary Limiter
	cache   *Cache
	peers   PeerCounter
	// record: keep each token-bucket decision's remaining count in the
	// key's entry, so a fallback starts from this replica's share of it.
	// Hybrid keeps that view itself, at every lease.
	record bool
}

var _ Limiter = (*Resilient)(nil)

// NewResilient returns primary with the fallback behaviour above. The
// fallback buckets live in cache, in the same entries as hybrid slices.
func NewResilient(primary Limiter, cache *Cache, peers PeerCounter) *Resilient {
	_, hybrid := primary.(*Hybrid)
	return &Resilient{primary: primary, cache: cache, peers: peers, record: !hybrid}
}

// Take implements Limiter. It returns an error only when ctx is done.
func (r *Resilient) Take(ctx context.Context, key string, l Limit, now time.Time) (Decision, error) {
	d, err := r.primary.Take(ctx, key, l, now)
	if err == nil {
		if r.record && l.Algorithm == TokenBucket && l.OnError == ErrorFallback {
			// One cache operation beside a Redis round trip: the view of
			// the shared bucket a fallback will start from.
			sh := r.cache.Lock(key)
			e := entryLocked(sh, key)
			e.remote, e.remoteAt = d.Remaining, now.UnixNano()
			sh.Unlock()
		}
		return d, nil
	}
	if ctxErr := ctx.Err(); ctxErr != nil && !errors.Is(err, ErrStoreDown) {
		return Decision{}, ctxErr // the caller gave up; nobody will read a decision
	}
	switch l.OnError {
	case ErrorAllow:
		return Decision{Allowed: true, Limit: l.Limit, Remaining: l.Limit - 1, Degraded: DegradedAllow}, nil
	case ErrorDeny:
		return Decision{Limit: l.Limit, RetryAfter: time.Second, Degraded: DegradedDeny}, nil
	}
	peers := max(r.peers.Count(), 1)
	fl := fallbackLimit(l, peers)
	ns := now.UnixNano()
	sh := r.cache.Lock(key)
	e := entryLocked(sh, key)
	if l.Algorithm == TokenBucket && e.remoteAt != 0 {
		e.capToShareLocked(l, fl, ns, peers)
	}
	d, err = e.takeLocked(fl, ns)
	sh.Unlock()
	if err != nil {
		return Decision{}, err
	}
	d.Limit = l.Limit // clients see the policy, not its share
	d.Degraded = DegradedFallback
	return d, nil
}

// fallbackLimit is this replica's share of l among peers, decided locally with l's
// own algorithm, so a window stays a window and a leaky bucket still
// shapes.
func fallbackLimit(l Limit, peers int64) Limit {
	fl := Limit{
		Algorithm: l.Algorithm,
		Limit:     max(l.Limit/peers, 1),
		Window:    l.Window,
		Queue:     l.Queue,
		MaxDelay:  l.MaxDelay,
	}
	if l.Algorithm == TokenBucket {
		fl.Burst = max(l.Capacity()/peers, 1)
	}
	if l.Queue > 0 {
		fl.Queue = max(l.Queue/peers, 1)
	}
	return fl
}

// capToShareLocked keeps a key's fallback bucket at no more than this
// replica's share of what Redis last said the shared bucket held
// (refilled since at the policy's rate), so a replica that falls back near
// the limit does not start from a full limit ÷ peers. The share refills at
// limit ÷ peers, as the fallback bucket does, so the cap stops mattering
// once the bucket's own spending is the lower bound.
func (e *Entry) capToShareLocked(l, fl Limit, ns, peers int64) {
	if e.alg != fl.Algorithm {
		e.resetLocked(fl.Algorithm)
	}
	iv := fl.Interval()
	if e.iv != iv {
		e.tat, e.iv = tokenBucketRescale(e.tat, ns, e.iv, iv), iv
	}
	remote := min(e.remote+max(ns-e.remoteAt, 0)/l.Interval(), l.Capacity())
	share := min(remote/peers, fl.Capacity())
	e.tat = max(e.tat, ns+(fl.Capacity()-share)*iv)
}

// Refund implements Limiter: to Redis when it answers, else to the local
// fallback bucket.
func (r *Resilient) Refund(ctx context.Context, key string, l Limit, now time.Time) error {
	if err := r.primary.Refund(ctx, key, l, now); err == nil || l.OnError != ErrorFallback {
		return nil
	}
	sh := r.cache.Lock(key)
	if e, ok := sh.Peek(key); ok {
		e.refundLocked(fallbackLimit(l, max(r.peers.Count(), 1)), now.UnixNano())
	}
	sh.Unlock()
	return nil
}
