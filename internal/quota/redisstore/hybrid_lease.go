package redisstore

import (
	"time"

	"github.com/extauthz/extauthz/internal/quota"
)

// lease is the lease a replica holds of one key in hybrid mode: a slice
// of the key's count that Redis counts out (see the design note in
// hybrid.go), kept in the key's Table entry. As x/time/rate's Reservation
// owns CancelAt, the lease owns what is done to it: it is started from a
// grant (start), spent (spend), refunded into (refund), stopped when
// Redis forgot (stop), ended at its end (expire), named to Redis for its
// retirement (retiring) and handed back (giveBack). Its methods change
// the lease alone: the caller holds the key's shard lock and counts the
// metrics. The zero value holds no lease.
type lease struct {
	tokens int64 // leased from Redis, not yet spent
	// lapsed are the unspent units of a window lease that has ended: the
	// window's count in Redis still holds them (a window lease does not
	// expire there as a bucket's does) until the next lease call of the
	// key gives them back, which lifts them off the window's weight on
	// the next one.
	lapsed    int64
	granted   int64     // the lease's size, retired with it (0: no lease held)
	id        int64     // the lease's name in Redis: a bucket's expiry (ms), a window's start (µs)
	until     time.Time // this replica spends the lease until then
	window    time.Duration
	algorithm quota.Algorithm // of the lease held

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
}

// confirmation is what the heartbeats last found of the Redis state
// (Hybrid.Confirmed): how many found it unchanged, and the epoch the last
// of them found (nil: none yet).
type confirmation struct {
	seq   int64
	epoch *string
}

// start holds the grant of a lease call, of which the request in hand
// spends n at once (Redis counts all but those n as out), taken under l
// at now with confirms heartbeats confirmed: spent until its life less
// the margin (leaseMargin).
func (ls *lease) start(r leased, l quota.Limit, n int64, now time.Time, confirms int64) {
	ls.tokens, ls.granted, ls.id = r.granted, r.granted-n, r.id
	ls.k, ls.g, ls.atConfirm, ls.confirmSeq = r.k, r.g, r.granted-n, confirms
	ls.until = now.Add(r.life - r.life/leaseMargin)
	ls.algorithm, ls.window = l.Algorithm, l.Window
}

// parkAllBut keeps keep of a grant just started for the request in hand
// and parks the rest, as a stopped lease's are: given back with the key's
// next lease call if Redis still holds the grant, nothing charged if not
// (an unreplicated lease, StoreOptions.WaitReplicas).
func (ls *lease) parkAllBut(keep int64) {
	ls.parked, ls.tokens, ls.owed, ls.stopped = ls.tokens-keep, keep, 0, true
}

// spend takes n of the lease's unspent tokens when it holds need of them
// (n, or 1 for a question, n = 0, which spends none), and reports whether
// it did.
func (ls *lease) spend(n, need int64) bool {
	if ls.tokens < need {
		return false
	}
	ls.tokens -= n
	return true
}

// holds reports whether the lease may take back units taken under l at
// taken: held, taken under l's algorithm, not ended, and for a window,
// of the window holding taken. Units taken in a window that has turned
// since go back to that window's count, not into the next one's lease,
// whose window never counted them (it would admit its limit and one
// more).
func (ls *lease) holds(l quota.Limit, taken time.Time) bool {
	if ls.granted <= 0 || ls.algorithm != l.Algorithm || !taken.Before(ls.until) {
		return false
	}
	return l.Algorithm == quota.TokenBucket || ls.id == windowStartMicros(l, taken)
}

// refund puts n units back into the lease: a stopped lease's are parked,
// never spent, back with it at its retirement.
func (ls *lease) refund(n int64) {
	if ls.stopped {
		ls.parked += n
	} else {
		ls.tokens += n
	}
}

// outstanding reports whether anything of the lease is left for Redis:
// a grant to retire, or tokens to give back.
func (ls *lease) outstanding() bool { return ls.granted > 0 || ls.tokens > 0 || ls.lapsed > 0 }

// touch brings the lease up to the heartbeats before a decision: after
// heartbeat confirms confirmed the state, its unspent tokens are what was
// counted in it (spending from here on is since). A lease that went
// without retiring (a charge spent it) leaves nothing to settle.
func (ls *lease) touch(confirms int64) {
	if ls.confirmSeq != confirms {
		ls.confirmSeq, ls.atConfirm = confirms, ls.tokens
	}
	if ls.granted == 0 && (ls.stopped || ls.parked != 0 || ls.k != 0) {
		ls.k, ls.g, ls.stopped, ls.parked, ls.owed = 0, 0, false, 0, 0
	}
}

// spentSince is what was spent of the lease since heartbeat confirmed
// found the state unchanged, when the key was touched since; else 0.
func (ls *lease) spentSince(confirmed int64) int64 {
	if ls.confirmSeq != confirmed {
		return 0
	}
	return max(ls.atConfirm-ls.tokens, 0)
}

// stop ends the spending of a lease Redis may have forgotten (Hybrid.Forgot):
// its unspent tokens are parked until its retirement, which charges owed
// if Redis no longer holds the grant.
func (ls *lease) stop(owed int64) {
	ls.parked, ls.tokens, ls.owed, ls.stopped = ls.parked+ls.tokens, 0, owed, true
}

// expire ends the lease at its end: a bucket's unspent tokens stop
// counting in Redis by themselves; a window's stay in its count, lapsed,
// to be given back. The lease stays named (granted, id) so the next lease
// call retires it from what Redis counts as out, if Redis still counts
// it. It returns the unspent tokens the lease ended with.
func (ls *lease) expire() (unspent int64) {
	ls.parked = 0 // stopped, and no longer counted: nothing to give back
	unspent = ls.tokens
	if ls.tokens > 0 {
		if ls.algorithm != quota.TokenBucket {
			ls.lapsed += ls.tokens
		}
		ls.tokens = 0
	}
	return unspent
}

// unname forgets an ended lease's name when nothing of it is left to give
// back: a window lease with lapsed units stays named for the next lease
// call.
func (ls *lease) unname() {
	if ls.lapsed == 0 {
		ls.granted, ls.id = 0, 0
	}
}

// retiring is what retires the lease as of ns (held): for a bucket's
// lease still live, with the key state it was granted under and what to
// charge if Redis no longer holds it (everything spent of it, or, once
// stopped, what was spent since the last confirmed heartbeat; the script
// takes the latter when the epoch changed too: held.owedSince).
func (ls *lease) retiring(ns int64, c confirmation) held {
	r := held{id: ls.id, granted: ls.granted, unspent: ls.tokens + ls.lapsed}
	if ls.granted > 0 {
		r.unspent += ls.parked
	}
	if ls.algorithm == quota.TokenBucket && ls.granted > 0 && ls.k > 0 && ns < ls.until.UnixNano() {
		r.k, r.g = ls.k, ls.g
		r.owed = max(ls.granted-ls.tokens-ls.parked, 0)
		r.owedSince = min(ls.spentSince(c.seq), r.owed) // 0 unless touched since the last confirmation
		if ls.stopped {
			r.owed, r.owedSince = ls.owed, ls.owed
		}
		if c.epoch != nil {
			r.epoch = *c.epoch
		}
	}
	return r
}

// drop forgets the lease on the replica (retired, or handed to be).
func (ls *lease) drop() {
	ls.tokens, ls.granted, ls.id, ls.lapsed = 0, 0, 0, 0
	ls.k, ls.g, ls.stopped, ls.parked, ls.owed = 0, 0, false, 0, 0
}

// giveBack hands the lease back as of ns, unspent tokens and all, for
// reason: it is retired (what retiring names to Redis, as key's) and
// dropped; the caller hands the giveback to Redis.
func (ls *lease) giveBack(key string, ns int64, c confirmation, reason GiveBackReason) giveback {
	g := giveback{key: key, algorithm: ls.algorithm, window: ls.window, lease: ls.retiring(ns, c), reason: reason}
	ls.drop()
	return g
}

// forget drops the lease's tokens and name without a word to Redis
// (Table.Forget: a reset deleted what Redis counted).
func (ls *lease) forget() { ls.tokens, ls.granted, ls.id = 0, 0, 0 }
