package redisstore

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/extauthz/extauthz/internal/localcache"
	"github.com/extauthz/extauthz/internal/quota"
)

// Design note: hybrid mode keeps each count in Redis and spends it in
// leases. A replica leases a slice of a key's tokens with one atomic
// script call (a partial grant when fewer remain) and spends it locally
// with no I/O until the slice runs out or the lease ends; the next lease
// call retires the previous one, giving back what was not spent.
//
// A busy key's leases live for LeaseTTL (60s by default), long enough for
// a key that comes back to a replica every few seconds to find tokens
// waiting; a colder key's token bucket leases live longer, up to 10
// minutes, fitted to its rate with a slice of what it will use
// (hybrid_fit.go), and a young replica's first lease of a key is a probe
// of half a life. That is safe because Redis counts what is out: bucket_state.lua keeps the
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
// Slices are sized from what the lease may be spent on: a busy key's,
// this replica's share of what the limit refills over a lease's life
// (limit rate × life ÷ replicas), or its own demand over that life when
// higher (a fitted lease's, twice its expected use), at most a
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

// slice is a key's hybrid state in its Table entry, guarded by the
// entry's shard lock: the lease it holds (hybrid_lease.go) and what the
// key's decisions keep beside it. The entry's level (remote, remoteAt) is
// what Redis held at the last lease.
type slice struct {
	lease               // the lease held
	capacity    int64   // of the limit leased under (or of the denial cached)
	deniedUntil int64   // unix ns until which the Redis count is known spent
	fullAt      int64   // unix ns at which the Redis bucket is full, as of the last lease
	lastUsed    int64   // unix ns of the last decision or refund
	count       int64   // decisions since the last lease
	rate        float64 // smoothed decisions per second on this replica
	flight      *flight // the lease in progress, if any
	waiting     int64   // requests waiting for a lease of this key
	holding     bool    // registered with Hybrid.holders
	evicted     bool    // pushed out of the cache
	era         int64   // Hybrid.era when the key was last touched: a new one drops the cached denial
}

// confirmation is what the heartbeats have found so far (lease.retiring).
func (h *Hybrid) confirmation() confirmation {
	return confirmation{seq: h.confirms.Load(), epoch: h.epoch.Load()}
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

// leaser is what Hybrid asks of Redis: the Store's calls it makes, and
// nothing else, so that a fake answering from memory can stand in for
// Redis in hybrid's unit tests (hybrid_fake_test.go).
type leaser interface {
	// lease and leaseWindow lease a bucket's or a window's units,
	// retiring the lease held (Store.lease, Store.leaseWindow).
	lease(ctx context.Context, partition string, l quota.Limit, a leaseAsk) (bucketGrant, error)
	leaseWindow(ctx context.Context, partition string, l quota.Limit, a leaseAsk, hold windowHold) (windowLease, error)
	// giveBack, giveBackWindow and refund return unspent units.
	giveBack(ctx context.Context, partition string, n int64, h held) (returned, error)
	giveBackWindow(ctx context.Context, partition string, l quota.Limit, ws, units int64) error
	refund(ctx context.Context, partition string, l quota.Limit, units int64, taken time.Time) error
	// decide is an exact decision, for what hybrid mode does not lease.
	decide(ctx context.Context, partition string, l quota.Limit, units, debt int64) (quota.Decision, error)
	// peek and reset serve the counters API (inspect.go).
	peek(ctx context.Context, partition string, l quota.Limit) (quota.Inspection, error)
	reset(ctx context.Context, partition string) error
	// wantTurn says a decision under l at ns was served without a call
	// (Store.wantTurn).
	wantTurn(l quota.Limit, ns int64)
	// levelAt stamps a level a call answered to a decision at now
	// (Store.levelAt).
	levelAt(now time.Time) time.Time
}

var _ leaser = (*Store)(nil)

// Hybrid spends local slices of Redis counts. See the design note above.
type Hybrid struct {
	table *Table
	store leaser
	peers PeerCounter
	opts  HybridOptions

	holdersMu sync.Mutex
	holders   map[string]*keyState // keys whose entries hold tokens

	returns chan giveback // leases to give back, from evictions and refunds
	// started (unix ns, opts.Now) is when this replica began watching its
	// keys: a key first leased a lease life or more later is a cold one
	// (hybrid_fit.go).
	started int64
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
	if opts.Metrics == nil {
		opts.Metrics = store.opts.Metrics
	}
	return newHybrid(table, store, peers, opts)
}

// newHybrid is NewHybrid over any leaser; opts.Metrics must be set.
func newHybrid(table *Table, store leaser, peers PeerCounter, opts HybridOptions) *Hybrid {
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
	h := &Hybrid{
		table:   table,
		store:   store,
		peers:   peers,
		opts:    opts,
		holders: map[string]*keyState{},
		returns: make(chan giveback, 4096),
		started: opts.Now().UnixNano(),
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

// Take implements Limiter: a charge: always limit is decided as redis
// mode decides it (budget), a limit hybrid mode does not lease by its
// exact script, and every other from the key's lease: spent locally
// when the slice held has the request's tokens (spendLocked, written out
// here: the hot path, no I/O), and otherwise from Redis (takeMissLocked).
func (h *Hybrid) Take(ctx context.Context, key string, l quota.Limit, n int64, now time.Time) (quota.Decision, error) {
	if l.Overdraft {
		return h.budget(ctx, key, l, n, now)
	}
	if !leases(l) {
		d, err := h.store.decide(ctx, key, l, n, 0) // no lease: no fallback debt kept either
		if err == nil && l.OnError == quota.ErrorFallback {
			h.table.record(key, d.Remaining, h.store.levelAt(now))
		}
		return d, err
	}
	need, ns := max(n, 1), now.UnixNano() // a question (n = 0) needs one token in the slice, and spends none
	sh := h.table.Lock(key)
	e := stateLocked(sh, key)
	e.count += n
	e.lastUsed = ns
	if !h.endLeaseLocked(key, e, l, now) && e.lease.spend(n, need) {
		d := h.allowLocked(e, l, ns)
		sh.Unlock()
		h.store.wantTurn(l, ns)
		return d, nil
	}
	return h.takeMissLocked(ctx, sh, e, &request{key: key, l: l, n: n, need: need, now: now, ns: ns})
}

// TakeLocal decides a take of a leased key from the slice held, if it
// holds the take's units: Take's answer when it needs neither Redis nor
// a wait, so no deadline to keep. Resilient.Take asks it before it sets
// one up: a deadline is a runtime timer started and stopped, which a
// profile of hybrid under ghz showed at 3.4% of the sidecar's CPU.
// Otherwise ok is false, and nothing was changed but a lease ended at its
// end: Take goes on from there.
func (h *Hybrid) TakeLocal(key string, l quota.Limit, n int64, now time.Time) (d quota.Decision, ok bool) {
	if l.Overdraft || !leases(l) {
		return quota.Decision{}, false
	}
	need, ns := max(n, 1), now.UnixNano()
	sh := h.table.Lock(key)
	e, held := sh.Get(key)
	if !held || h.endLeaseLocked(key, e, l, now) || !e.lease.spend(n, need) {
		sh.Unlock()
		return quota.Decision{}, false
	}
	e.count += n
	e.lastUsed = ns
	d = h.allowLocked(e, l, ns)
	sh.Unlock()
	h.store.wantTurn(l, ns)
	return d, true
}

// request is one take of a leased key, as takeMissLocked's steps see it.
type request struct {
	key  string
	l    quota.Limit
	n    int64 // units it spends
	need int64 // units the slice must hold for it: n, or 1 for a question (n = 0), which spends none
	now  time.Time
	ns   int64 // now in unix ns
}

// takeMissLocked decides r when the slice e holds lacks its tokens (or
// was taken under another capacity), with the key's shard sh locked, and
// unlocks it. It goes round until a step decides: answer from a denial
// cached (deniedLocked); else wait for the renewal another request of the
// key has in flight (awaitFlightLocked) or renew (renewLocked: retire the
// lease and lease r's tokens and the next slice in one Redis call); then
// spend locally from what came (spendLocked). Each step is called with
// the shard locked and returns with it locked: a step that unlocks it for
// a wait or a call locks it again by the key, which names the same shard.
func (h *Hybrid) takeMissLocked(ctx context.Context, sh *localcache.Shard[*keyState], e *keyState, r *request) (quota.Decision, error) {
	asked := false // r has had Redis's answer
	for {
		if d, ok := h.deniedLocked(e, r, asked); ok {
			sh.Unlock()
			if !asked {
				h.store.wantTurn(r.l, r.ns)
			}
			return d, nil
		}
		if f := e.flight; f != nil {
			if err := h.awaitFlightLocked(ctx, sh, e, f, r); err != nil {
				sh.Unlock()
				return quota.Decision{}, err
			}
			e = stateLocked(sh, r.key) // the key may have left the table meanwhile
		} else {
			d, done, err := h.renewLocked(ctx, sh, e, r)
			asked = true
			if err != nil || done {
				sh.Unlock()
				return d, err
			}
			if e.evicted {
				e = stateLocked(sh, r.key) // the grant went back with the entry: lease again
			}
		}
		if d, ok := h.spendLocked(e, r); ok {
			sh.Unlock()
			return d, nil
		}
	}
}

// spendLocked spends r's units from the slice e holds, with no I/O, when
// it holds them and was taken under r's capacity, ending first what is
// over (endLeaseLocked); it reports the decision if it did (ok).
func (h *Hybrid) spendLocked(e *keyState, r *request) (d quota.Decision, ok bool) {
	if !h.endLeaseLocked(r.key, e, r.l, r.now) && e.lease.spend(r.n, r.need) {
		return h.allowLocked(e, r.l, r.ns), true
	}
	return quota.Decision{}, false
}

// deniedLocked is the denial e has cached for r, if any (ok).
func (h *Hybrid) deniedLocked(e *keyState, r *request, asked bool) (d quota.Decision, ok bool) {
	// A cached denial is checked against the clock again: a request
	// whose now was read before its process stalled (a CPU-throttled
	// container) must not be denied for a token that has come due
	// meanwhile; Redis decides that, as it would in redis mode. A
	// request that just had Redis's denial takes it.
	if e.deniedUntil > r.ns && (asked || e.deniedUntil > h.opts.Now().UnixNano()) {
		return quota.Decision{Limit: r.l.Limit, RetryAfter: time.Duration(e.deniedUntil - r.ns), ResetAfter: time.Duration(max(e.fullAt-r.ns, 0))}, true
	}
	return quota.Decision{}, false
}

// awaitFlightLocked waits, with the shard unlocked, for f, the renewal
// another request of the key has in flight, for its slice. While waiting
// r counts as demand, so whoever leases next asks for enough for every
// waiter, not one token each. It returns f's error, or ctx's; none when
// the renewing request's caller went away and r's did not: r then leases
// itself rather than fall back for a reason not its own.
func (h *Hybrid) awaitFlightLocked(ctx context.Context, sh *localcache.Shard[*keyState], e *keyState, f *flight, r *request) error {
	e.waiting += r.need
	sh.Unlock()
	h.opts.Metrics.LeaseWaits.Inc()
	var err error
	select {
	case <-f.done:
		err = f.err
	case <-ctx.Done():
		err = ctx.Err()
	}
	h.table.Lock(r.key)
	e.waiting -= r.need
	if errors.Is(err, context.Canceled) && ctx.Err() == nil {
		return nil
	}
	return err
}

// renewLocked is the renewal: the slice holds fewer tokens than r needs,
// so it is retired, giving back what is left, and r's tokens and a slice
// for what comes next are leased, all in one call, made with the shard
// unlocked while other requests of the key wait for it (flight). Nobody
// spends the old slice meanwhile; if the call fails, what it held is lost
// to this replica until the lease ends in Redis: under-use. It reports a
// decision when the call decided r (done): a denial of r alone. Otherwise
// the caller goes round again: the grant is held for r to spend from, a
// denial is cached, or the key left the table during the call (e.evicted)
// and the grant went back.
func (h *Hybrid) renewLocked(ctx context.Context, sh *localcache.Shard[*keyState], e *keyState, r *request) (d quota.Decision, done bool, err error) {
	prev := e.lease // askLocked drops it: the call retires it
	a := h.askLocked(e, r)
	f := &flight{done: make(chan struct{})}
	e.flight = f
	sh.Unlock()

	ls, err := h.lease(ctx, r.key, r.l, a)

	h.table.Lock(r.key)
	e.flight = nil
	f.err = err
	close(f.done)
	if err != nil {
		e.debt += a.debt
		if a.retire.k > 0 && neverSent(err) && !e.evicted {
			// The call never reached Redis, so the bucket lease it was
			// to retire is still out, or lost with the state it was
			// granted in (a failover to a replica that missed the
			// grant). Kept, stopped, the key's next call retires it:
			// its unspent tokens back if Redis holds the grant, else
			// what was spent of it since the last confirmed heartbeat
			// charged, as Forgot's leases are. Dropped, a lease spent
			// through an outage that lost its grant was never charged
			// (docs/reliability.md, "A failover that loses writes").
			// A call that may have run may have retired it already.
			e.lease = prev
			e.lease.stop(a.retire.owedSince)
		}
		return quota.Decision{}, false, err
	}
	h.countRenewal(a.retire, ls)
	if e.evicted {
		// The key left the cache while we were away: its entry is
		// gone, so hand the lease back and carry on with a new one.
		// Redis counts all but the n this request was to spend as
		// out; all of it goes back, as nothing was spent.
		h.enqueue(giveback{key: r.key, algorithm: r.l.Algorithm, window: r.l.Window, lease: held{id: ls.id, granted: ls.granted - r.n, unspent: ls.granted}, reason: ReturnEvicted})
		return quota.Decision{}, false, nil
	}
	e.remote, e.remoteAt = ls.remaining, h.store.levelAt(r.now).UnixNano()
	e.fullAt = r.ns + int64(ls.full)
	e.count = 0
	if ls.granted == 0 {
		if r.need > 1 {
			// Redis lacks this request's tokens, not necessarily one:
			// deny this request alone, and cache nothing.
			return quota.Decision{Limit: r.l.Limit, Remaining: ls.remaining, RetryAfter: max(ls.wait, time.Microsecond), ResetAfter: time.Duration(max(e.fullAt-r.ns, 0))}, true, nil
		}
		e.deniedUntil = r.ns + int64(max(ls.wait, time.Microsecond))
		if hold := holdFrom(ctx); hold.until > r.ns {
			// The others' shares held lapse then (Resilient.hold): the
			// window may have room again.
			e.deniedUntil = min(e.deniedUntil, hold.until)
		}
		e.capacity = capacityOf(r.l) // the denial's, for endLeaseLocked
		return quota.Decision{}, false, nil
	}
	h.holdGrantLocked(e, r, ls)
	return quota.Decision{}, false, nil
}

// askLocked is what r's renewal asks Redis for: a slice sized for e
// (sliceSizeLocked; only the request's cost for a while after Redis
// forgot), the lease held retired, and the fallback's debt charged first.
// The lease is dropped on the replica: the call retires it.
func (h *Hybrid) askLocked(e *keyState, r *request) leaseAsk {
	fit := h.sliceSizeLocked(e, r.l, r.ns)
	want := max(fit.want, r.need)
	if r.ns < h.exactUntil.Load() {
		want = r.need // Redis just forgot: exact until the others' debts land (forgetExact)
	}
	old := e.lease.retiring(r.ns, h.confirmation())
	e.lease.drop()
	debt := debtLocked(e, r.l)
	peers := max(h.peers.Count(), 1)
	return leaseAsk{want: want, need: r.need, debt: debt, life: fit.life, peers: peers, spent: r.n, retire: old}
}

// debtLocked takes what e owes Redis for the fallback's admissions under
// l (owesFallback), to be charged with the call about to be made; the
// caller puts it back if the call fails.
func debtLocked(e *keyState, l quota.Limit) (debt int64) {
	if owesFallback(l) {
		debt, e.debt = e.debt, 0
	}
	return debt
}

// countRenewal counts a renewal's outcome: the lease it retired given
// back (or forgotten by Redis), and what it granted.
func (h *Hybrid) countRenewal(old held, ls leased) {
	if ls.forgot {
		h.forgotten()
	} else if old.unspent > 0 {
		h.opts.Metrics.TokensReturned.WithLabelValues(string(ReturnRenewed)).Add(float64(old.unspent))
	}
	if ls.granted > 0 {
		h.opts.Metrics.SlicesLeased.Inc()
		h.opts.Metrics.TokensLeased.Add(float64(ls.granted))
	}
}

// holdGrantLocked makes a renewal's grant e's lease. The request in hand
// spends r.n of it at once (the caller goes round with the lock held);
// the rest is the lease held.
func (h *Hybrid) holdGrantLocked(e *keyState, r *request, ls leased) {
	e.lease.start(ls, r.l, r.n, r.now, h.confirms.Load())
	e.capacity = capacityOf(r.l)
	if ls.unreplicated && ls.granted > r.need {
		// Fewer replicas than redis.wait_replicas hold the lease: a
		// failover now would lose it. The request in hand takes what
		// it needs, as in redis mode; the rest is parked, as a stopped
		// lease's is, given back with the key's next call if Redis
		// still holds it, and nothing charged if not.
		h.opts.Metrics.LeasesUnreplicated.Inc()
		e.lease.parkAllBut(r.need)
	}
	if e.granted > 0 {
		h.holdLocked(r.key, e)
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
	if e.flight == nil && e.lease.outstanding() {
		h.enqueue(e.lease.giveBack(key, now.UnixNano(), h.confirmation(), ReturnReload))
	}
	debt := debtLocked(e, l)
	sh.Unlock()
	d, err := h.store.decide(ctx, key, l, n, debt)
	if err != nil {
		// Charged again next time: if this call ran after all, the
		// replicas admit less, never more.
		h.table.Owe(key, debt)
		return quota.Decision{}, err
	}
	if l.OnError == quota.ErrorFallback {
		h.table.record(key, d.Remaining, h.store.levelAt(now))
	}
	return d, nil
}

// leased is one lease call's outcome, for any algorithm that leases.
type leased struct {
	granted, remaining, id int64
	wait, full, life       time.Duration
	k, g                   int64 // a bucket lease's key state
	forgot                 bool  // the lease retired was one Redis had forgotten
	unreplicated           bool  // fewer replicas than asked hold it (StoreOptions.WaitReplicas)
}

// lease asks Redis for between a.need and a.want units of key under l,
// of which the request in hand spends a.spent at once, retiring
// a.retire, with the script of l's algorithm: a bucket's lease for
// a.life (Store.lease, the call a charge's decision makes too), a
// window's until its window ends (and at most the lease life).
func (h *Hybrid) lease(ctx context.Context, key string, l quota.Limit, a leaseAsk) (leased, error) {
	if l.Algorithm == quota.TokenBucket {
		ls, err := h.store.lease(ctx, key, l, a)
		return leased{granted: ls.granted, remaining: ls.remaining, id: ls.id, wait: ls.wait, full: ls.full, life: a.life, k: ls.k, g: ls.g, forgot: ls.forgot, unreplicated: ls.unreplicated}, err
	}
	w, err := h.store.leaseWindow(ctx, key, l, a, holdFrom(ctx))
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
		h.enqueue(e.lease.giveBack(key, now.UnixNano(), h.confirmation(), ReturnReload))
		return false
	}
	if !now.Before(e.until) {
		h.expireLocked(e)
	}
	return resized
}

// expireLocked ends e's lease at its end (lease.expire), counting its
// unspent tokens as expired.
func (h *Hybrid) expireLocked(e *keyState) {
	if unspent := e.lease.expire(); unspent > 0 {
		h.opts.Metrics.TokensReturned.WithLabelValues(string(ReturnExpired)).Add(float64(unspent))
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
		// The level is stamped when Redis answered (Store.levelAt): a
		// decision that began before the answer sees no refill since.
		remote += max(ns-e.remoteAt, 0) / l.Interval()
	}
	return quota.Decision{
		Allowed:    true,
		Limit:      l.Limit,
		Remaining:  max(min(e.tokens+remote, capacity-1), 0),
		ResetAfter: time.Duration(max(e.fullAt-ns, 0)),
	}
}

// sliceSizeLocked decides how many tokens to lease for e and for how
// long (see the design note and hybrid_fit.go), and updates its rate
// estimate.
func (h *Hybrid) sliceSizeLocked(e *keyState, l quota.Limit, ns int64) leaseFit {
	switch {
	case e.remoteAt != 0:
		e.rate = observedRate(e.rate, e.count, time.Duration(ns-e.remoteAt))
	case ns-h.started >= int64(h.opts.LeaseTTL):
		// Never leased here, and not seen for the lease life and more
		// this replica has watched: a cold key.
		e.rate = observedRate(e.rate, max(e.count, 1), time.Duration(ns-h.started))
	}
	peers := max(h.peers.Count(), 1)
	if l.Algorithm == quota.TokenBucket {
		return fitLease(e.rate, h.opts.LeaseTTL, l, peers, e.waiting)
	}
	// A window's lease dies with its window: sized as a busy key's.
	life := min(h.opts.LeaseTTL, l.Window)
	return leaseFit{life: life, want: shareSlice(e.rate, life, l, peers, e.waiting, maxSlice(capacityOf(l), peers))}
}

// maxSlice is the most tokens one lease takes of a bucket of capacity
// shared by peers replicas: a quarter of the bucket over the replica count.
func maxSlice(capacity, peers int64) int64 { return max(capacity/(4*peers), 1) }

// Refund implements quota.Limiter: the units go back into the local
// slice, to be spent or given back later; when the slice's lease has
// ended, to Redis.
func (h *Hybrid) Refund(ctx context.Context, key string, l quota.Limit, n int64, now time.Time) error {
	if !leases(l) {
		return h.store.refund(ctx, key, l, n, now)
	}
	sh := h.table.Lock(key)
	if e, ok := sh.Peek(key); ok && !e.evicted && e.lease.holds(l, now) {
		e.lease.refund(n)
		h.holdLocked(key, e)
		sh.Unlock()
		return nil
	}
	sh.Unlock()
	g := giveback{key: key, algorithm: l.Algorithm, window: l.Window, lease: held{unspent: n}, reason: ReturnRefund}
	if l.Algorithm != quota.TokenBucket {
		// To the window the units were taken in (now's), as a window
		// lease goes back to its own: after the window turned, the next
		// one never counted them.
		g.lease.id = windowStartMicros(l, now)
	}
	h.enqueue(g)
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
		h.enqueue(e.lease.giveBack(key, now.UnixNano(), h.confirmation(), ReturnEvicted))
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
			err = h.store.refund(ctx, g.key, l, g.lease.unspent, time.Time{}) // a refund, made with its decision
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
			e.lease.unname()
			delete(h.holders, key)
			e.holding = false
		case ns-e.lastUsed >= int64(idle) && e.flight == nil && (reason.givesBackAll() || 2*e.remote < e.capacity):
			g = e.lease.giveBack(key, ns, h.confirmation(), reason)
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

// touchLocked brings e up to the store's state before a decision: the
// lease to the heartbeats (lease.touch); after a change, a cached denial,
// made against the state Redis lost, is dropped.
func (h *Hybrid) touchLocked(e *keyState) {
	e.lease.touch(h.confirms.Load())
	if era := h.era.Load(); e.era != era {
		e.era, e.deniedUntil = era, 0
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
				e.lease.drop()
			case !e.stopped:
				e.lease.stop(e.lease.spentSince(confirmed)) // touched since the last confirmation: what was spent since
			}
		}
		sh.Unlock()
	}
}
