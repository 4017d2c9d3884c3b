package quota_test

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/extauthz/extauthz/internal/quota"
	"github.com/extauthz/extauthz/tests/internal/testredis"
)

// A cold key's fitted lease, as Redis counts it (docs/modes.md, "Lives
// fitted to keys" and "under-use, bounded"): a replica that has run for
// an hour sees a key for the first time and leases it for 10 minutes,
// two tokens (the request's, and one for the key's next decision). Redis
// counts the one held out until 10 minutes after the grant, rounded up to
// a quarter of that (12.5 minutes at most): a replica killed holding it
// strands that token until then, and no longer. The bucket holds 100
// units; another replica asking for all 100 is refused while the lease
// is counted and granted once it has ended and the token has refilled.
func TestHybridFittedLeaseEndsInRedis(t *testing.T) {
	srv := testredis.Start(t)
	rdb := srv.Client()
	ctx := context.Background()
	clk := newClock()
	reps := newReplicas(t, rdb, clk, 2, 1000, time.Hour)
	victim, other := reps[0], reps[1]
	l := quota.Limit{Limit: 100, Window: time.Minute}

	clk.Advance(time.Hour)
	granted := clk.Now()
	if d, err := victim.h.Take(ctx, "cold", l, 1, granted); err != nil || !d.Allowed {
		t.Fatalf("the cold key's first decision: %+v, %v", d, err)
	}
	fields, err := rdb.HGetAll(ctx, "rl:{cold}").Result()
	if err != nil {
		t.Fatal(err)
	}
	var out []time.Time
	for f, v := range fields {
		if !strings.HasPrefix(f, "x") {
			continue
		}
		ms, err := strconv.ParseInt(f[1:], 10, 64)
		if err != nil {
			t.Fatalf("lease field %q: %v", f, err)
		}
		if v != "1" {
			t.Fatalf("Redis counts %s tokens out on the cold key's lease; its slice is 2, one spent at once", v)
		}
		out = append(out, time.UnixMilli(ms))
	}
	if len(out) != 1 {
		t.Fatalf("lease fields %v; want the one lease", fields)
	}
	life := out[0].Sub(granted)
	t.Logf("the cold key's lease is counted until %v after it was granted", life)
	if life < 10*time.Minute || life > 12*time.Minute+30*time.Second {
		t.Fatalf("the lease is counted %v after its grant; a fitted lease lives 10 minutes, rounded up to a quarter of that at most", life)
	}

	// The victim is killed holding its token (it is never asked again).
	// Just before the lease ends in Redis, refill has brought the bucket
	// back to its capacity less that token: 100 units are refused.
	clk.Advance(life - time.Millisecond)
	if d, err := other.h.Take(ctx, "cold", l, 100, clk.Now()); err != nil || d.Allowed {
		t.Fatalf("100 units with one counted out on a live lease: %+v, %v; the bucket holds 99", d, err)
	}
	// Once it has ended the token refills as a spent one does (an expiry
	// never adds at once what refill could not add while the lease was
	// out; bucket_state.lua): the whole bucket is there a refill interval
	// (600ms) later.
	clk.Advance(time.Millisecond + time.Minute/100)
	if d, err := other.h.Take(ctx, "cold", l, 100, clk.Now()); err != nil || !d.Allowed {
		t.Fatalf("100 units once the stranded lease ended: %+v, %v; the bucket is full", d, err)
	}
}
