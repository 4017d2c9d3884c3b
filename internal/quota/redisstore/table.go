package redisstore

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/extauthz/extauthz/internal/localcache"
	"github.com/extauthz/extauthz/internal/quota"
	"github.com/extauthz/extauthz/internal/quota/local"
)

// Table is the bounded per-key table of the Redis-backed limiters: what
// Redis last reported for each key (in both modes), and hybrid mode's
// leased slices. It is safe for concurrent use; each entry is guarded by
// its shard's lock.
type Table struct {
	*localcache.Cache[*keyState]
	onEvict atomic.Pointer[func(key string, e *keyState)]

	// owing names the keys given a debt under a known limit (OweUnder)
	// since the store last charged debts as its master came back
	// (Store.chargeDebts), at most the table's bound of them: a key left
	// out keeps its debt for its next call.
	owing namedKeys
	// fell names the keys whose fallback admitted units of a window
	// (FellBack) since the store last charged them as its master came
	// back (Store.chargeFellBack), at most the table's bound of them: a
	// key left out keeps its units held by its own calls only.
	fell namedKeys
}

// namedKeys is a set of keys named for a later pass (owing, fell), at
// most a bound of them; safe for concurrent use.
type namedKeys struct {
	mu sync.Mutex
	m  map[string]struct{}
}

// add names key unless bound keys are named already.
func (n *namedKeys) add(key string, bound int) {
	n.mu.Lock()
	if n.m == nil {
		n.m = map[string]struct{}{}
	}
	if len(n.m) < bound {
		n.m[key] = struct{}{}
	}
	n.mu.Unlock()
}

// take returns the keys named and names none.
func (n *namedKeys) take() map[string]struct{} {
	n.mu.Lock()
	defer n.mu.Unlock()
	keys := n.m
	n.m = nil
	return keys
}

// keyState is one key's entry in a Table.
type keyState struct {
	// The level Redis last reported: remaining units at remoteAt (unix
	// ns; zero when Redis never reported on the key to this replica).
	remote   int64
	remoteAt int64
	// debt is what this replica admitted for the key by fallback (token
	// buckets), not yet charged to its Redis bucket (see Owe).
	debt int64
	// owedUnder is the limit the debt was admitted under (OweUnder), so
	// that it can be charged before any decision reaches a Redis that
	// comes back (Store.chargeDebts); nil: charged with the key's next
	// call only.
	owedUnder *quota.Limit
	// fellBack is the last window (fixed or sliding) this replica decided
	// the key in by its fallback while Redis was out of its reach (see
	// FellBack).
	fellBack windowFallback
	// fellBackUnder is the limit fellBack's units were admitted under,
	// for the charge as Redis comes back (Store.chargeFellBack); nil
	// until the fallback first admitted some.
	fellBackUnder *quota.Limit
	slice         // hybrid mode's lease
}

// windowFallback is what a replica's fallback admitted in one window of
// a key: the window's start (unix µs, as the scripts count it) and the
// units, none of which Redis counted.
type windowFallback struct {
	start, took int64
}

// NewTable returns a table of at most maxKeys keys.
func NewTable(maxKeys int) (*Table, error) {
	t := &Table{}
	c, err := localcache.New(maxKeys, func(key string, e *keyState) {
		if fn := t.onEvict.Load(); fn != nil {
			(*fn)(key, e)
		}
	})
	if err != nil {
		return nil, err
	}
	t.Cache = c
	return t, nil
}

// stateLocked returns key's entry in the locked shard, creating it.
func stateLocked(sh *localcache.Shard[*keyState], key string) *keyState {
	e, ok := sh.Get(key)
	if !ok {
		e = &keyState{}
		sh.Add(key, e)
	}
	return e
}

// record keeps what Redis reported for key at now.
func (t *Table) record(key string, remaining int64, now time.Time) {
	sh := t.Lock(key)
	e := stateLocked(sh, key)
	e.remote, e.remoteAt = remaining, now.UnixNano()
	sh.Unlock()
}

// Level returns what Redis last reported for key, if it did.
func (t *Table) Level(key string, _ quota.Limit) (local.Level, bool) {
	sh := t.Lock(key)
	defer sh.Unlock()
	if e, ok := sh.Peek(key); ok && e.remoteAt != 0 {
		return local.Level{Remaining: e.remote, At: time.Unix(0, e.remoteAt)}, true
	}
	return local.Level{}, false
}

// Owe records units of key's token bucket admitted without Redis (by the
// fallback while its master was down or a call failed), so that the next
// lease that reaches Redis charges them first. A Redis that kept its
// state through the outage (a replica promoted in a failover, a master
// that was only unreachable) would otherwise hand the same tokens out
// again: it refilled all along, while the replicas spent their shares.
// An entry evicted from the table takes its debt with it.
func (t *Table) Owe(key string, units int64) {
	if units <= 0 {
		return
	}
	sh := t.Lock(key)
	stateLocked(sh, key).debt += units
	sh.Unlock()
}

// OweUnder is Owe for units admitted under l: the debt is also charged as
// soon as Redis answers again, before decisions reach it
// (Store.chargeDebts), not only with the key's next call.
func (t *Table) OweUnder(key string, l quota.Limit, units int64) {
	if units <= 0 {
		return
	}
	sh := t.Lock(key)
	e := stateLocked(sh, key)
	e.debt += units
	if e.owedUnder == nil {
		e.owedUnder = new(quota.Limit)
	}
	*e.owedUnder = l
	sh.Unlock()
	t.owing.add(key, t.Bound())
}

// owed is one key's debt taken for charging (takeOwed).
type owed struct {
	key   string
	limit quota.Limit
	units int64
}

// takeOwed takes the token buckets' debts of the keys named by OweUnder
// since the last call, as much as each key owes now, clearing them: the
// caller charges them, or gives them back with OweUnder when it cannot.
// Keys evicted since, or whose debt a call charged meanwhile, are
// skipped; a window's debt (charge: always) stays for its next call.
func (t *Table) takeOwed() []owed {
	keys := t.owing.take()
	out := make([]owed, 0, len(keys))
	for key := range keys {
		sh := t.Lock(key)
		if e, ok := sh.Peek(key); ok && e.debt > 0 && e.owedUnder != nil && e.owedUnder.Algorithm == quota.TokenBucket {
			out = append(out, owed{key: key, limit: *e.owedUnder, units: e.debt})
			e.debt = 0
		}
		sh.Unlock()
	}
	return out
}

// takeDebt returns key's debt and clears it, for a call that charges it.
func (t *Table) takeDebt(key string) int64 {
	sh := t.Lock(key)
	defer sh.Unlock()
	e, ok := sh.Peek(key)
	if !ok || e.debt == 0 {
		return 0
	}
	d := e.debt
	e.debt = 0
	return d
}

// FellBack records units of key's window (fixed or sliding) that the
// fallback admitted in the window starting at start (unix µs) while Redis
// was out of this replica's reach. Until the window ends, the key's calls
// to Redis hold them out of the window's room (Resilient.hold): Redis
// counted none of them, and without this a window in which Redis came
// back would admit its fallback share and then its whole limit again.
//
// Units admitted under l are also charged to the window's Redis count as
// the store comes back (Store.chargeFellBack, takeFellBack), so that the
// other replicas' calls need not hold them once every replica is back
// (Resilient.hold).
func (t *Table) FellBack(key string, l quota.Limit, start, took int64) {
	sh := t.Lock(key)
	e := stateLocked(sh, key)
	if e.fellBack.start != start {
		e.fellBack = windowFallback{start: start}
	}
	e.fellBack.took += took
	if took > 0 {
		if e.fellBackUnder == nil {
			e.fellBackUnder = new(quota.Limit)
		}
		*e.fellBackUnder = l
	}
	sh.Unlock()
	if took > 0 {
		t.markFell(key)
	}
}

// markFell names key for the next charge of fallback units.
func (t *Table) markFell(key string) { t.fell.add(key, t.Bound()) }

// fellBackUnits are the units a replica's fallback admitted of one
// key's window, taken for charging (takeFellBack).
type fellBackUnits struct {
	key   string
	limit quota.Limit
	start int64 // the window's, unix µs
	units int64
}

// takeFellBack takes the keys FellBack named since the last call, with
// the units their fallback admitted in the window holding now (each
// key's own window length): those of an ended window have nothing left
// to hold. The units stay held by the key's own calls
// (FellBackIn) until chargedFellBack says Redis counted them; a key the
// caller could not charge is named again with markFell.
func (t *Table) takeFellBack(now time.Time) []fellBackUnits {
	keys := t.fell.take()
	out := make([]fellBackUnits, 0, len(keys))
	for key := range keys {
		sh := t.Lock(key)
		if e, ok := sh.Peek(key); ok && e.fellBack.took > 0 && e.fellBackUnder != nil {
			if l := *e.fellBackUnder; e.fellBack.start == windowStartMicros(l, now) {
				out = append(out, fellBackUnits{key: key, limit: l, start: e.fellBack.start, units: e.fellBack.took})
			}
		}
		sh.Unlock()
	}
	return out
}

// chargedFellBack takes units Redis has counted off what key's own calls
// hold of the window starting at start.
func (t *Table) chargedFellBack(key string, start, units int64) {
	sh := t.Lock(key)
	if e, ok := sh.Peek(key); ok && e.fellBack.start == start {
		e.fellBack.took = max(e.fellBack.took-units, 0)
	}
	sh.Unlock()
}

// FellBackIn is what the fallback admitted of key in the window starting
// at start (unix µs): see FellBack.
func (t *Table) FellBackIn(key string, start int64) int64 {
	sh := t.Lock(key)
	defer sh.Unlock()
	if e, ok := sh.Peek(key); ok && e.fellBack.start == start {
		return e.fellBack.took
	}
	return 0
}
