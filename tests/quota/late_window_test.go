package quota_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/extauthz/extauthz/internal/quota"
	"github.com/extauthz/extauthz/internal/quota/redisstore"
	"github.com/extauthz/extauthz/tests/internal/testredis"
)

// A window's call that the decision stopped waiting for, on a slow link,
// ran all the same, and the fallback admitted the request meanwhile: the
// units the call took in Redis are that admission's count, and stay. Given
// back (as they were), the admission was counted nowhere the other
// replicas read, and the window admitted its limit besides it: a window
// over its limit by one for each such decision (TestWindowUnderNetworkFaults
// under 80ms ± 40ms, docs/reliability.md). So the window admits its limit
// and not one more: the fallback's admission, then the rest from Redis.
func TestLateWindowReplyCountsTheFallbacksAdmission(t *testing.T) {
	for _, mode := range []string{"redis", "hybrid"} {
		t.Run(mode, func(t *testing.T) {
			// A second into the hour's window: the fallback's part of the
			// window (what the limit admits in the window left after the
			// count became unknown) is the whole limit.
			lw := startLateWindow(t, mode, time.Second)
			d := lw.lateDecision(t)
			if !d.Allowed {
				t.Fatalf("the decision whose call came late: %+v; want admitted by the fallback", d)
			}
			admitted := 1 + lw.fromRedis(t)
			if admitted != lateLimit {
				t.Fatalf("the window admitted %d (the fallback's 1, then %d from Redis; the late reply's units: %v kept, %v given back); want its limit, %d",
					admitted, admitted-1, testutil.ToFloat64(lw.m.LateKept), testutil.ToFloat64(lw.returned()), lateLimit)
			}
		})
	}
}

// The same with the window turning while the call is out: sent 10ms
// before its window ends, failed once the next had begun. Redis counts
// such a call in the window it was sent in, so the fallback decides it
// there too (where 10ms of an hour's window leave none of the limit to
// admit: denied, and the late take given back). Decided in the next
// window instead, as it was, its admission came on top of that window's
// limit, which Redis then admitted whole: 11 of 10.
func TestLateWindowReplyAcrossTheWindowsTurn(t *testing.T) {
	for _, mode := range []string{"redis", "hybrid"} {
		t.Run(mode, func(t *testing.T) {
			lw := startLateWindow(t, mode, -10*time.Millisecond)
			// The failure is known 20ms later by Resilient's clock, in the
			// next window.
			turn := lw.clk.Now().Add(10 * time.Millisecond)
			lw.r.WithClock(func() time.Time { return turn.Add(10 * time.Millisecond) })
			d := lw.lateDecision(t)
			// The next window, from Redis, with the fallback's decision if
			// it was made there (its reset an hour away, not 10ms).
			lw.clk.Advance(20 * time.Millisecond)
			inNext := lw.fromRedis(t)
			if d.Allowed && d.ResetAfter > 10*time.Millisecond {
				inNext++
			}
			if inNext != lateLimit {
				t.Fatalf("the window after the turn admitted %d (the fallback's decision: %+v); want its limit, %d", inNext, d, lateLimit)
			}
		})
	}
}

// The sliding log's late replies, as the windows': a log call the
// decision stopped waiting for ran all the same, and its reply came
// after the fallback decided. Denied by the fallback (it starts empty
// after a call that may have run, and 60ms of 10 an hour refill none),
// the entry the call logged is removed by its member, and the log then
// admits its limit (before, the entry stayed, counted for nobody: 9 of
// 10). Admitted by the fallback (its clock set an hour on, past every
// entry its share could hold), the entry stays as that admission's, and
// the log admits the rest of its limit and not one more.
func TestLateLogReplyIsGivenBackOrKept(t *testing.T) {
	for _, mode := range []string{"redis", "hybrid"} {
		for _, admit := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/fallback admits %v", mode, admit), func(t *testing.T) {
				lw := startLate(t, mode, time.Second, lateLogLimit)
				if admit {
					known := lw.clk.Now().Add(time.Hour + time.Second)
					lw.r.WithClock(func() time.Time { return known })
				}
				d := lw.lateDecision(t)
				if d.Allowed != admit {
					t.Fatalf("the decision whose call came late: %+v; want admitted %v by the fallback", d, admit)
				}
				fromRedis := lw.fromRedis(t)
				admitted := fromRedis
				if d.Allowed {
					admitted++
				}
				if admitted != lateLimit {
					t.Fatalf("the log admitted %d (the fallback admitted %v, then %d from Redis; the late reply's units: %v kept, %v given back); want its limit, %d",
						admitted, d.Allowed, fromRedis, testutil.ToFloat64(lw.m.LateKept), testutil.ToFloat64(lw.returned()), lateLimit)
				}
			})
		}
	}
}

// lateLimit is the late-window tests' limit: per hour, a fixed window.
const lateLimit = 10

var lateLogLimit = quota.Limit{Algorithm: quota.SlidingLog, Limit: lateLimit, Window: time.Hour, OnError: quota.ErrorFallback}

var lateWindowLimit = quota.Limit{Algorithm: quota.FixedWindow, Limit: lateLimit, Window: time.Hour, OnError: quota.ErrorFallback}

// lateWindow is one replica's stack (redis or hybrid mode behind
// Resilient) on a Redis that tests pause, with the scripts' clock.
type lateWindow struct {
	srv *testredis.Server
	clk *clock
	m   *redisstore.Metrics
	r   *redisstore.Resilient
	l   quota.Limit // lateWindowLimit, or lateLogLimit
}

// startLateWindow starts it with the scripts' clock at the next hour plus
// at. The hour is the next one: a decision's deadline is real time, and
// Resilient keeps a tenth of what is left of it after the decision's
// instant, which must not be past.
func startLateWindow(t *testing.T, mode string, at time.Duration) *lateWindow {
	t.Helper()
	return startLate(t, mode, at, lateWindowLimit)
}

// startLate is startLateWindow for the limit l.
func startLate(t *testing.T, mode string, at time.Duration, l quota.Limit) *lateWindow {
	t.Helper()
	// A pause ends at the server's next cron tick: at the default hz (10
	// a second), the 120ms one below lasted up to 200ms, past the store's
	// 150ms read timeout, and no reply came for the call to be late with.
	// At hz 100 it ends within 10ms of its length.
	srv := testredis.Start(t, "--hz", "100")
	clk := newClock()
	clk.Advance(time.Now().Truncate(time.Hour).Add(time.Hour + at).Sub(clk.Now()))
	store, m := pipeStore(t, []string{srv.Addr}, "test", clk.Now)
	// One replica: its fallback's share is the whole window.
	lw := &lateWindow{srv: srv, clk: clk, m: m, r: resilientStack(t, mode, store, m, clk.Now, 1, redisstore.HybridOptions{}), l: l}
	// Another key first, so that Redis holds the script: a call held by
	// the pause would otherwise be told NOSCRIPT and load it after the
	// decision stopped waiting, which no reply of the first call follows.
	if d, err := lw.r.Take(context.Background(), "other", l, 1, clk.Now()); err != nil || !d.Allowed || d.Degraded != 0 {
		t.Fatalf("with Redis healthy: %+v, %v", d, err)
	}
	return lw
}

// lateDecision decides key k while Redis holds every script for 120ms,
// with 60ms of deadline: the call is given up within it and the fallback
// decides; the reply comes when the pause ends (TestLateReplyIsGivenBack),
// and lateDecision waits for it (bounded), kept or given back.
func (lw *lateWindow) lateDecision(t *testing.T) quota.Decision {
	t.Helper()
	ctx := context.Background()
	admin := lw.srv.Client()
	defer admin.Close()
	if err := admin.Do(ctx, "CLIENT", "PAUSE", "120", "WRITE").Err(); err != nil {
		t.Fatal(err)
	}
	late, cancel := context.WithTimeout(ctx, 60*time.Millisecond)
	d, err := lw.r.Take(late, "k", lw.l, 1, lw.clk.Now())
	cancel()
	if err != nil || d.Degraded != quota.DegradedFallback {
		t.Fatalf("a call held by CLIENT PAUSE for 120ms, 60ms of deadline: %+v, %v; want decided by the fallback", d, err)
	}
	for deadline := time.Now().Add(2 * time.Second); testutil.ToFloat64(lw.m.LateKept)+testutil.ToFloat64(lw.returned()) < 1; {
		if time.Now().After(deadline) {
			t.Fatal("no late reply within 2s of a 120ms pause")
		}
		time.Sleep(10 * time.Millisecond) // the reply arrives when the pause ends
	}
	return d
}

// returned counts the units given back after late replies.
func (lw *lateWindow) returned() prometheus.Counter {
	return lw.m.TokensReturned.WithLabelValues("late")
}

// fromRedis asks for k twice the limit with Redis healthy and returns how
// many were admitted.
func (lw *lateWindow) fromRedis(t *testing.T) int {
	t.Helper()
	admitted := 0
	for range 2 * lateLimit {
		d, err := lw.r.Take(context.Background(), "k", lw.l, 1, lw.clk.Now())
		if err != nil {
			t.Fatal(err)
		}
		if d.Degraded != 0 {
			t.Fatalf("with Redis healthy again: %+v", d)
		}
		if d.Allowed {
			admitted++
		}
	}
	return admitted
}
