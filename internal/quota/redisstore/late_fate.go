package redisstore

import (
	"context"
	"sync"
	"sync/atomic"
)

// lateFate tells a window call's late reply what became of the request
// the call was made for. A call the decision stopped waiting for (its
// deadline, a slow link) may have run all the same: its reply then comes
// after the request was decided by the fallback. Had the fallback denied
// the request, the units the call took were counted for nobody and go
// back (Store.undoWindowLate). Had it admitted the request, those units
// are that admission's count in Redis, which the other replicas read: the
// take stands. Given back instead, the admission would be counted nowhere
// the other replicas can see, and they would admit the window's limit
// besides it (a window over its limit by one for each such admission,
// under a link's latency near the call timeout: docs/reliability.md).
//
// A fallback admission whose call never ran, or ran and was refused, is
// counted as before: held out of this replica's room (Table.FellBack)
// when the replica knew Redis out of reach, not at all when the call may
// have run.
type lateFate struct {
	once     sync.Once
	settled  chan struct{}
	admitted int64 // units the fallback admitted; read once settled
	claimed  atomic.Bool
}

func newLateFate() *lateFate { return &lateFate{settled: make(chan struct{})} }

// settle records that the decision admitted units by its fallback (0:
// it did not, or it was not the fallback's). Only the first call counts;
// Resilient.Take settles every fate it made before it returns.
func (f *lateFate) settle(units int64) {
	f.once.Do(func() {
		f.admitted = units
		close(f.settled)
	})
}

// keep returns how many of the units a late reply's call took stand as
// the fallback's admission, waiting for the decision to be made: the
// admission's units, to the first late reply whose call took them all (a
// decision may have made two calls, both late: only one take stands),
// else none. A nil fate (a call made without Resilient) keeps nothing.
func (f *lateFate) keep(took int64) int64 {
	if f == nil {
		return 0
	}
	<-f.settled
	if f.admitted <= 0 || took < f.admitted || !f.claimed.CompareAndSwap(false, true) {
		return 0
	}
	return f.admitted
}

type lateFateKey struct{}

// withLateFate carries a decision's fate to its window calls across
// quota.Limiter.
func withLateFate(ctx context.Context, f *lateFate) context.Context {
	return context.WithValue(ctx, lateFateKey{}, f)
}

// lateFateFrom is the fate Resilient put in ctx; nil when it put none.
func lateFateFrom(ctx context.Context) *lateFate {
	f, _ := ctx.Value(lateFateKey{}).(*lateFate)
	return f
}
