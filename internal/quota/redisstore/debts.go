package redisstore

import (
	"context"
	"time"
)

// Fallback debts are charged as the store comes back, not key by key.
//
// What the fallback admits for a token bucket while Redis is unreachable
// is this replica's debt to the key's Redis bucket (Table.Owe). Charged
// only with the key's next call on this replica, the debts of a fleet
// reach Redis one by one: the first replica back leases and admits from
// a bucket that still lacks the others' debts (after a restart without
// persistence, from a full one), and those debts land after the tokens
// they were owed for were spent again. Every replica's breaker closes
// within a probe interval of the others, but a key may wait much longer
// for its next call on each. So when a master comes back, before the
// breaker lets decisions reach it (Store.Warm), each replica charges
// every debt it owes, without granting anything; a debt that cannot be
// charged then stays for the key's next call, as before. A Redis that
// comes back empty thus holds every debt of the replicas back by then
// before its first grant, as one exact bucket fed the same requests
// would.

// chargeDebtsBudget bounds the time a master coming back spends charging
// debts before decisions reach it: the rest are charged with their keys'
// next calls. A call takes well under a millisecond on a healthy link,
// so this is hundreds of keys at least.
const chargeDebtsBudget = 250 * time.Millisecond

// ChargeDebtsOf makes the store charge the fallback debts kept in t each
// time a master comes back (Warm). Open wires it.
func (s *Store) ChargeDebtsOf(t *Table) { s.debts.Store(t) }

// chargeDebts charges every debt owed under a known limit (Table.OweUnder)
// to its Redis bucket, within ctx and chargeDebtsBudget. It calls Redis
// directly: the breaker is still open while a master warms. On a Cluster
// it charges nothing here (a master coming back serves a part of the
// keys, and the others' masters may still be down): each key's next call
// does.
func (s *Store) chargeDebts(ctx context.Context) {
	t := s.debts.Load()
	if t == nil || s.opts.Router != nil {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, chargeDebtsBudget)
	defer cancel()
	debts := t.takeOwed()
	for i, d := range debts {
		if ctx.Err() != nil || !s.chargeDebt(ctx, d) {
			for _, left := range debts[i:] {
				t.OweUnder(left.key, left.limit, left.units)
			}
			return
		}
	}
	s.chargeFellBack(ctx, t)
}

// chargeFellBack charges what this replica's fallback admitted of each
// key's current window (fixed or sliding; Table.FellBack) to the
// window's Redis count, as a charge (counted whatever the limit), within
// ctx, as chargeDebts does the token buckets' debts and for the same
// reason: the replicas' fallbacks admitted those units while Redis
// counted none, and until each replica's count reaches Redis every other
// replica's calls must hold its share out of the window's room
// (Resilient.hold), which costs the window what the fallbacks did not
// use. Charged as each replica comes back, the others hold only while a
// replica may still be falling back (Store.DownUntil), not for the rest
// of the window. A unit charged is no longer held by the key's own calls
// (Table.chargedFellBack); one that cannot be charged stays held by them
// and is named again. A charge that lands in the next window (Redis's
// clock turned it meanwhile) counts there: less admitted, never more.
//
// On a Cluster it runs as each master comes back (back), for the keys of
// the masters that are up: a key whose master is still down keeps its
// units, named again for the next master's return, and its own calls
// hold them meanwhile.
func (s *Store) chargeFellBack(ctx context.Context, t *Table) {
	now := time.Now()
	if s.opts.Clock != nil {
		now = s.opts.Clock()
	}
	units := t.takeFellBack(now)
	for i, u := range units {
		if s.opts.Router != nil && s.breaker.NodeFor(ctx, s.key(u.key)).Down() {
			t.markFell(u.key)
			continue
		}
		if ctx.Err() != nil || !s.chargeWindow(ctx, u) {
			for _, left := range units[i:] {
				t.markFell(left.key)
			}
			return
		}
		t.chargedFellBack(u.key, u.start, u.units)
	}
}

// chargeWindow charges u to its window's Redis count (the window
// scripts' charge: always, with no penalty box) and reports whether
// Redis answered.
func (s *Store) chargeWindow(ctx context.Context, u fellBackUnits) bool {
	ctx, cancel := context.WithTimeout(ctx, s.opts.Timeout)
	defer cancel()
	script, _ := windowScript(u.limit.Algorithm)
	err := script.Run(ctx, s.rdb, []string{s.algorithmKey(u.key, u.limit.Algorithm)},
		windowMicros(u.limit), u.limit.Limit, s.nowArg(time.Microsecond), u.units, "", "", "", "", "1", "", "", "").Err()
	result := "ok"
	if err != nil {
		result = resultOf(err)
	}
	s.opts.Metrics.Calls.WithLabelValues("fell_back", result).Inc()
	return err == nil
}

// ChargesFellBack reports whether the store charges the windows'
// fallback units as Redis comes back (chargeFellBack): a store wired to
// a table (redisstore.Open wires every one).
func (s *Store) ChargesFellBack() bool { return s.debts.Load() != nil }

// back runs after the breaker let a server back: on a Cluster, whose
// masters come back one by one, it charges the windows' fallback units
// of the keys whose masters are up (a standalone store charged them in
// Warm, before decisions reached it). Decisions may reach the master
// before the charge does; until it lands their calls hold the units
// (Resilient.hold): the key's own, and the other replicas' shares until
// DownUntil.
func (s *Store) back() {
	t := s.debts.Load()
	if t == nil || s.opts.Router == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), chargeDebtsBudget)
	defer cancel()
	s.chargeFellBack(ctx, t)
}

// chargeDebt charges d to its bucket and grants nothing (a take of 0
// with 1 needed asks without taking, and sets no penalty box). It
// reports whether Redis answered. A charge whose reply is lost is
// charged again with the key's next call: the replicas then admit less,
// never more.
func (s *Store) chargeDebt(ctx context.Context, d owed) bool {
	ctx, cancel := context.WithTimeout(ctx, s.opts.Timeout)
	defer cancel()
	err := bucketLease.Run(ctx, s.rdb, []string{s.key(d.key)},
		intervalMicros(d.limit), d.limit.Capacity(), 0, 1, s.nowArg(time.Microsecond), d.units).Err()
	result := "ok"
	if err != nil {
		result = resultOf(err)
	}
	s.opts.Metrics.Calls.WithLabelValues("debt", result).Inc()
	return err == nil
}
