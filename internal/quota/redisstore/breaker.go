package redisstore

import (
	"context"
	"errors"
	"net"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// Design note: the breaker marks Redis down only when Redis is unavailable
// (killed, frozen, unreachable, refusing), never because this process was
// slow for a moment. A burst that fills the connection pool, a GC pause or
// a CPU-throttled container makes calls slow or late; that is evidence
// about this process as much as about Redis, so it is never enough alone.
//
// A failed call (a timeout, a refused or broken connection, a reply such as
// LOADING or CLUSTERDOWN that says the server cannot serve) and a stalled
// call (in flight for StallAfter with no call finishing meanwhile) only make
// the store suspicious. Suspicion starts one confirmation probe on a
// connection of its own, outside the decision pool, with ProbeTimeout.
// The breaker opens when the probe fails and no decision's call succeeded
// while it ran; a probe that answers clears the suspicion. So:
//
//   - a killed or refusing Redis fails calls and the probe at once: open
//     within milliseconds;
//   - a frozen Redis stalls calls; after StallAfter the probe starts and
//     gets no answer within ProbeTimeout: open within StallAfter + one watch
//     tick + ProbeTimeout (175ms at the defaults);
//   - a process frozen 40ms of every 100ms, a full pool or a slow Redis
//     (DEBUG SLEEP, CLIENT PAUSE of tens of milliseconds) may stall calls,
//     but the probe answers: no trip.
//
// Errors that concern one key or script (WRONGTYPE, OOM, a script error)
// are not Redis being down; a caller that went away (context.Canceled from
// its own context) says nothing about Redis at all.
//
// A probe whose timeout this process noticed late (it was not running when
// the deadline passed: a CPU limit, a starved machine, with Redis's answer
// perhaps waiting to be read) is inconclusive and is asked again with a
// shorter deadline; a confirmation can then take longer than ProbeTimeout,
// but a starved process does not open the breaker.
//
// Once open, calls fail at once with ErrStoreDown, calls in flight are
// abandoned (their decisions fall back immediately rather than wait out
// their timeouts), and a probe every ProbeEvery tests whether Redis is back.

// Breaker timing defaults (StoreOptions overrides them for tests).
const (
	DefaultStallAfter   = 50 * time.Millisecond
	DefaultProbeTimeout = 100 * time.Millisecond
	DefaultProbeEvery   = 500 * time.Millisecond
)

// errStalled is the suspicion raised by the watch when calls stall.
var errStalled = errors.New("redisstore: redis calls stalled")

// outage is closed (its context canceled) when the store is marked down;
// calls in flight watch it and give up at once.
type outage struct {
	ctx    context.Context
	cancel context.CancelFunc
}

func newOutage() *outage {
	ctx, cancel := context.WithCancel(context.Background())
	return &outage{ctx: ctx, cancel: cancel}
}

// begin records a call starting at ns.
func (s *Store) begin(ns int64) {
	if s.inflight.Add(1) == 1 {
		s.progress.Store(ns) // nothing was pending: the stall clock starts now
	}
}

// end records a call finishing at ns, successfully or not.
func (s *Store) end(ns int64, ok bool) {
	s.inflight.Add(-1)
	s.progress.Store(ns)
	if ok {
		s.lastOK.Store(ns)
	}
}

// suspect starts a confirmation probe unless one is running or the store
// is already down.
func (s *Store) suspect(cause error) {
	s.verdictMu.Lock()
	if s.down.Load() || s.verdict != nil {
		s.verdictMu.Unlock()
		return
	}
	done := make(chan struct{})
	s.verdict = done
	s.verdictMu.Unlock()
	go s.confirm(cause, done)
}

// confirm probes Redis on its own connection and opens the breaker if the
// probe fails and no call succeeded while it ran. It closes done when the
// verdict is in.
func (s *Store) confirm(cause error, done chan struct{}) {
	defer func() {
		s.verdictMu.Lock()
		s.verdict = nil
		s.verdictMu.Unlock()
		close(done)
	}()
	timeout := s.opts.ProbeTimeout
	for {
		began := time.Now()
		err := s.probeOnce(timeout)
		if err == nil {
			s.opts.Metrics.Calls.WithLabelValues("confirm", "ok").Inc()
			return
		}
		if s.lastOK.Load() >= began.UnixNano() {
			s.opts.Metrics.Calls.WithLabelValues("confirm", resultOf(err)).Inc()
			return // a decision's call got through meanwhile: Redis answers
		}
		if late := time.Since(began) - timeout; isTimeout(err) && late > timeout/5 && !s.closed.Load() {
			// The timeout was noticed late: this process was not running
			// when the probe's deadline passed (a CPU limit, a starved
			// machine), and Redis's answer may have been waiting to be
			// read. That says nothing about Redis: ask again, with a
			// shorter deadline so that a periodic freeze does not land
			// on it again.
			s.opts.Metrics.Calls.WithLabelValues("confirm", "inconclusive").Inc()
			timeout = max(timeout*7/10, s.opts.ProbeTimeout/2)
			continue
		}
		s.opts.Metrics.Calls.WithLabelValues("confirm", resultOf(err)).Inc()
		s.markDown(cause, err)
		return
	}
}

// tick is the watch's period.
func (s *Store) tick() time.Duration { return max(s.opts.StallAfter/2, time.Millisecond) }

// confirming reports whether a confirmation probe is running.
func (s *Store) confirming() bool {
	s.verdictMu.Lock()
	defer s.verdictMu.Unlock()
	return s.verdict != nil
}

// AwaitVerdict waits, at most until ctx is done, for the confirmation
// probe that a failed call started, and reports whether the store is down.
// A decision whose call failed asks it before falling back, so that a
// real outage is answered as one (a fresh share for keys Redis never
// reported on) and a failure while Redis is up is answered as what it may
// be: a call that ran.
func (s *Store) AwaitVerdict(ctx context.Context) (down bool) {
	s.verdictMu.Lock()
	done := s.verdict
	s.verdictMu.Unlock()
	if done != nil {
		select {
		case <-done:
		case <-ctx.Done():
		}
	}
	return s.down.Load()
}

// probeOnce runs one key command on the probe connection. It is a key
// command, not PING: a Redis Cluster that has lost a master still answers
// PING but refuses keys with CLUSTERDOWN.
func (s *Store) probeOnce(timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	return s.probe.Exists(ctx, s.peersKey()).Err()
}

// markDown opens the breaker: calls fail at once, calls in flight give up.
func (s *Store) markDown(cause, probeErr error) {
	if s.closed.Load() || !s.down.CompareAndSwap(false, true) {
		return
	}
	s.opts.Metrics.Up.Set(0)
	s.opts.Metrics.BreakerOpened.Inc()
	s.outage.Load().cancel()
	s.opts.Log.Warn("redis marked down; policies follow on_redis_error",
		"error", cause.Error(), "probe", probeErr.Error())
}

// markUp closes the breaker after a probe answered.
func (s *Store) markUp() {
	wctx, cancel := context.WithTimeout(context.Background(), time.Second)
	if err := s.Warm(wctx); err != nil { // a restarted Redis has an empty script cache
		s.opts.Log.Debug("loading scripts after redis came back", "error", err.Error())
	}
	cancel()
	s.outage.Store(newOutage())
	s.down.Store(false)
	s.opts.Log.Info("redis is back; policies return to their mode")
	s.opts.Metrics.Up.Set(1)
}

// watch raises suspicion when calls are pending and none has finished for
// StallAfter (a frozen Redis fails nothing: it only stops answering), and
// probes a down store every ProbeEvery.
func (s *Store) watch() {
	defer s.wg.Done()
	tick := time.NewTicker(s.tick())
	defer tick.Stop()
	var lastProbe time.Time
	for {
		var now time.Time
		select {
		case <-s.stop:
			return
		case now = <-tick.C:
		}
		if !s.down.Load() {
			if s.inflight.Load() > 0 && now.UnixNano()-s.progress.Load() >= int64(s.opts.StallAfter) {
				s.suspect(errStalled)
			}
			continue
		}
		if now.Sub(lastProbe) < s.opts.ProbeEvery {
			continue
		}
		lastProbe = now
		if err := s.probeOnce(max(s.opts.ProbeTimeout, s.opts.Timeout)); err != nil {
			s.opts.Metrics.Calls.WithLabelValues("probe", resultOf(err)).Inc()
			continue
		}
		s.opts.Metrics.Calls.WithLabelValues("probe", "ok").Inc()
		s.markUp()
	}
}

// unavailable reports whether err says Redis cannot serve (as opposed to
// an error about one key or script, which it answered).
func unavailable(err error) bool {
	var rerr redis.Error
	if !errors.As(err, &rerr) {
		return true // no reply: timeouts, refused or broken connections, a full pool
	}
	msg := rerr.Error()
	for _, prefix := range []string{"LOADING", "CLUSTERDOWN", "MASTERDOWN", "TRYAGAIN", "READONLY", "BUSY", "NOAUTH", "ERR max number of clients"} {
		if strings.HasPrefix(msg, prefix) {
			return true
		}
	}
	return false
}

// mayHaveRun reports whether a call that failed with err may nevertheless
// have run in Redis: it timed out or lost its connection after the command
// was sent. A refused dial, a full pool or an error reply (LOADING,
// CLUSTERDOWN, a script error) means the script did not run to the end.
func mayHaveRun(err error) bool {
	var rerr redis.Error
	if errors.As(err, &rerr) || errors.Is(err, ErrStoreDown) || errors.Is(err, redis.ErrPoolTimeout) {
		return false
	}
	var oe *net.OpError
	if errors.As(err, &oe) && oe.Op == "dial" {
		return false
	}
	return true
}

// resultOf names a failed call's result for extauthz_redis_calls_total.
func resultOf(err error) string {
	if isTimeout(err) {
		return "timeout"
	}
	return "error"
}

func isTimeout(err error) bool {
	if errors.Is(err, context.DeadlineExceeded) {
		return true
	}
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
