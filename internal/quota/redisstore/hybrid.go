package redisstore

import (
	"context"
	"errors"
	"log/slog"
	"math"
	"sync"
	"time"

	"github.com/extauthz/extauthz/internal/quota"
)

// Design note: hybrid mode keeps each bucket in Redis and spends it in
// slices. A replica leases a slice of tokens with one atomic script call
// (bucket_lease.lua, a partial grant when fewer remain) and spends it
// locally with no I/O. Tokens leave Redis before they are spent, so the
// replicas together never admit more than the bucket allows; what they can
// lose is the unspent remainder of slices, which goes back to Redis when a
// slice idles out, when its key is evicted from the cache, and at shutdown.
//
// Slices are sized by demand: enough for the key's local traffic over the
// Horizon (a second by default, the default slice idle time: a slice covers
// what is expected before it would go back), at least one token, at most a quarter of the
// bucket divided by the replica count, and at most half of what Redis last
// said remained, divided by the replica count. A key's first decision on a
// replica has no rate yet: it leases one token, spent at once, an exact
// call that also reports the bucket's level. A key that comes back soon
// leases for its rate. Far from the limit a busy key leases large slices
// and rarely calls Redis; near the limit slices shrink to one token and
// every decision is exact. What a replica can hold unspent is bounded by
// the quarter-bucket share, and goes back after the idle time. A lease
// that finds the bucket empty is cached as "denied until the next token is
// due", answered locally until then. Concurrent misses on one key make one
// Redis call at a time: the first request leases while the others wait
// for it, and the next lease is sized for all of them.
//
// Only the token bucket leases. Fixed and sliding window counts could be
// leased the same way, but a count leased in one window is worthless in
// the next, and a sliding log or a leaky bucket's slots cannot be spent
// out of order; hybrid policies with those algorithms make one exact
// redis-mode script call per decision, so they too never admit more than
// the limit.

// slice is a key's hybrid lease in its Table entry, guarded by the entry's
// shard lock. The entry's level (remote, remoteAt) is what Redis held at
// the last lease.
type slice struct {
	tokens      int64   // leased from Redis, not yet spent
	interval    int64   // ns per token of the limit last leased under
	deniedUntil int64   // unix ns until which the Redis bucket is known empty
	fullAt      int64   // unix ns at which the Redis bucket is full, as of the last lease
	lastUsed    int64   // unix ns of the last decision or refund
	count       int64   // decisions since the last lease
	rate        float64 // smoothed decisions per second on this replica
	flight      *flight // the lease in progress, if any
	waiting     int64   // requests waiting for a lease of this key
	holding     bool    // registered with Hybrid.holders
	evicted     bool    // pushed out of the cache
}

// flight is one lease call in progress; waiters block on done.
type flight struct {
	done chan struct{}
	err  error
}

// DefaultHorizon is how much of a key's traffic a slice covers by default.
const DefaultHorizon = time.Second

// PeerCounter reports how many replicas share the store.
type PeerCounter interface{ Count() int64 }

// HybridOptions configures a Hybrid limiter.
type HybridOptions struct {
	// SliceIdle: unspent tokens go back to Redis after this long unused.
	SliceIdle time.Duration
	// Horizon is how much of a key's traffic one slice should cover
	// (default DefaultHorizon).
	Horizon time.Duration
	Metrics *Metrics // nil: the store's
	Log     *slog.Logger
	// Now is the idle sweeper's clock (time.Now by default); decisions use
	// the now they are given.
	Now func() time.Time
}

// Hybrid spends local slices of Redis buckets. See the design note above.
type Hybrid struct {
	table *Table
	store *Store
	peers PeerCounter
	opts  HybridOptions

	holdersMu sync.Mutex
	holders   map[string]*keyState // keys whose entries hold tokens

	returns  chan giveback // tokens to give back, from evictions and refunds
	stop     chan struct{}
	stopOnce sync.Once
	wg       sync.WaitGroup
}

type giveback struct {
	key    string
	n      int64
	reason string
}

var _ quota.Limiter = (*Hybrid)(nil)

// NewHybrid returns a hybrid limiter keeping slices in table and buckets
// in store, and starts its background returns. Close stops it.
func NewHybrid(table *Table, store *Store, peers PeerCounter, opts HybridOptions) *Hybrid {
	if opts.SliceIdle <= 0 {
		opts.SliceIdle = time.Second
	}
	if opts.Horizon <= 0 {
		opts.Horizon = DefaultHorizon
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.Log == nil {
		opts.Log = slog.Default()
	}
	if opts.Metrics == nil {
		opts.Metrics = store.opts.Metrics
	}
	h := &Hybrid{
		table:   table,
		store:   store,
		peers:   peers,
		opts:    opts,
		holders: map[string]*keyState{},
		returns: make(chan giveback, 4096),
		stop:    make(chan struct{}),
	}
	evicted := h.evicted
	table.onEvict.Store(&evicted)
	h.wg.Add(2)
	go h.returnLoop()
	go h.sweepLoop()
	return h
}

// Take implements Limiter. Only token buckets lease slices; every other
// algorithm is decided by its exact redis-mode script.
func (h *Hybrid) Take(ctx context.Context, key string, l quota.Limit, n int64, now time.Time) (quota.Decision, error) {
	if l.Algorithm != quota.TokenBucket {
		d, err := h.store.decide(ctx, key, l, n)
		if err == nil && l.OnError == quota.ErrorFallback {
			h.table.record(key, d.Remaining, now)
		}
		return d, err
	}
	need := max(n, 1) // a question (n = 0) needs one token in the slice, and spends none
	ns := now.UnixNano()
	sh := h.table.Lock(key)
	e := stateLocked(sh, key)
	e.count += n
	e.lastUsed = ns
	for {
		if e.tokens >= need {
			e.tokens -= n
			d := h.allowLocked(e, l, ns)
			sh.Unlock()
			return d, nil
		}
		if e.deniedUntil > ns {
			d := quota.Decision{Limit: l.Limit, RetryAfter: time.Duration(e.deniedUntil - ns), ResetAfter: time.Duration(max(e.fullAt-ns, 0))}
			sh.Unlock()
			return d, nil
		}
		if f := e.flight; f != nil {
			// Another request is leasing this key: wait for its slice.
			// While waiting we count as demand, so whoever leases next
			// asks for enough for every waiter, not one token each.
			e.waiting += need
			sh.Unlock()
			h.opts.Metrics.LeaseWaits.Inc()
			var err error
			select {
			case <-f.done:
				err = f.err
			case <-ctx.Done():
				err = ctx.Err()
			}
			sh = h.table.Lock(key)
			e.waiting -= need
			if errors.Is(err, context.Canceled) && ctx.Err() == nil {
				// The leasing request's caller went away, not ours: lease
				// ourselves rather than fall back for a reason not our own.
				e = stateLocked(sh, key)
				continue
			}
			if err != nil {
				sh.Unlock()
				return quota.Decision{}, err
			}
			e = stateLocked(sh, key)
			continue
		}

		// The slice holds fewer tokens than this request needs: lease
		// the rest, all or none, and a slice for what comes next.
		missing := need - e.tokens
		want := max(h.sliceSizeLocked(e, l, ns), missing)
		f := &flight{done: make(chan struct{})}
		e.flight = f
		debt := e.debt // fallback admissions, charged with this lease
		e.debt = 0
		sh.Unlock()

		ls, err := h.store.lease(ctx, key, l, want, missing, debt)

		sh = h.table.Lock(key)
		e.flight = nil
		f.err = err
		close(f.done)
		if err != nil {
			e.debt += debt
			sh.Unlock()
			return quota.Decision{}, err
		}
		if ls.granted > 0 {
			h.opts.Metrics.SlicesLeased.Inc()
			h.opts.Metrics.TokensLeased.Add(float64(ls.granted))
		}
		if e.evicted {
			// The key left the cache while we were away: its entry is
			// gone, so hand the tokens back and carry on with a new one.
			h.enqueue(key, ls.granted, "evicted")
			e = stateLocked(sh, key)
			continue
		}
		e.remote, e.remoteAt = ls.remaining, ns
		e.fullAt = ns + int64(ls.full)
		e.count = 0
		if ls.granted == 0 {
			if missing > 1 {
				// Redis lacks this request's tokens, not necessarily one:
				// deny this request alone, and cache nothing.
				d := quota.Decision{Limit: l.Limit, Remaining: e.tokens + ls.remaining, RetryAfter: max(ls.wait, time.Microsecond), ResetAfter: time.Duration(max(e.fullAt-ns, 0))}
				sh.Unlock()
				return d, nil
			}
			e.deniedUntil = ns + int64(max(ls.wait, time.Microsecond))
			continue
		}
		e.tokens += ls.granted
		e.interval = l.Interval()
		h.holdLocked(key, e)
	}
}

// allowLocked is the decision for a token just spent from the slice. The
// remaining count is an estimate: this slice plus what Redis held at the
// last lease and has refilled since; other replicas' slices are not seen.
func (h *Hybrid) allowLocked(e *keyState, l quota.Limit, ns int64) quota.Decision {
	capacity := l.Capacity()
	remote := e.remote + (ns-e.remoteAt)/l.Interval()
	return quota.Decision{
		Allowed:    true,
		Limit:      l.Limit,
		Remaining:  min(e.tokens+remote, capacity-1),
		ResetAfter: time.Duration(max(e.fullAt-ns, 0)),
	}
}

// sliceSizeLocked decides how many tokens to lease for e (see the design
// note) and updates its rate estimate.
func (h *Hybrid) sliceSizeLocked(e *keyState, l quota.Limit, ns int64) int64 {
	if e.remoteAt != 0 {
		// Requests at one instant are a burst: count them over a
		// millisecond rather than not at all.
		inst := float64(e.count) / (float64(max(ns-e.remoteAt, int64(time.Millisecond))) / 1e9)
		if e.rate == 0 {
			e.rate = inst
		} else {
			e.rate = 0.5*e.rate + 0.5*inst
		}
	}
	capacity := l.Capacity()
	peers := max(h.peers.Count(), 1)
	want := int64(math.Ceil(e.rate * h.opts.Horizon.Seconds()))
	// Tokens that Redis refills within the idle time cost nobody anything
	// if they go unspent: lease at least those, so a key that comes back
	// within the idle time finds them here, and let them expire unspent
	// rather than spend a call giving them back (Sweep).
	free := int64(h.opts.SliceIdle) / l.Interval()
	want = max(want, free, e.waiting+1, 1)
	byShare := maxSlice(capacity, peers)
	remote := capacity
	if e.remoteAt != 0 {
		remote = min(e.remote+(ns-e.remoteAt)/l.Interval(), capacity)
	}
	byRemote := max(remote/(2*peers), 1)
	return min(want, byShare, byRemote)
}

// maxSlice is the most tokens one lease takes of a bucket of capacity
// shared by peers replicas: a quarter of the bucket over the replica count.
func maxSlice(capacity, peers int64) int64 { return max(capacity/(4*peers), 1) }

// Refund implements quota.Limiter: the units go back into the local
// slice, to be spent or given back later (other algorithms: to Redis at
// once).
func (h *Hybrid) Refund(ctx context.Context, key string, l quota.Limit, n int64, _ time.Time) error {
	if l.Algorithm != quota.TokenBucket {
		return h.store.refund(ctx, key, l, n)
	}
	sh := h.table.Lock(key)
	if e, ok := sh.Peek(key); ok && !e.evicted {
		e.tokens += n
		h.holdLocked(key, e)
		sh.Unlock()
		return nil
	}
	sh.Unlock()
	h.enqueue(key, n, "refund")
	return nil
}

// holdLocked registers e as holding tokens, for the idle sweeper.
func (h *Hybrid) holdLocked(key string, e *keyState) {
	if e.holding {
		return
	}
	e.holding = true
	h.holdersMu.Lock()
	h.holders[key] = e
	h.holdersMu.Unlock()
}

// evicted is the cache's eviction callback, called with the shard locked.
func (h *Hybrid) evicted(key string, e *keyState) {
	e.evicted = true
	if e.tokens > 0 {
		h.enqueue(key, e.tokens, "evicted")
		e.tokens = 0
	}
}

// enqueue hands tokens to the background returner. It never blocks: when
// the queue is full the tokens are dropped, which only under-uses the
// bucket until it refills.
func (h *Hybrid) enqueue(key string, n int64, reason string) {
	if n <= 0 {
		return
	}
	select {
	case h.returns <- giveback{key: key, n: n, reason: reason}:
	default:
	}
}

func (h *Hybrid) returnLoop() {
	defer h.wg.Done()
	for {
		select {
		case <-h.stop:
			return
		case g := <-h.returns:
			h.giveBack(context.Background(), g)
		}
	}
}

func (h *Hybrid) giveBack(ctx context.Context, g giveback) {
	if err := h.store.giveBack(ctx, g.key, g.n); err != nil {
		return // the bucket refills by itself; a lost return only under-uses it
	}
	h.opts.Metrics.TokensReturned.WithLabelValues(g.reason).Add(float64(g.n))
}

// sweepLoop gives back the tokens of slices unused for SliceIdle.
func (h *Hybrid) sweepLoop() {
	defer h.wg.Done()
	t := time.NewTicker(max(h.opts.SliceIdle/4, 10*time.Millisecond))
	defer t.Stop()
	for {
		select {
		case <-h.stop:
			return
		case <-t.C:
			h.Sweep(h.opts.Now(), h.opts.SliceIdle, "idle")
		}
	}
}

// Sweep gives back the tokens of every slice unused for at least idle as of
// now, but for the idle sweep's small remainders that Redis refills within
// the idle time anyway, which are left to expire. Close calls it with idle
// 0 to return everything.
func (h *Hybrid) Sweep(now time.Time, idle time.Duration, reason string) {
	ns := now.UnixNano()
	h.holdersMu.Lock()
	keys := make([]string, 0, len(h.holders))
	for k := range h.holders {
		keys = append(keys, k)
	}
	h.holdersMu.Unlock()
	for _, key := range keys {
		var n int64
		sh := h.table.Lock(key)
		h.holdersMu.Lock()
		e := h.holders[key]
		cur, ok := sh.Peek(key)
		switch {
		case e == nil:
		case !ok || cur != e || e.tokens == 0:
			delete(h.holders, key)
			e.holding = false
		case ns-e.lastUsed >= int64(idle):
			n, e.tokens = e.tokens, 0
			delete(h.holders, key)
			e.holding = false
			if reason == "idle" && n*e.interval <= int64(idle) {
				// Redis refills these within the idle time by itself: a
				// call to give them back would buy nothing.
				h.opts.Metrics.TokensReturned.WithLabelValues("expired").Add(float64(n))
				n = 0
			}
		}
		h.holdersMu.Unlock()
		sh.Unlock()
		if n > 0 {
			h.giveBack(context.Background(), giveback{key: key, n: n, reason: reason})
		}
	}
}

// Close stops the background work and gives every unspent token back to
// Redis, within ctx.
func (h *Hybrid) Close(ctx context.Context) {
	h.stopOnce.Do(func() { close(h.stop) })
	h.wg.Wait()
	for {
		select {
		case g := <-h.returns:
			h.giveBack(ctx, g)
			continue
		default:
		}
		break
	}
	h.Sweep(time.Now(), 0, "shutdown")
}
