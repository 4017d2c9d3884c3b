package redisstore

// GiveBackReason is why unspent hybrid tokens went back to Redis (or, for
// ReturnExpired, why they never will): the reason label of
// extauthz_hybrid_tokens_returned_total.
type GiveBackReason string

const (
	// ReturnRenewed: given back with the key's next lease call.
	ReturnRenewed GiveBackReason = "renewed"
	// ReturnIdle: a lease unused for slice_idle, on a bucket last seen
	// below half full, where other replicas may be short of its tokens.
	ReturnIdle GiveBackReason = "idle"
	// ReturnEvicted: the key left the bounded table.
	ReturnEvicted GiveBackReason = "evicted"
	// ReturnShutdown: every lease goes back as the process stops.
	ReturnShutdown GiveBackReason = "shutdown"
	// ReturnRefund: units a request took and did not use (plain tokens).
	ReturnRefund GiveBackReason = "refund"
	// ReturnReload: the key's limit changed with a reload.
	ReturnReload GiveBackReason = "reload"
	// ReturnLate: a lease call whose reply came after its decision
	// stopped waiting gives back all it took (Store.undoLate).
	ReturnLate GiveBackReason = "late"
	// ReturnExpired: unspent when the lease ended; never given back,
	// Redis stops counting them by itself.
	ReturnExpired GiveBackReason = "expired"
)

// giveBackReasons are every reason, each a series of
// extauthz_hybrid_tokens_returned_total from the start (NewMetrics).
var giveBackReasons = []GiveBackReason{
	ReturnRenewed, ReturnIdle, ReturnEvicted, ReturnShutdown, ReturnRefund, ReturnReload, ReturnLate, ReturnExpired,
}

// givesBackAll reports whether a sweep for r gives back every lease unused
// for its idle time; an idle sweep gives back only those whose bucket was
// last seen below half full (Hybrid.Sweep), as a full bucket leaves the
// other replicas short of nothing.
func (r GiveBackReason) givesBackAll() bool { return r != ReturnIdle }
