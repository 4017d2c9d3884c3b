package quota_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/extauthz/extauthz/internal/quota"
	"github.com/extauthz/extauthz/internal/quota/redisstore"
)

// A refund (another policy denied the request) gives a window's unit
// back to the window that counted it, and only there. Made after the
// window turned, it credited the next window, which never counted the
// unit: that window then admitted its limit and one more (6 of 5), fixed
// or sliding (for a sliding window, once the previous hour no longer
// weighs). Now the refund names the take's window (its instant,
// Store.refund) and goes where a lease's give-back goes: nowhere for a
// fixed window that has ended, to the previous count for a sliding one;
// in hybrid mode, one the replica no longer holds a lease for goes the
// same way (its window named in the give-back). Both modes, the scripts
// on the test's clock. (Credited to the next
// hour, the fixed window read 6 of 5 there, and the sliding window
// admitted one too many at the start of the hour after, where the next
// hour's count weighed one unit less than it admitted. Hybrid's give-back
// credited the next hour too: 6 of 5.)
//
// At a limit of 40 (hybrid only), the next hour's first lease holds a
// unit beyond its take's (a slice of 2), so the refund finds the
// replica holding a lease of that hour: it went into that lease, and the
// hour admitted 41 of 40. Now a window's lease takes back only units of
// its own window (lease.holds).
func TestRefundAfterTheWindowTurned(t *testing.T) {
	cases := []struct {
		mode  string
		limit int
	}{{"redis", 5}, {"hybrid", 5}, {"hybrid", 40}}
	for _, alg := range []quota.Algorithm{quota.FixedWindow, quota.SlidingWindow} {
		for _, c := range cases {
			mode, limit := c.mode, c.limit
			t.Run(fmt.Sprintf("%v/%s/%d", alg, mode, limit), func(t *testing.T) {
				clk := newClock() // t0, on an hour
				store, _, m := newTestStore(t, clk)
				r := resilientStack(t, mode, store, m, clk.Now, 1, redisstore.HybridOptions{})
				l := quota.Limit{Algorithm: alg, Limit: int64(limit), Window: time.Hour, OnError: quota.ErrorFallback}
				ctx := context.Background()
				take := func() quota.Decision {
					t.Helper()
					d, err := r.Take(ctx, "k", l, 1, clk.Now())
					if err != nil || d.Degraded != 0 {
						t.Fatalf("%+v, %v", d, err)
					}
					return d
				}
				untilDenied := func() (n int) {
					t.Helper()
					for range 2 * limit {
						if take().Allowed {
							n++
						}
					}
					return n
				}

				clk.Advance(time.Hour - time.Millisecond) // the first hour's last millisecond
				taken := clk.Now()
				if d := take(); !d.Allowed {
					t.Fatalf("the first take of an hour: %+v", d)
				}
				// The next hour, early (a sliding window's previous count
				// weighs almost whole): one take (hybrid leases the hour's
				// slice); the refund of the first hour's take; until
				// denied; and late in the hour (the previous count weighs
				// nothing), until denied again.
				clk.Advance(2 * time.Millisecond)
				early := 0
				if take().Allowed {
					early++
				}
				if err := r.Refund(ctx, "k", l, 1, taken); err != nil {
					t.Fatal(err)
				}
				refunded := untilDenied()
				clk.Advance(time.Hour - 3*time.Millisecond)
				late := untilDenied()
				// Hybrid may admit one fewer in a sliding window: its slice
				// of the hour was leased while the previous count weighed
				// whole.
				if n := early + refunded + late; n > limit || mode == "redis" && n != limit {
					t.Fatalf("the next hour admitted %d early, %d after the first hour's take was refunded, %d late: %d; want its limit, %d (the refund takes the unit from the hour that counted it)", early, refunded, late, n, limit)
				}
				// And the hour after begins from what that hour counted:
				// a fixed window afresh; a sliding one with its limit still
				// weighing whole, so none (with the refund credited to
				// that hour's count, one unit fewer weighed, and one was admitted).
				clk.Advance(2 * time.Millisecond)
				if alg == quota.SlidingWindow && mode == "hybrid" {
					return // what the hour after admits depends on when the refund, given back in the background, reaches Redis
				}
				want := limit
				if alg == quota.SlidingWindow {
					want = 0
				}
				if n := untilDenied(); n != want {
					t.Fatalf("early in the hour after: %d admitted; want %d", n, want)
				}
			})
		}
	}
}
