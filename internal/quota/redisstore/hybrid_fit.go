package redisstore

import (
	"math"
	"time"

	"github.com/extauthz/extauthz/internal/quota"
)

// Leases fitted to their keys (a token bucket's; windows lease within
// their window, as the design note in hybrid.go says).
//
// A key costs its replica one lease call per lease life at least, however
// rarely it comes: at a fixed life of local.lease_ttl (60s) a key seen
// once a minute pays a call for every decision, and in a gateway's long
// tail of callers most keys are such keys. So a lease's life follows the
// key's rate on this replica: lease_ttl for a busy key (or one whose rate
// is not known yet), longer for a cold one, up to maxLeaseLife, the most
// local.lease_ttl may be set to, so that the lease sees about fitUses of
// the key's decisions; and the slice of a longer lease is what the key
// will use in it (twice its expected decisions), not the replica's share
// of the refill, so a cold key holds little for long rather than much.
//
// What it costs, and why it is bounded (docs/modes.md states it):
//   - The bound on admissions is Redis's (bucket_state.lua): whatever the
//     life, the replicas together admit at most burst + rate × T in any
//     interval T.
//   - Under-use: a fitted slice is at most twice what the key was seen to
//     use in its life, so under 4 × fitUses, and never more than any
//     lease's cap (a quarter of the bucket over the replicas): a cold key
//     holds no more than a busy one may. What it holds is its own expected
//     use, which it spends; an idle lease near the limit goes back after
//     local.slice_idle as before.
//   - A replica killed holding a fitted lease strands its unspent tokens
//     until the lease ends: at most maxLeaseLife and the grain Redis
//     rounds up by (a quarter of the life), 12.5 minutes, where a busy
//     key's lease strands for lease_ttl and a quarter.
//   - Lives come from a few values (lease_ttl × 2^i, then maxLeaseLife),
//     each rounded in Redis to a quarter of itself, so a key's leases out
//     stay a handful of expiry fields whatever the number of replicas.
//
// The rate is the key's decisions on this replica over the time since its
// last lease here, smoothed over leases. A key this replica has never
// leased has not been seen since the replica started: once the replica
// has watched for a whole lease life, that says the key comes less than
// once a lease life, and its rate is taken as one decision over the time
// watched (its first lease is fitted like any other). Before that, the
// replica knows nothing of its keys: a first lease is a probe, half a
// lease life sized as ever, so the rate is known sooner and a replica
// that dies young strands less.

// maxLeaseLife is the longest life a fitted lease gets: the most
// local.lease_ttl may be set to (config's maxLeaseTTL).
const maxLeaseLife = 10 * time.Minute

// fitUses is how many of its key's decisions a fitted lease is meant to
// see on its replica: a cold key's calls are then about 1 in fitUses + 1
// of its decisions (15 per 1,000), where a fixed lease_ttl gives 1 in
// 1 + rate × lease_ttl (a key seen every 10 seconds: 143 per 1,000).
const fitUses = 64

// fitHeadroom is the slice of a fitted lease over its expected use: a
// key's decisions in a life vary (a Poisson count of 64 is above 80 one
// time in 30), and a slice that runs out early costs a call.
const fitHeadroom = 2

// leaseFit is the life and size of a token bucket lease.
type leaseFit struct {
	life time.Duration
	want int64 // tokens to ask for (the caller asks for at least the request's cost)
}

// fitLease sizes the next token bucket lease of a key whose rate on this
// replica is rate decisions a second (0: not known) under l, shared by
// peers replicas, with waiting units queued behind the call, when the
// configured lease life is base.
func fitLease(rate float64, base time.Duration, l quota.Limit, peers, waiting int64) leaseFit {
	peers = max(peers, 1)
	most := maxSlice(capacityOf(l), peers)
	if rate <= 0 {
		return leaseFit{life: base / 2, want: shareSlice(0, base/2, l, peers, waiting, most)}
	}
	uses := float64(min(int64(fitUses), most))
	life := base
	for life < maxLeaseLife && rate*life.Seconds() < uses {
		life = min(2*life, maxLeaseLife)
	}
	if life <= base {
		return leaseFit{life: base, want: shareSlice(rate, base, l, peers, waiting, most)}
	}
	want := int64(math.Ceil(fitHeadroom * rate * life.Seconds()))
	// One for the request in hand and one for the key's next decision, so
	// a key seen once in a long while still finds a token waiting.
	return leaseFit{life: life, want: min(max(want, waiting+2), most)}
}

// shareSlice is a lease of life sized as a busy key's: the key's demand
// over the life, or this replica's share of what the limit refills in it
// when higher, at least the waiting units and one, at most most.
func shareSlice(rate float64, life time.Duration, l quota.Limit, peers, waiting, most int64) int64 {
	demand := int64(math.Ceil(rate * life.Seconds()))
	share := int64(math.Ceil(float64(l.Limit) * float64(life) / float64(l.Window) / float64(peers)))
	return min(max(demand, share, waiting+1, 1), most)
}

// observedRate is a key's smoothed rate after count decisions over
// elapsed since the last estimate (prev; 0: none). Decisions at one
// instant are a burst: counted over a millisecond rather than not at all.
func observedRate(prev float64, count int64, elapsed time.Duration) float64 {
	inst := float64(count) / max(elapsed, time.Millisecond).Seconds()
	if prev == 0 {
		return inst
	}
	return 0.5*prev + 0.5*inst
}
