package redisstore

import (
	"github.com/extauthz/extauthz/internal/quota"
	"github.com/extauthz/extauthz/internal/quota/local"
)

// Hybrid is the LevelSource of hybrid mode's Resilient: what a fallback
// starts from when Redis (a key's Cluster master) fails.
var _ LevelSource = (*Hybrid)(nil)

// Level returns what Redis held for key's token bucket at this replica's
// last lease, less what the other replicas may have leased since: a
// slice each, the largest a lease takes (maxSlice), for every algorithm
// that leases. A replica's view is
// as old as its last lease, about a horizon (a second) of its traffic;
// replicas that see a key's traffic alike (a round-robin load balancer)
// each lease about once in that time. Without the allowance every
// replica's share would count the others' last slices as still in Redis,
// and together they would admit up to (peers−1) slices more than the
// bucket held. Too low a level costs nothing once the key's master
// answers again: what the fallback did not admit is still in Redis, and
// only what it admitted is charged (Owe). The sliding log and the leaky
// bucket decide by their exact script, each decision reporting its level,
// as does a charge: always limit (Hybrid.budget).
func (h *Hybrid) Level(key string, l quota.Limit) (local.Level, bool) {
	lv, ok := h.table.Level(key, l)
	if !ok || !leases(l) || l.Overdraft {
		return lv, ok // nothing leased: Redis's word is the level
	}
	peers := max(h.peers.Count(), 1)
	lv.Remaining = max(lv.Remaining-(peers-1)*maxSlice(capacityOf(l), peers), 0)
	return lv, true
}

// FellBack and FellBackIn keep what the fallback admitted of a window,
// held out of the key's window leases (Table.FellBack).
func (h *Hybrid) FellBack(key string, l quota.Limit, start, took int64) {
	h.table.FellBack(key, l, start, took)
}

// FellBackIn: see FellBack.
func (h *Hybrid) FellBackIn(key string, start int64) int64 { return h.table.FellBackIn(key, start) }

// OweUnder keeps units admitted by the fallback under l, charged when
// Redis answers again (Table.OweUnder).
func (h *Hybrid) OweUnder(key string, l quota.Limit, units int64) { h.table.OweUnder(key, l, units) }
