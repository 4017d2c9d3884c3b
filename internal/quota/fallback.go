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
// count observed through Redis, so the replicas together stay close to the
// limit while each decides alone.
//
// A fallback never starts from a fresh budget when Redis told this replica
// something about the key: every decision Redis made (and, in hybrid mode,
// every lease) leaves the key's remaining count in its cache entry, and a
// fallback bucket holds at most this replica's share of that count,
// brought forward by what the algorithm restores since. That matters most
// after a call that failed but may have run: a timed-out script may have
// spent units in Redis. For the same reason a key that Redis has never
// reported on starts empty after such a call while Redis is up (it refills
// at the share's rate). A key new to this replica gets a fresh share while
// the store is marked down, or when the call certainly did not run (a
// refused connection, say, to one failed master of a Cluster).
type Resilient struct {
	primary Limiter
	cache   *Cache
	peers   PeerCounter
	breaker verdicter
	// hybrid: the primary keeps token buckets' views itself, at every
	// lease; every other decision's view is recorded here.
	hybrid bool
}

var _ Limiter = (*Resilient)(nil)

// verdicter tells whether a failed call was Redis going down (Store).
type verdicter interface {
	AwaitVerdict(ctx context.Context) (down bool)
}

// NewResilient returns primary with the fallback behaviour above. The
// fallback buckets live in cache, in the same entries as hybrid slices;
// breaker says whether a failed call was an outage.
func NewResilient(primary Limiter, cache *Cache, peers PeerCounter, breaker verdicter) *Resilient {
	_, hybrid := primary.(*Hybrid)
	return &Resilient{primary: primary, cache: cache, peers: peers, breaker: breaker, hybrid: hybrid}
}

// Take implements Limiter. It returns an error only when ctx is done.
func (r *Resilient) Take(ctx context.Context, key string, l Limit, now time.Time) (Decision, error) {
	d, err := r.primary.Take(ctx, key, l, now)
	if err == nil {
		if l.OnError == ErrorFallback && !(r.hybrid && l.Algorithm == TokenBucket) {
			// One cache operation beside a Redis round trip: the view of
			// the shared count a fallback will start from.
			sh := r.cache.Lock(key)
			e := entryLocked(sh, key)
			e.remote, e.remoteAt = d.Remaining, now.UnixNano()
			sh.Unlock()
		}
		return d, nil
	}
	down := errors.Is(err, ErrStoreDown)
	if ctxErr := ctx.Err(); ctxErr != nil && !down {
		return Decision{}, ctxErr // the caller gave up; nobody will read a decision
	}
	ran := !down && mayHaveRun(err)
	if ran && r.breaker.AwaitVerdict(ctx) {
		// The failure was Redis going down: an outage, not a doubt.
		down, ran = true, false
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
	switch {
	case e.remoteAt != 0:
		e.capToShareLocked(l, fl, ns, peers, e.remote, e.remoteAt)
	case ran && !e.hasStateLocked(fl):
		// A call that may have run failed while Redis is up, for a key
		// Redis has not reported on: it may have spent what a fresh
		// share would hand out again. Start from nothing.
		e.capToShareLocked(l, fl, ns, peers, 0, ns)
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

// hasStateLocked reports whether the entry already counts under fl's
// algorithm, so an earlier fallback decision's spending is kept.
func (e *Entry) hasStateLocked(fl Limit) bool {
	if e.alg != fl.Algorithm {
		return false
	}
	switch fl.Algorithm {
	case TokenBucket, LeakyBucket:
		return e.iv != 0
	}
	return e.counts != nil
}

// capToShareLocked lowers the entry's fallback state (counted under fl, this
// replica's share of l) so that it admits at most this replica's share of
// `remote`, the units Redis said remained at remoteAt, brought forward to
// ns by what l's algorithm restores in between. It only ever takes units
// away, so applying it again before each fallback decision is harmless:
// once the fallback's own spending is the lower bound, it changes nothing.
//
//   - token bucket: Redis restores one unit per interval of l, up to the
//     capacity; the share is the restored count ÷ peers;
//   - leaky bucket: likewise, in free slots;
//   - fixed and sliding window: the count is the window's, and says
//     nothing once the window has ended (a sliding window's previous
//     count still weighs then, but how much of it was this key's is
//     unknown); within the window the remaining count only grows as a
//     sliding window's previous count fades, which is not credited;
//   - sliding log: entries leave the log at unknown instants within a
//     window of remoteAt, so the units missing from the share are entered
//     at remoteAt (never earlier than the newest) and leave a window later.
func (e *Entry) capToShareLocked(l, fl Limit, ns, peers, remote, remoteAt int64) {
	if e.alg != fl.Algorithm {
		e.resetLocked(fl.Algorithm)
	}
	switch fl.Algorithm {
	case TokenBucket, LeakyBucket:
		iv := fl.Interval()
		if e.iv != iv {
			e.tat, e.iv = tokenBucketRescale(e.tat, ns, e.iv, iv), iv
		}
		restored := max(ns-remoteAt, 0) / l.Interval()
		if fl.Algorithm == TokenBucket {
			share := min(min(remote+restored, l.Capacity())/peers, fl.Capacity())
			e.tat = max(e.tat, ns+(fl.Capacity()-share)*iv)
			return
		}
		// A leaky bucket admits now while its next slot is within the
		// tolerance: n more fit when tat ≤ ns + tol − (n−1)·iv.
		share := (remote + restored) / peers
		e.tat = max(e.tat, ns+fl.tolerance()-(share-1)*iv)
	case FixedWindow, SlidingWindow:
		if e.counts == nil {
			e.counts = &counts{}
		}
		c := e.counts
		w := int64(fl.Window)
		if c.winLen != w {
			c.win, c.winLen = windowCount{}, w
		}
		c.win = c.win.roll(ns, w)
		if windowStart(remoteAt, w) != c.win.start {
			return // Redis counted a window that has ended
		}
		share := min(remote/peers, fl.Limit)
		if fl.Algorithm == FixedWindow {
			c.win.prev = 0
			c.win.cur = max(c.win.cur, fl.Limit-share)
			return
		}
		if left := slidingRemaining(c.win.prev, c.win.cur, fl.Limit, w, ns-c.win.start); left > share {
			c.win.cur += left - share
		}
	case SlidingLog:
		if e.counts == nil {
			e.counts = &counts{}
		}
		g := &e.counts.log
		w := int64(fl.Window)
		for g.n > 0 && g.at(0) <= ns-w {
			g.dropOldest()
		}
		if remoteAt <= ns-w {
			return // every entry Redis counted then has left the window
		}
		share := min(remote/peers, fl.Limit)
		at := remoteAt
		if g.n > 0 {
			at = max(at, g.at(g.n-1))
		}
		for left := fl.Limit - int64(g.n); left > share; left-- {
			g.push(at, fl.Limit)
		}
	}
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
