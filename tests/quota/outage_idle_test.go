package quota_test

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/extauthz/extauthz/internal/quota"
	"github.com/extauthz/extauthz/internal/quota/redisstore"
	"github.com/extauthz/extauthz/tests/internal/testredis"
)

// A hybrid replica answering a window's decisions from memory (a slice,
// a denial it cached until the window ends) makes no call for an outage
// to fail or stall. Before, it learnt of an outage at its next call only,
// in the next window, which its fallback then treated as one Redis may
// have counted in: the limit's part of the window left after that call
// (restOfWindow), where redis mode, whose every decision calls, knew of
// the outage before the window began and gave the window its full share
// (TestWindowUnderNetworkFaults: hybrid lost the first window of a
// blackhole, 0.82 to 0.93 of redis mode). Now the breaker asks Redis
// IdleProbe (100ms) before such a window turns, when it has not answered
// since, and dates the outage from that probe: the next window is the
// fallback's, its full share. At the shipped breaker timings, against a
// real Redis frozen with SIGSTOP; the windows are real time (Redis TIME,
// the breaker's clock), which is the point: what the fallback admits
// depends on whether the outage was known to have begun before the window.
func TestHybridLearnsOfAnOutageWithoutCalls(t *testing.T) {
	srv := testredis.Start(t)
	store, m := pipeStore(t, []string{srv.Addr}, "test", nil)
	// One replica: its fallback's share is the whole limit.
	r := resilientStack(t, "hybrid", store, m, time.Now, 1, redisstore.HybridOptions{})
	const limit = 10
	// Two-second windows leave the freeze well over IdleProbe before the
	// turn on a loaded machine.
	l := quota.Limit{Algorithm: quota.FixedWindow, Limit: limit, Window: 2 * time.Second, OnError: quota.ErrorFallback}
	ctx := context.Background()
	take := func() quota.Decision {
		t.Helper()
		d, err := r.Take(ctx, "k", l, 1, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	calls := func() float64 { // every call a decision made
		return testutil.ToFloat64(m.Calls.WithLabelValues("lease", "ok")) + testutil.ToFloat64(m.Calls.WithLabelValues("lease", "timeout"))
	}

	// Into a window just begun: the limit from Redis, then its denial,
	// which the replica caches until the window ends.
	end := waitForWindow(l.Window)
	for i := range limit + 1 {
		if d := take(); d.Allowed != (i < limit) || d.Degraded != 0 {
			t.Fatalf("request %d of a window, Redis healthy: %+v", i+1, d)
		}
	}
	before := calls()
	srv.Freeze()
	t.Cleanup(srv.Thaw)
	frozen := time.Now()
	// Denied from the cache, a request every 5ms, until the window ends:
	// no call.
	for time.Until(end) > 10*time.Millisecond {
		if d := take(); d.Allowed || d.Degraded != 0 {
			t.Fatalf("a key over its limit, denial cached: %+v; want denied from the cache", d)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if n := calls(); n != before {
		t.Fatalf("%v decisions' calls while the denial was cached; want none", n-before)
	}

	// The next window began with Redis out of reach, as the replica
	// learnt before it began: the fallback's, its full share, as in
	// redis mode.
	time.Sleep(time.Until(end) + 10*time.Millisecond) // into the next window
	admitted := 0
	for range 2 * limit {
		d := take()
		if d.Degraded != quota.DegradedFallback {
			t.Fatalf("Redis frozen: %+v; want decided by the fallback", d)
		}
		if d.Allowed {
			admitted++
		}
	}
	since := store.DownSince()
	t.Logf("frozen at %v, outage dated %v, the window turned at %v", frozen.Format(time.StampMilli), since.Format(time.StampMilli), end.Format(time.StampMilli))
	if idle := testutil.ToFloat64(m.Calls.WithLabelValues("idle", "timeout")); idle != 1 || since.IsZero() || !since.Before(end) {
		t.Errorf("idle probes timed out: %v, outage dated %v; want the one probe before the window turned, dated then", idle, since.Format(time.StampMilli))
	}
	if admitted != limit {
		t.Fatalf("the window after the outage began admitted %d; want its full share, %d (the replica knew Redis was out of reach before it began)", admitted, limit)
	}
}

// waitForWindow waits until a window of length w (epoch aligned, as the
// scripts count) has just begun, and returns when it ends.
func waitForWindow(w time.Duration) time.Time {
	next := time.Now().Truncate(w).Add(w)
	time.Sleep(time.Until(next) + 20*time.Millisecond) // the window's turn is real time
	return next.Add(w)
}
