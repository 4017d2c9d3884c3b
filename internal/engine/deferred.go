package engine

import (
	"context"
	"sync"
	"time"

	"github.com/extauthz/extauthz/internal/config"
	"github.com/extauthz/extauthz/internal/quota"
)

// DeferredCharges sums the hits of denied takes that TakeEach counts in
// hybrid and redis mode, so that a flood over one key is not a Redis
// call per request more than all or nothing makes: in hybrid mode a
// denied fixed-window take is usually the lease's cached denial,
// answered without Redis, and in redis mode it is one call already;
// charging its hits one by one would add an exact Redis call to each.
// Instead a key's denied
// hits are charged at most once per Every, summed; the sum still
// pending is charged by Flush (a reload, where a raised limit is the
// one thing that reads those hits), and forgotten when its window ends
// (the window's end forgives them anyway). What a replica stops holding
// without a reload (the last Every of a flood that then ends) is never
// charged: a limit raised later in the same window, by a reload of
// another replica only or by a limit Envoy sends, sees up to Every of
// one replica's denied hits fewer than envoyproxy/ratelimit would.
//
// Only fixed windows aligned to the epoch are deferred (their window is
// known here, on this replica's clock); every other charge is made at
// once. A DeferredCharges is safe for concurrent use; the zero value is
// not: use NewDeferredCharges.
type DeferredCharges struct {
	every time.Duration
	mu    sync.Mutex
	m     map[deferredKey]*deferredEntry
	adds  int
}

type deferredKey struct {
	key    string
	window time.Duration
}

type deferredEntry struct {
	limiter quota.Limiter
	limit   quota.Limit // Overdraft set: a charge
	start   int64       // the window's start, unix ns
	units   int64       // pending
	last    int64       // when the key's hits were last charged, unix ns
}

// maxDeferred bounds the keys held; past it a denied take is charged at
// once.
const maxDeferred = 100_000

// DefaultDeferEvery is how often at most one key's denied hits are
// charged in hybrid mode under rls.counting: each.
const DefaultDeferEvery = time.Second

// NewDeferredCharges returns a table charging each key at most once per
// every (DefaultDeferEvery when 0).
func NewDeferredCharges(every time.Duration) *DeferredCharges {
	if every <= 0 {
		every = DefaultDeferEvery
	}
	return &DeferredCharges{every: every, m: map[deferredKey]*deferredEntry{}}
}

// defers reports whether t's denied hits may wait in the table: a fixed
// window aligned to the epoch in hybrid or redis mode (in local mode a
// charge costs no call).
func defers(t *Taken) bool {
	return (t.Policy.Mode == config.ModeHybrid || t.Policy.Mode == config.ModeRedis) &&
		t.Limit.Algorithm == quota.FixedWindow && t.Limit.Calendar == nil && t.Limit.Window > 0
}

// add records t's denied hits at now and returns how many units to
// charge now (0: they wait), with the charge's limit.
func (c *DeferredCharges) add(t *Taken, now time.Time) (int64, quota.Limit) {
	ns := now.UnixNano()
	w := int64(t.Limit.Window)
	start := ns - ns%w
	l := t.Limit.Limit
	l.Overdraft = true
	c.mu.Lock()
	defer c.mu.Unlock()
	c.adds++
	if c.adds%1024 == 0 {
		c.sweepLocked(ns)
	}
	k := deferredKey{t.Key, t.Limit.Window}
	e := c.m[k]
	if e == nil {
		if len(c.m) >= maxDeferred {
			return t.Units, l
		}
		e = &deferredEntry{}
		c.m[k] = e
	}
	if e.start != start { // a new window: what was pending is forgiven
		e.start, e.units = start, 0
	}
	e.limiter, e.limit = t.Policy.limiter, l
	e.units += t.Units
	if ns-e.last < int64(c.every) {
		return 0, l
	}
	n := e.units
	e.units, e.last = 0, ns
	return n, l
}

// sweepLocked forgets the keys whose window has ended with nothing left
// pending that counts.
func (c *DeferredCharges) sweepLocked(ns int64) {
	for k, e := range c.m {
		if ns >= e.start+int64(k.window) && ns-e.last >= int64(c.every) {
			delete(c.m, k)
		}
	}
}

// Flush charges every key's pending hits of the window still running at
// now, one call per key, and reports how many keys it charged. A charge
// that fails is lost, as any take's.
func (c *DeferredCharges) Flush(ctx context.Context, now time.Time) int {
	ns := now.UnixNano()
	type charge struct {
		limiter quota.Limiter
		key     string
		limit   quota.Limit
		units   int64
	}
	var due []charge
	c.mu.Lock()
	for k, e := range c.m {
		if e.units > 0 && ns < e.start+int64(k.window) {
			due = append(due, charge{e.limiter, k.key, e.limit, e.units})
		}
		e.units = 0
	}
	c.mu.Unlock()
	for _, ch := range due {
		_, _ = ch.limiter.Take(ctx, ch.key, ch.limit, ch.units, now)
	}
	return len(due)
}

// Pending reports the units waiting to be charged, for tests.
func (c *DeferredCharges) Pending() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	var n int64
	for _, e := range c.m {
		n += e.units
	}
	return n
}
