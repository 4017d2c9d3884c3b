package quota_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/extauthz/extauthz/internal/quota"
	"github.com/extauthz/extauthz/internal/quota/local"
	"github.com/extauthz/extauthz/internal/quota/redisstore"
	"github.com/extauthz/extauthz/tests/internal/testredis"
)

// A key's limit may change between calls (a limit read from each request,
// such as a tenant's claim raised mid-window): every store counts what was
// spent against the limit of the call. At one instant, 100 admitted under
// a limit of 100 leave exactly 900 under 1000, and none under 50; in
// hybrid mode over three replicas too, where the leases taken under the
// old limit are handed back rather than spent under the new one.
func TestLimitChangesBetweenCallsOfOneKey(t *testing.T) {
	t.Parallel() // an injected clock: nothing in it waits on real time
	srv := testredis.Start(t)
	rdb := srv.Client()
	ctx := context.Background()
	for _, a := range []quota.Algorithm{quota.TokenBucket, quota.SlidingWindow, quota.FixedWindow, quota.SlidingLog, quota.LeakyBucket} {
		stores := map[string]func(clk *clock) []quota.Limiter{
			"local": func(*clock) []quota.Limiter {
				table, err := local.NewTable(1000)
				if err != nil {
					t.Fatal(err)
				}
				return []quota.Limiter{local.New(table)}
			},
			"redis": func(clk *clock) []quota.Limiter {
				store := redisstore.NewStore(rdb, redisstore.StoreOptions{Prefix: "rl:", Timeout: time.Second, Metrics: redisstore.NewMetrics(nil), Log: quiet, Clock: clk.Now})
				t.Cleanup(store.Close)
				return []quota.Limiter{newRedis(t, store)}
			},
			"hybrid": func(clk *clock) []quota.Limiter {
				var out []quota.Limiter
				for _, r := range newReplicas(t, rdb, clk, 3, 1000, time.Hour) {
					out = append(out, r.h)
				}
				return out
			},
		}
		for _, store := range []string{"local", "redis", "hybrid"} {
			t.Run(fmt.Sprintf("%s/%s", a, store), func(t *testing.T) {
				clk := newClock()
				lims := stores[store](clk)
				admit := func(key string, limit int64, n int) (admitted int) {
					l := quota.Limit{Algorithm: a, Limit: limit, Window: time.Hour}
					if a == quota.LeakyBucket {
						// Requests are held up to 99 slots of the first
						// limit (no configuration allows that; it keeps the
						// arithmetic round): a request waits for the slots
						// taken before it, at the rate of its own limit.
						l.Queue, l.MaxDelay = -1, 99*36*time.Second
					}
					for i := 0; i < n; i++ {
						d, err := lims[i%len(lims)].Take(ctx, key, l, 1, clk.Now())
						if err != nil {
							t.Fatal(err)
						}
						if d.Allowed {
							admitted++
							if d.Limit != limit {
								t.Fatalf("decision under limit %d advertises %d", limit, d.Limit)
							}
						}
					}
					return admitted
				}
				type step struct {
					limit    int64
					n, admit int
				}
				runs := [][]step{{
					{100, 300, 100},   // the tenant's first limit, spent
					{1000, 3000, 900}, // raised: what was spent still counts
					{50, 300, 0},      // lowered below what was spent: nothing more
					{1000, 300, 0},    // and back: the 1000 are spent
				}, {
					// Lowered while hybrid replicas hold leases taken
					// under 1000 (30 spent of slices of 83): they are
					// retired, not spent under 50.
					{1000, 30, 30},
					{50, 300, 20},
					{1000, 3000, 950}, // and the denials cached under 50 are dropped
				}}
				if a == quota.LeakyBucket {
					// The slots taken are kept: at 1000 an hour a slot
					// is 3.6s, and 990 of them fit in the 3564s a
					// request may wait, 100 of them taken at 100 an hour.
					runs = [][]step{
						{{100, 300, 100}, {1000, 3000, 891}, {50, 300, 0}, {1000, 300, 0}},
						{{1000, 30, 30}, {50, 300, 20}, {1000, 3000, 941}},
					}
				}
				for i, steps := range runs {
					key := fmt.Sprintf("change%d:%s:%s", i, a, store)
					for _, st := range steps {
						if got := admit(key, st.limit, st.n); got != st.admit {
							t.Fatalf("run %d, limit %d: admitted %d of %d, want %d", i, st.limit, got, st.n, st.admit)
						}
					}
				}
			})
		}
	}
}
