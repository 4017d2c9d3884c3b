package redisstore

import (
	"context"
	"errors"
	"log/slog"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/extauthz/extauthz/internal/quota"
)

// Design note: hybrid mode keeps each count in Redis and spends it in
// leases. A replica leases a slice of a key's tokens with one atomic
// script call (a partial grant when fewer remain) and spends it locally
// with no I/O until the slice runs out or the lease ends; the next lease
// call retires the previous one, giving back what was not spent.
//
// Leases live for LeaseTTL (60s by default), long enough for a key that
// comes back to a replica every few seconds to find tokens waiting. That
// is safe because Redis counts what is out: bucket_state.lua keeps the
// tokens of unexpired leases by expiry (a handful of fields per key, not
// one per replica) and never refills the bucket's level above capacity
// less what is out, so the replicas together admit at most one bucket's
// burst + rate × T in any interval T, whatever the lease life (the proof
// is in bucket_state.lua). A replica stops spending a lease at the
// instant it asked for it plus its life, on its own monotonic clock, so
// it stops before Redis stops counting the lease. A replica that dies
// strands its leases' unspent tokens until they end: under-use, bounded
// by a slice per key, never over-admission.
//
// The fixed and sliding windows lease too: a lease is a count taken in
// the current window, and it dies with the window (its life is what is
// left of the window, as Redis reports it), so it is never spent in the
// next; within a window a sliding window's estimate of the counts already
// taken only falls. The sliding log and the leaky bucket make one exact
// call per decision: a log's entries and a leaky bucket's slots are
// instants, which a replica cannot spend later than Redis recorded them.
// Calendar windows too: their bounds follow a time zone that only the
// replica computes. So do charge: always limits (token budgets): see
// Hybrid.budget.
//
// Slices are sized from what the lease may be spent on: this replica's
// share of what the limit refills over a lease's life (limit rate × life
// ÷ replicas), or its own demand over that life when higher, at most a
// quarter of the bucket divided by the replica count, and, in the script,
// at most half of what Redis holds available divided by the replica
// count, but never less than the request's cost. A key's first lease on a
// replica is thus sized from the bucket's level, the replicas and the
// lease life; far from the limit a key leases large slices and rarely
// calls Redis; near the limit slices shrink to the request's cost and
// every decision is exact. A lease call that finds too little is answered
// as a denial, cached as "denied until the tokens are due" when one token
// was missing. Concurrent misses on one key make one Redis call at a
// time: the first request leases while the others wait for it, and the
// next lease is sized for all of them.
//
// A penalty box (quota.Limit.BlockFor) lives in Redis, beside the count:
// the lease call that finds too little sets it, and no lease is granted
// while it lasts, its end being the wait a replica caches as its denial.
// Leases granted before it are not recalled: a replica may spend what it
// held when the block began, units counted against the limit when they
// were leased, so the block never lets the replicas admit past the limit
// (a slice per replica at most; about a request each when every replica
// spent up to the limit).
//
// What a replica holds unspent goes back to Redis when it retires the
// lease with its next one, when the key is evicted, at shutdown, and
// after SliceIdle unused when the bucket was last seen below half full
// (others may be short of those tokens); far from the limit an idle
// lease is left to end, costing no call.
//
// When Redis forgets (a restart without persistence, a flush, a key
// evicted, a failover to a replica that missed the last writes, an older
// RDB), the leases it granted are no longer counted there: spent on top
// of the buckets it starts again, and given back, they would admit past
// one bucket. Two things tell a replica. Per key, at the key's next call:
// a bucket lease carries its key's incarnation and generation
// (bucket_state.lua), and the call that retires it finds whether Redis
// still holds the grant; if not, nothing is given back and what the
// replica spent of the lease is charged instead, as the fallback's
// admissions are (Redis never counted those units). For the whole store,
// within a heartbeat: Peers reads the epoch key and run_id every second
// and as a master comes back (before decisions reach it); on a change
// every lease held stops (Forgot): its unspent tokens are parked, never
// spent, and the key's next call retires it, given back if the new
// state holds the grant (a failover that kept it), else charged what was
// spent of it since the last heartbeat that found the state unchanged
// (units spent before were counted in the state Redis lost, as redis
// mode's were). Cached denials, made against the lost state, are dropped.

// slice is a key's hybrid lease in its Table entry, guarded by the entry's
// shard lock. The entry's level (remote, remoteAt) is what Redis held at
// the last lease.
type slice struct {
	tokens int64 // leased from Redis, not yet spent
	// lapsed are the unspent units of a window lease that has ended: the
	// window's count in Redis still holds them (a window lease does not
	// expire there as a bucket's does) until the next lease call of the
	// key gives them back, which lifts them off the window's weight on
	// the next one.
	lapsed      int64
	granted     int64     // the lease's size, retired with it (0: no lease held)
	leaseID     int64     // the lease's name in Redis: a bucket's expiry (ms), a window's start (µs)
	until       time.Time // this replica spends the lease until then
	window      time.Duration
	capacity    int64           // of the limit leased under
	algorithm   quota.Algorithm // of the lease held
	deniedUntil int64           // unix ns until which the Redis count is known spent
	fullAt      int64           // unix ns at which the Redis bucket is full, as of the last lease
	lastUsed    int64           // unix ns of the last decision or refund
	count       int64           // decisions since the last lease
	rate        float64         // smoothed decisions per second on this replica
	flight      *flight         // the lease in progress, if any
	waiting     int64           // requests waiting for a lease of this key
	holding     bool            // registered with Hybrid.holders
	evicted     bool            // pushed out of the cache

	// What settles a bucket lease Redis may have forgotten (see the design
	// note): the key state it was granted under (k, g), and, once a
	// heartbeat found Redis changed (stopped), its unspent tokens, never
	// spent again (parked), and what to charge if Redis no longer holds
	// it (owed: spent since the last heartbeat that found Redis unchanged).
	k, g    int64
	stopped bool
	parked  int64
	owed    int64
	// The lease's unspent tokens when the key was first touched after
	// heartbeat confirmSeq confirmed the state (or when it was granted).
	atConfirm, confirmSeq int64
	era                   int64 // Hybrid.era when the key was last touched: a new one drops the cached denial
}

// retiringLocked is what retires e's lease: for a bucket's lease still
// live at ns, with the key state it was granted under and what to charge
// if Redis no longer holds it (everything spent of it, or, once stopped,
// what was spent since the last confirmed heartbeat; the script takes the
// latter when the epoch changed too: held.owedSince).
func (h *Hybrid) retiringLocked(e *keyState, ns int64) held {
	r := held{id: e.leaseID, granted: e.granted, unspent: e.tokens + e.lapsed}
	if e.granted > 0 {
		r.unspent += e.parked
	}
	if e.algorithm == quota.TokenBucket && e.granted > 0 && e.k > 0 && ns < e.until.UnixNano() {
		r.k, r.g = e.k, e.g
		r.owed = max(e.granted-e.tokens-e.parked, 0)
		if e.confirmSeq == h.confirms.Load() { // touched since the last confirmation
			r.owedSince = min(max(e.atConfirm-e.tokens, 0), r.owed)
		}
		if e.stopped {
			r.owed, r.owedSince = e.owed, e.owed
		}
		if p := h.epoch.Load(); p != nil {
			r.epoch = *p
		}
	}
	return r
}

// dropLeaseLocked forgets e's lease on the replica (retired, or handed
// to be).
func (e *keyState) dropLeaseLocked() {
	e.tokens, e.granted, e.leaseID, e.lapsed = 0, 0, 0, 0
	e.k, e.g, e.stopped, e.parked, e.owed = 0, 0, false, 0, 0
}

// flight is one lease call in progress; waiters block on done.
type flight struct {
	done chan struct{}
	err  error
}

// DefaultLeaseTTL is how long a lease may be spent when HybridOptions
// leaves it zero (config.DefaultLeaseTTL).
const DefaultLeaseTTL = 60 * time.Second

// leaseMargin is taken off a lease's life on the replica: Redis counts
// the lease until its expiry rounded up to the grain, and the replica
// stops a little before the life measured from its send, so clocks that
// run apart by up to a percent never let a replica spend a lease Redis no
// longer counts.
const leaseMargin = 100 // 1/100 of the life

// PeerCounter reports how many replicas share the store.
type PeerCounter interface{ Count() int64 }

// HybridOptions configures a Hybrid limiter.
type HybridOptions struct {
	// SliceIdle: an idle slice's unspent tokens go back to Redis after
	// this long unused, when the bucket was short of them.
	SliceIdle time.Duration
	// LeaseTTL is how long a lease may be spent (DefaultLeaseTTL).
	LeaseTTL time.Duration
	Metrics  *Metrics // nil: the store's
	Log      *slog.Logger
	// Now is the idle sweeper's clock (time.Now by default); decisions use
	// the now they are given.
	Now func() time.Time
}

// Hybrid spends local slices of Redis counts. See the design note above.
type Hybrid struct {
	table *Table
	store *Store
	peers PeerCounter
	opts  HybridOptions

	holdersMu sync.Mutex
	holders   map[string]*keyState // keys whose entries hold tokens

	returns chan giveback // leases to give back, from evictions and refunds
	// confirms counts the heartbeats that found the Redis state unchanged
	// (Confirmed); era the changes found (Forgot).
	confirms atomic.Int64
	epoch    atomic.Pointer[string] // the epoch the last confirmation found
	era      atomic.Int64
	// exactUntil (unix ns): until then every lease call asks for the
	// request's cost only, as redis mode does (forgetExact).
	exactUntil atomic.Int64
	stop       chan struct{}
	stopOnce   sync.Once
	wg         sync.WaitGroup
}

// giveback is a lease (or plain tokens, lease.id 0) to return to Redis.
type giveback struct {
	key       string
	algorithm quota.Algorithm
	window    time.Duration
	lease     held
	reason    GiveBackReason
}

var _ quota.Limiter = (*Hybrid)(nil)

// NewHybrid returns a hybrid limiter keeping slices in table and counts
// in store, and starts its background returns. Close stops it.
func NewHybrid(table *Table, store *Store, peers PeerCounter, opts HybridOptions) *Hybrid {
	if opts.SliceIdle <= 0 {
		opts.SliceIdle = time.Second
	}
	if opts.LeaseTTL <= 0 {
		opts.LeaseTTL = DefaultLeaseTTL
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

// leases reports whether hybrid mode leases l's counts (see the design
// note); every other limit is decided by its exact redis-mode script.
func leases(l quota.Limit) bool {
	switch l.Algorithm {
	case quota.TokenBucket:
		return true
	case quota.FixedWindow, quota.SlidingWindow:
		return l.Calendar == nil
	}
	return false
}

// Take implements Limiter.
func (h *Hybrid) Take(ctx context.Context, key string, l quota.Limit, n int64, now time.Time) (quota.Decision, error) {
	if l.Overdraft {
		return h.budget(ctx, key, l, n, now)
	}
	if !leases(l) {
		d, err := h.store.decide(ctx, key, l, n, 0) // no lease: no fallback debt kept either
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
	asked := false // this request has had Redis's answer
	for {
		resized := h.endLeaseLocked(key, e, l, now)
		if e.tokens >= need && !resized {
			e.tokens -= n
			d := h.allowLocked(e, l, ns)
			sh.Unlock()
			return d, nil
		}
		// A cached denial is checked against the clock again: a request
		// whose now was read before its process stalled (a CPU-throttled
		// container) must not be denied for a token that has come due
		// meanwhile; Redis decides that, as it would in redis mode. A
		// request that just had Redis's denial takes it.
		if e.deniedUntil > ns && (asked || e.deniedUntil > h.opts.Now().UnixNano()) {
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

		// The slice holds fewer tokens than this request needs: retire
		// it, giving back what is left, and lease this request's tokens
		// and a slice for what comes next, all in one call. Nobody spends
		// the old slice meanwhile; if the call fails, what it held is
		// lost to this replica until the lease ends in Redis: under-use.
		want := max(h.sliceSizeLocked(e, l, ns), need)
		if ns < h.exactUntil.Load() {
			want = need // Redis just forgot: exact until the others' debts land (forgetExact)
		}
		old := h.retiringLocked(e, ns)
		e.dropLeaseLocked()
		f := &flight{done: make(chan struct{})}
		e.flight = f
		var debt int64
		if owesFallback(l) {
			debt, e.debt = e.debt, 0 // fallback admissions, charged with this lease
		}
		peers := max(h.peers.Count(), 1)
		sh.Unlock()

		ls, err := h.lease(ctx, key, l, want, need, n, debt, peers, old)

		sh = h.table.Lock(key)
		e.flight = nil
		f.err = err
		close(f.done)
		asked = true
		if err != nil {
			e.debt += debt
			sh.Unlock()
			return quota.Decision{}, err
		}
		if ls.forgot {
			h.forgotten()
		} else if old.unspent > 0 {
			h.opts.Metrics.TokensReturned.WithLabelValues(string(ReturnRenewed)).Add(float64(old.unspent))
		}
		if ls.granted > 0 {
			h.opts.Metrics.SlicesLeased.Inc()
			h.opts.Metrics.TokensLeased.Add(float64(ls.granted))
		}
		if e.evicted {
			// The key left the cache while we were away: its entry is
			// gone, so hand the lease back and carry on with a new one.
			// Redis counts all but the n this request was to spend as
			// out; all of it goes back, as nothing was spent.
			h.enqueue(giveback{key: key, algorithm: l.Algorithm, window: l.Window, lease: held{id: ls.id, granted: ls.granted - n, unspent: ls.granted}, reason: ReturnEvicted})
			e = stateLocked(sh, key)
			continue
		}
		e.remote, e.remoteAt = ls.remaining, ns
		e.fullAt = ns + int64(ls.full)
		e.count = 0
		if ls.granted == 0 {
			if need > 1 {
				// Redis lacks this request's tokens, not necessarily one:
				// deny this request alone, and cache nothing.
				d := quota.Decision{Limit: l.Limit, Remaining: ls.remaining, RetryAfter: max(ls.wait, time.Microsecond), ResetAfter: time.Duration(max(e.fullAt-ns, 0))}
				sh.Unlock()
				return d, nil
			}
			e.deniedUntil = ns + int64(max(ls.wait, time.Microsecond))
			e.capacity = capacityOf(l) // the denial's, for endLeaseLocked
			continue
		}
		// The request in hand spends n of the grant at once (the loop goes
		// round with the lock held); the rest is the lease held.
		e.tokens, e.granted, e.leaseID = ls.granted, ls.granted-n, ls.id
		e.k, e.g, e.atConfirm, e.confirmSeq = ls.k, ls.g, ls.granted-n, h.confirms.Load()
		e.until = now.Add(ls.life - ls.life/leaseMargin)
		e.algorithm, e.window, e.capacity = l.Algorithm, l.Window, capacityOf(l)
		if ls.unreplicated && ls.granted > need {
			// Fewer replicas than redis.wait_replicas hold the lease: a
			// failover now would lose it. The request in hand takes what
			// it needs, as in redis mode; the rest is parked, as a stopped
			// lease's is, given back with the key's next call if Redis
			// still holds it, and nothing charged if not.
			h.opts.Metrics.LeasesUnreplicated.Inc()
			e.parked, e.tokens, e.owed, e.stopped = ls.granted-need, need, 0, true
		}
		if e.granted > 0 {
			h.holdLocked(key, e)
		}
	}
}

// budget decides a take of key under l, a charge: always limit, as redis
// mode does: one exact call, a question (n = 0) admitted while the count
// in Redis has a unit left, a charge (n > 0) counted in full whatever is
// left. Nothing is leased. A lease answering questions would keep
// admitting after other replicas' charges spent the budget in Redis
// (those charges are facts, never refused, so Redis cannot hold them back
// for the lease), until its holder's next charge or the lease's end: a
// minute of admissions at the shipped lease_ttl. A budget's Checks are
// the requests that cost most (a model's answer, an export), seconds
// long, so a round trip per question costs them little; and its charges
// were already one call each (a charge of hundreds of units outgrows a
// slice). Hybrid mode thus admits exactly what redis mode admits for such
// a policy: no Check once the budget is spent, and none denied while a
// unit is left.
//
// A lease held from before a reload turned charge: always on is given
// back, unspent tokens and all; the charges a fallback counted while
// Redis was unreachable (owesFallback) are charged with the call, as in
// redis mode.
func (h *Hybrid) budget(ctx context.Context, key string, l quota.Limit, n int64, now time.Time) (quota.Decision, error) {
	sh := h.table.Lock(key)
	e := stateLocked(sh, key)
	e.lastUsed = now.UnixNano()
	if e.flight == nil && (e.granted > 0 || e.tokens > 0 || e.lapsed > 0) {
		h.enqueue(h.heldBack(key, e, now.UnixNano(), ReturnReload))
		e.dropLeaseLocked()
	}
	var debt int64
	if owesFallback(l) {
		debt, e.debt = e.debt, 0
	}
	sh.Unlock()
	d, err := h.store.decide(ctx, key, l, n, debt)
	if err != nil {
		// Charged again next time: if this call ran after all, the
		// replicas admit less, never more.
		h.table.Owe(key, debt)
		return quota.Decision{}, err
	}
	if l.OnError == quota.ErrorFallback {
		h.table.record(key, d.Remaining, now)
	}
	return d, nil
}

// heldBack is the give-back of the lease e holds for key as of ns,
// unspent tokens and all.
func (h *Hybrid) heldBack(key string, e *keyState, ns int64, reason GiveBackReason) giveback {
	return giveback{key: key, algorithm: e.algorithm, window: e.window, lease: h.retiringLocked(e, ns), reason: reason}
}

// leased is one lease call's outcome, for any algorithm that leases.
type leased struct {
	granted, remaining, id int64
	wait, full, life       time.Duration
	k, g                   int64 // a bucket lease's key state
	forgot                 bool  // the lease retired was one Redis had forgotten
	unreplicated           bool  // fewer replicas than asked hold it (StoreOptions.WaitReplicas)
}

// lease asks Redis for between need and want units of key under l, of
// which the request in hand spends spent at once, retiring old, with the
// script of l's algorithm.
func (h *Hybrid) lease(ctx context.Context, key string, l quota.Limit, want, need, spent, debt, peers int64, old held) (leased, error) {
	if l.Algorithm == quota.TokenBucket {
		ls, err := h.store.lease(ctx, key, l, leaseAsk{want: want, need: need, debt: debt, life: h.opts.LeaseTTL, peers: peers, spent: spent, retire: old})
		return leased{granted: ls.granted, remaining: ls.remaining, id: ls.id, wait: ls.wait, full: ls.full, life: h.opts.LeaseTTL, k: ls.k, g: ls.g, forgot: ls.forgot, unreplicated: ls.unreplicated}, err
	}
	w, err := h.store.leaseWindow(ctx, key, l, want, need, peers, old, holdFrom(ctx))
	return leased{granted: w.granted, remaining: w.Remaining, id: w.id, wait: w.RetryAfter, full: w.ResetAfter, life: min(w.left, h.opts.LeaseTTL)}, err
}

// endLeaseLocked drops e's lease when it has ended, or when it was taken
// under another algorithm (a reload), handing the latter back. It reports
// whether the lease was taken under another capacity (a reload, or a
// limit read from each request that changed): the lease must then not be
// spent (one sized from a larger bucket would admit past a smaller one)
// but retired, unspent tokens and all, by the next lease call. A denial
// cached under another capacity is dropped, so a key whose limit was
// raised asks Redis again at once.
func (h *Hybrid) endLeaseLocked(key string, e *keyState, l quota.Limit, now time.Time) (resized bool) {
	h.touchLocked(e)
	resized = e.capacity != capacityOf(l)
	if resized {
		e.deniedUntil = 0
	}
	if e.granted == 0 {
		return false
	}
	if e.algorithm != l.Algorithm {
		h.enqueue(h.heldBack(key, e, now.UnixNano(), ReturnReload))
		e.dropLeaseLocked()
		return false
	}
	if !now.Before(e.until) {
		h.expireLocked(e)
	}
	return resized
}

// expireLocked drops an ended lease: a bucket's unspent tokens stop
// counting in Redis by themselves; a window's stay in its count, lapsed,
// to be given back. The lease stays named (granted, leaseID) so the next
// lease call retires it from what Redis counts as out, if Redis still
// counts it.
func (h *Hybrid) expireLocked(e *keyState) {
	e.parked = 0 // stopped, and no longer counted: nothing to give back
	if e.tokens > 0 {
		h.opts.Metrics.TokensReturned.WithLabelValues(string(ReturnExpired)).Add(float64(e.tokens))
		if e.algorithm != quota.TokenBucket {
			e.lapsed += e.tokens
		}
		e.tokens = 0
	}
}

// capacityOf is the most l's count can hold: a token bucket's burst, a
// window's limit.
func capacityOf(l quota.Limit) int64 {
	if l.Algorithm == quota.TokenBucket {
		return l.Capacity()
	}
	return l.Limit
}

// allowLocked is the decision for a unit just spent from the slice. The
// remaining count is an estimate: this slice plus what Redis held at the
// last lease (a bucket: and has refilled since); other replicas' slices
// are not seen.
func (h *Hybrid) allowLocked(e *keyState, l quota.Limit, ns int64) quota.Decision {
	capacity := capacityOf(l)
	remote := e.remote
	if l.Algorithm == quota.TokenBucket {
		remote += (ns - e.remoteAt) / l.Interval()
	}
	return quota.Decision{
		Allowed:    true,
		Limit:      l.Limit,
		Remaining:  max(min(e.tokens+remote, capacity-1), 0),
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
	peers := max(h.peers.Count(), 1)
	life := h.opts.LeaseTTL
	if l.Algorithm != quota.TokenBucket {
		life = min(life, l.Window)
	}
	demand := int64(math.Ceil(e.rate * life.Seconds()))
	share := int64(math.Ceil(float64(l.Limit) * float64(life) / float64(l.Window) / float64(peers)))
	want := max(demand, share, e.waiting+1, 1)
	return min(want, maxSlice(capacityOf(l), peers))
}

// maxSlice is the most tokens one lease takes of a bucket of capacity
// shared by peers replicas: a quarter of the bucket over the replica count.
func maxSlice(capacity, peers int64) int64 { return max(capacity/(4*peers), 1) }

// Refund implements quota.Limiter: the units go back into the local
// slice, to be spent or given back later; when the slice's lease has
// ended, to Redis.
func (h *Hybrid) Refund(ctx context.Context, key string, l quota.Limit, n int64, now time.Time) error {
	if !leases(l) {
		return h.store.refund(ctx, key, l, n)
	}
	sh := h.table.Lock(key)
	if e, ok := sh.Peek(key); ok && !e.evicted && e.granted > 0 && e.algorithm == l.Algorithm && now.Before(e.until) {
		if e.stopped {
			e.parked += n // a stopped lease is not spent: back with it at its retirement
		} else {
			e.tokens += n
		}
		h.holdLocked(key, e)
		sh.Unlock()
		return nil
	}
	sh.Unlock()
	h.enqueue(giveback{key: key, algorithm: l.Algorithm, window: l.Window, lease: held{unspent: n}, reason: ReturnRefund})
	return nil
}

// holdLocked registers e as holding a lease, for the idle sweeper.
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
	if e.granted > 0 {
		now := h.opts.Now()
		if !now.Before(e.until) {
			h.expireLocked(e)
		}
		h.enqueue(h.heldBack(key, e, now.UnixNano(), ReturnEvicted))
		e.dropLeaseLocked()
	}
}

// enqueue hands a lease to the background returner. It never blocks: when
// the queue is full the lease is dropped, which only under-uses the
// bucket until the lease ends.
func (h *Hybrid) enqueue(g giveback) {
	if g.lease.unspent <= 0 && g.lease.granted <= 0 {
		return
	}
	select {
	case h.returns <- g:
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
	var err error
	switch g.algorithm {
	case quota.TokenBucket:
		var r returned
		r, err = h.store.giveBack(ctx, g.key, g.lease.unspent, g.lease)
		if err == nil && r != returnedKnown {
			// Redis had forgotten the lease: nothing went back, and what
			// was spent of it was charged (unless the key was gone).
			h.forgotten()
			return
		}
	default:
		if g.lease.unspent <= 0 {
			return // a window lease ends with its window: nothing to retire
		}
		l := quota.Limit{Algorithm: g.algorithm, Window: g.window}
		if g.lease.id == 0 {
			err = h.store.refund(ctx, g.key, l, g.lease.unspent) // a refund, made with its decision
		} else {
			// To the window the lease was counted in (its id), and only
			// there: a lease given back a window later must not credit a
			// window that never counted it.
			err = h.store.giveBackWindow(ctx, g.key, l, g.lease.id, g.lease.unspent)
		}
	}
	if err != nil {
		return // the lease ends by itself; a lost return only under-uses the count
	}
	if g.lease.unspent > 0 {
		h.opts.Metrics.TokensReturned.WithLabelValues(string(g.reason)).Add(float64(g.lease.unspent))
	}
}

// sweepLoop ends the leases that have ended and gives back the idle ones
// that are worth a call.
func (h *Hybrid) sweepLoop() {
	defer h.wg.Done()
	t := time.NewTicker(max(h.opts.SliceIdle/4, 10*time.Millisecond))
	defer t.Stop()
	for {
		select {
		case <-h.stop:
			return
		case <-t.C:
			h.Sweep(h.opts.Now(), h.opts.SliceIdle, ReturnIdle)
		}
	}
}

// Sweep goes over every key holding a lease as of now: a lease that has
// ended is dropped (no call: Redis stops counting it by itself); one
// unused for at least idle goes back to Redis when its bucket was last
// seen below half full, where other replicas may be short of its tokens
// (ReturnIdle), or always (any other reason: Close gives everything
// back with idle 0; GiveBackReason.givesBackAll).
func (h *Hybrid) Sweep(now time.Time, idle time.Duration, reason GiveBackReason) {
	ns := now.UnixNano()
	h.holdersMu.Lock()
	keys := make([]string, 0, len(h.holders))
	for k := range h.holders {
		keys = append(keys, k)
	}
	h.holdersMu.Unlock()
	for _, key := range keys {
		var g giveback
		sh := h.table.Lock(key)
		h.holdersMu.Lock()
		e := h.holders[key]
		cur, ok := sh.Peek(key)
		switch {
		case e == nil:
		case !ok || cur != e || e.granted == 0:
			delete(h.holders, key)
			e.holding = false
		case !now.Before(e.until):
			h.expireLocked(e)
			if e.lapsed == 0 { // a window lease with units to give back stays named for the next lease call
				e.granted, e.leaseID = 0, 0
			}
			delete(h.holders, key)
			e.holding = false
		case ns-e.lastUsed >= int64(idle) && e.flight == nil && (reason.givesBackAll() || 2*e.remote < e.capacity):
			g = h.heldBack(key, e, ns, reason)
			e.dropLeaseLocked()
			delete(h.holders, key)
			e.holding = false
		}
		h.holdersMu.Unlock()
		sh.Unlock()
		if g.key != "" {
			h.giveBack(context.Background(), g)
		}
	}
}

// Close stops the background work and gives every lease back to Redis,
// within ctx.
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
	h.Sweep(h.opts.Now(), 0, ReturnShutdown)
}

// forgetExact is how long after learning that Redis forgot a replica
// takes exactly what each request costs, leasing nothing ahead: two
// heartbeats, long enough for the other replicas to be back too (their
// breakers close within a probe interval of each other) and to charge
// their fallback debts (as each breaker closes, Store.chargeDebts, or
// with a key's next call for what did not fit or on a Cluster). Leasing
// a slice ahead before the others' debts landed would hand out tokens
// that those debts spend: the debts arrive replica by replica, and in
// redis mode the first replica back takes a request's cost meanwhile,
// not a slice.
const forgetExact = 2 * time.Second

// forgotten counts a lease Redis had forgotten.
func (h *Hybrid) forgotten() { h.opts.Metrics.LeasesForgotten.Inc() }

// touchLocked brings e up to the store's state before a decision: after a
// heartbeat confirmed the state, the lease's unspent tokens are what was
// counted in it (spending from here on is since); after a change, a
// cached denial, made against the state Redis lost, is dropped.
func (h *Hybrid) touchLocked(e *keyState) {
	if c := h.confirms.Load(); e.confirmSeq != c {
		e.confirmSeq, e.atConfirm = c, e.tokens
	}
	if era := h.era.Load(); e.era != era {
		e.era, e.deniedUntil = era, 0
	}
	if e.granted == 0 && (e.stopped || e.parked != 0 || e.k != 0) {
		// The lease went without this path (a charge spent it): nothing
		// of it is left to settle.
		e.k, e.g, e.stopped, e.parked, e.owed = 0, 0, false, 0, 0
	}
}

// Confirmed implements StateWatcher: a heartbeat found the Redis state
// unchanged, so every unit spent from leases so far was counted in it.
func (h *Hybrid) Confirmed(epoch string) {
	h.epoch.Store(&epoch)
	h.confirms.Add(1)
}

// Forgot implements StateWatcher: a heartbeat found Redis in another state
// (see the design note). Every lease held stops: a bucket's unspent tokens
// are parked until the key's next call retires the lease, which gives
// them back if the new state holds the grant and else charges what was
// spent since the last confirmed heartbeat; a window's lease is dropped
// (its count starts again with the state; nothing is given back to it).
func (h *Hybrid) Forgot(string) {
	h.era.Add(1)
	h.exactUntil.Store(h.opts.Now().Add(forgetExact).UnixNano())
	h.holdersMu.Lock()
	keys := make([]string, 0, len(h.holders))
	for k := range h.holders {
		keys = append(keys, k)
	}
	h.holdersMu.Unlock()
	confirmed := h.confirms.Load()
	for _, key := range keys {
		sh := h.table.Lock(key)
		if e, ok := sh.Peek(key); ok && !e.evicted && e.granted > 0 {
			switch {
			case e.algorithm != quota.TokenBucket:
				e.dropLeaseLocked()
			case !e.stopped:
				var owed int64
				if e.confirmSeq == confirmed { // touched since: what was spent since
					owed = max(e.atConfirm-e.tokens, 0)
				}
				e.parked, e.tokens, e.owed, e.stopped = e.parked+e.tokens, 0, owed, true
			}
		}
		sh.Unlock()
	}
}
