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

// A decision that stopped waiting for its call (its deadline left the
// call less than the connection's read timeout) while the reply was still
// coming: the call ran in Redis, and its reply says what it took. SPEC §7:
// the run is not paid for twice. What the call took, its grant and the
// fallback debt it charged (which its caller keeps to charge again), goes
// back to the bucket, so the bucket ends where the decisions that counted
// left it. Redis is slowed by CLIENT PAUSE WRITE, which holds the script
// and lets its reply go once the pause ends, as a slow link does.
func TestLateReplyIsGivenBack(t *testing.T) {
	srv := testredis.Start(t)
	store, m := pipeStore(t, []string{srv.Addr}, "test", nil)
	table := newTable(t)
	lim := redisstore.NewRedis(store, table)
	// An hour's window: refill (one token per 6 minutes) plays no part.
	l := quota.Limit{Algorithm: quota.TokenBucket, Limit: 10, Window: time.Hour, OnError: quota.ErrorFallback}
	ctx := context.Background()
	for range 4 {
		if d, err := lim.Take(ctx, "k", l, 1, time.Now()); err != nil || !d.Allowed {
			t.Fatalf("with Redis healthy: %+v, %v", d, err)
		}
	}
	// A debt of 2 (fallback admissions), charged by the next call.
	table.Owe("k", 2)

	admin := srv.Client()
	defer admin.Close()
	if err := admin.Do(ctx, "CLIENT", "PAUSE", "120", "WRITE").Err(); err != nil {
		t.Fatal(err)
	}
	// 60ms of deadline: the store keeps a tenth, so the call is given
	// up after 54ms, well inside the read timeout (the store's 150ms).
	late, cancel := context.WithTimeout(ctx, 60*time.Millisecond)
	_, err := lim.Take(late, "k", l, 1, time.Now())
	cancel()
	if err == nil {
		t.Fatal("a call held by CLIENT PAUSE for 120ms answered within 54ms")
	}
	// The give-back follows the late reply: wait for it (bounded).
	returned := m.TokensReturned.WithLabelValues("late")
	for deadline := time.Now().Add(2 * time.Second); testutil.ToFloat64(returned) < 3; {
		if time.Now().After(deadline) {
			t.Fatalf("%v tokens given back after the late reply, want 3 (its grant of 1 and the debt of 2 it charged)", testutil.ToFloat64(returned))
		}
		time.Sleep(10 * time.Millisecond) // the reply arrives when the pause ends
	}
	// The caller kept the debt (the call failed, to its knowledge), so the
	// next call charges it: 10 − 4 spent − 2 owed − 1 now = 3 left. Had the
	// late call's take and charge stood, 0 would be: paid twice.
	d, err := lim.Take(ctx, "k", l, 1, time.Now())
	if err != nil || !d.Allowed {
		t.Fatalf("after the late reply: %+v, %v", d, err)
	}
	if d.Remaining != 3 {
		t.Fatalf("after the late reply the bucket holds %d; want 3: the abandoned call's grant and the debt it charged given back", d.Remaining)
	}
}
