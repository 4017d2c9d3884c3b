package redisstore

import (
	"errors"
	"sync"
	"sync/atomic"
	"time"
)

// lateFate tells a window or sliding log call's late reply what became
// of the request the call was made for. A call the decision stopped
// waiting for (its deadline, a slow link) may have run all the same: its
// reply then comes after the request was decided by the fallback. Had
// the fallback denied the request, the units the call took were counted
// for nobody and go back (Store.undoWindowLate, Store.undoLogLate). Had
// it admitted the request, those units are that admission's count in
// Redis, which the other replicas read: the take stands. Given back
// instead, the admission would be counted nowhere the other replicas can
// see, and they would admit the window's limit besides it (a window over
// its limit by one for each such admission, under a link's latency near
// the call timeout: docs/reliability.md).
//
// Store.runCall makes one only when its caller stops waiting for a call
// that has a late handler, and returns it in the call's error
// (abandonedCall); Resilient.Take settles it with its decision. Nothing
// is made on the path where Redis answers in time.
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

// lateFateWait bounds how long a late reply waits for its decision: far
// longer than any decision (they end within their caller's deadline), so
// that a fate nobody settles (a call made outside Resilient) gives back,
// as before there were fates.
const lateFateWait = 2 * time.Second

func newLateFate() *lateFate { return &lateFate{settled: make(chan struct{})} }

// settle records that the decision admitted units by its fallback (0:
// it did not, or it was not the fallback's). Only the first call counts.
func (f *lateFate) settle(units int64) {
	f.once.Do(func() {
		f.admitted = units
		close(f.settled)
	})
}

// keep returns how many of the units a late reply's call took stand as
// the fallback's admission, waiting for the decision (lateFateWait at
// most): the admission's units, to the first late reply whose call took
// them all (a decision may have made two calls, both late: only one take
// stands), else none. A nil fate keeps nothing.
func (f *lateFate) keep(took int64) int64 {
	if f == nil {
		return 0
	}
	select {
	case <-f.settled:
	case <-time.After(lateFateWait):
		return 0
	}
	if f.admitted <= 0 || took < f.admitted || !f.claimed.CompareAndSwap(false, true) {
		return 0
	}
	return f.admitted
}

// lateFunc handles the reply of a call its caller stopped waiting for,
// with the call's fate (nil when none was made).
type lateFunc func(v any, fate *lateFate)

// abandonedCall is the error of a call its caller stopped waiting for,
// with the fate its late reply, if one comes, will ask for.
type abandonedCall struct {
	err  error
	fate *lateFate
}

func (e *abandonedCall) Error() string { return e.err.Error() }
func (e *abandonedCall) Unwrap() error { return e.err }

// fateOf is the fate in err, when err is an abandoned call's; nil else.
func fateOf(err error) *lateFate {
	var a *abandonedCall
	if errors.As(err, &a) {
		return a.fate
	}
	return nil
}
