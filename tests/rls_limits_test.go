package tests

import (
	"fmt"
	"strconv"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/redis/go-redis/v9"

	"github.com/extauthz/extauthz/tests/internal/testredis"
)

// Descriptor files with several limits on one descriptor and windows of
// any length, end to end: the real binary, requests as Envoy's ratelimit
// filter builds them, in local mode, and in redis and hybrid mode (two
// replicas, the requests alternating between them).

// limitsDomain is a burst and a daily limit on one key, and a 30-second
// window written as Envoy's RateLimit API writes one.
const limitsDomain = `
domain: api
descriptors:
  - key: generic_key
    value: api
    descriptors:
      - key: user
        rate_limits:
          - {name: burst, unit: second, requests_per_unit: 3}
          - {name: daily, unit: day, requests_per_unit: 5}
  - key: half
    rate_limit: {unit: second, unit_multiplier: 30, requests_per_unit: 2}
`

// The route's rate_limits entries: [generic_key api, request_headers
// x-user → user], and [generic_key half=x].
var (
	userLimits = actions(genericKey("", "api"), requestHeader("x-user", "user"))
	halfLimits = actions(genericKey("half", "x"))
)

func TestRLSSeveralLimitsAndWindows(t *testing.T) {
	parallel(t)
	for _, mode := range []string{"local", "redis", "hybrid"} {
		t.Run(mode, func(t *testing.T) {
			section, _ := domainDir(t, map[string]string{"api.yaml": limitsDomain})
			var replicas []*sidecar
			var srv *testredis.Server
			if mode == "local" {
				replicas = []*sidecar{startSidecar(t, section)}
			} else {
				srv = testredis.Start(t)
				replicas = startReplicas(t, 2, defaultsConfig(srv.Addr, mode, section))
			}
			t.Run("burst and daily", func(t *testing.T) {
				var rdb *redis.Client
				if srv != nil {
					rdb = srv.Client()
				}
				user := assertBurstAndDaily(t, replicas, rdb)
				if srv == nil {
					return
				}
				// Each limit counts under a key of its own: the burst's was
				// read within its second (assertBurstGivenBack; it expires
				// with its window, so checking it here would race the
				// window's end), the daily's lasts the day.
				key := "rl:{rls/api:generic_key=api:user=" + user + "%w1d}:fw"
				if n, err := srv.Client().Exists(t.Context(), key).Result(); err != nil || n != 1 {
					t.Errorf("redis key %s: exists %d, %v", key, n, err)
				}
			})
			t.Run("30s window", func(t *testing.T) { assertHalfMinute(t, replicas) })
		})
	}
}

// assertBurstAndDaily: 3 requests in a second, the 4th denied by the
// burst (which the daily does not count); in the burst's next window the
// daily's last 2, then the daily denies. Each status gives the limit that
// denied or the one with the fewest remaining. The burst's unit taken by
// the request the daily denied is given back: with Redis (rdb not nil)
// the burst's count there is read back. It returns the user whose burst
// stayed within one second.
func assertBurstAndDaily(t *testing.T, replicas []*sidecar, rdb *redis.Client) (burstUser string) {
	call := func(i int, user string) *rlsv3.RateLimitResponse {
		return replicas[i%len(replicas)].shouldRateLimit(rateLimitRequest("api", envoyRequest{headers: [][2]string{{"x-user", user}}}, userLimits))
	}
	expect := func(resp *rlsv3.RateLimitResponse, code rlsv3.RateLimitResponse_Code, name string, remaining uint32) {
		t.Helper()
		st := resp.GetStatuses()[0]
		if resp.GetOverallCode() != code || st.GetCode() != code || st.GetCurrentLimit().GetName() != name || st.GetLimitRemaining() != remaining {
			t.Fatalf("answer %v\nwant %v, limit %s, %d remaining", resp, code, name, remaining)
		}
	}
	const burstPolicy, dailyPolicy = "api.generic_key_api.user/1s", "api.generic_key_api.user/1d"
	var denial *rlsv3.RateLimitResponse
	for attempt, user := range []string{"ada", "bob", "cyd"} {
		// Waiting on real time: the burst's fixed one-second window
		// is aligned to the second, so its four requests start just
		// after one begins.
		time.Sleep(time.Until(time.Now().Truncate(time.Second).Add(time.Second + 10*time.Millisecond)))
		start := time.Now()
		resps := make([]*rlsv3.RateLimitResponse, 4)
		for i := range resps {
			resps[i] = call(i, user)
		}
		if end := time.Now(); end.Truncate(time.Second) != start.Truncate(time.Second) && attempt < 2 {
			t.Logf("%s's burst crossed a second (%v); again with another user", user, end.Sub(start))
			continue
		}
		burstUser = user
		expect(resps[0], rlsv3.RateLimitResponse_OK, "burst", 2) // the daily has 4 left
		expect(resps[2], rlsv3.RateLimitResponse_OK, "burst", 0)
		expect(resps[3], rlsv3.RateLimitResponse_OVER_LIMIT, "burst", 0)
		if got, want := headerOf(resps[0], "ratelimit-policy"), fmt.Sprintf(`"%s";q=3;w=1`, burstPolicy); got != want {
			t.Fatalf("ratelimit-policy %q, want %q", got, want)
		}
		if got := headerOf(resps[3], "retry-after"); got != "1" {
			t.Fatalf("burst denial: retry-after %q, want 1", got)
		}
		denial = resps[3]
		break
	}
	// Waiting on real time: the burst's window ends when its denial said.
	time.Sleep(denial.GetStatuses()[0].GetDurationUntilReset().AsDuration())
	start := time.Now()
	expect(call(0, burstUser), rlsv3.RateLimitResponse_OK, "daily", 1)
	expect(call(1, burstUser), rlsv3.RateLimitResponse_OK, "daily", 0)
	resp := call(0, burstUser)
	expect(resp, rlsv3.RateLimitResponse_OVER_LIMIT, "daily", 0)
	if rdb != nil {
		assertBurstGivenBack(t, rdb, burstUser, start)
	}
	if st := resp.GetStatuses()[0]; st.GetCurrentLimit().GetUnit() != rlsv3.RateLimitResponse_RateLimit_DAY ||
		headerOf(resp, "ratelimit-policy") != fmt.Sprintf(`"%s";q=5;w=86400`, dailyPolicy) {
		t.Fatalf("daily denial %v", resp)
	}
	wait, _ := strconv.Atoi(headerOf(resp, "retry-after"))
	if toMidnight := time.Until(time.Now().UTC().Truncate(24 * time.Hour).Add(24 * time.Hour)); (time.Duration(wait)*time.Second - toMidnight).Abs() > 2*time.Second {
		t.Fatalf("daily denial: retry-after %q, want the %v to midnight UTC", headerOf(resp, "retry-after"), toMidnight)
	}
	// The burst's hit of the daily's denial was given back.
	var burstAllowed, burstDenied, dailyDenied, refunded float64
	for _, r := range replicas {
		burstAllowed += r.metric("extauthz_decisions_total", "policy", burstPolicy, "result", "allowed")
		burstDenied += r.metric("extauthz_decisions_total", "policy", burstPolicy, "result", "denied")
		dailyDenied += r.metric("extauthz_decisions_total", "policy", dailyPolicy, "result", "denied")
		refunded += r.metric("extauthz_decisions_total", "policy", burstPolicy, "result", "refunded")
	}
	if dailyAllowed := allowedDecisions(replicas, dailyPolicy); dailyAllowed < 5 || burstDenied < 1 || dailyDenied != 1 || refunded != 1 || burstAllowed < 6 {
		t.Fatalf("decisions: burst %v allowed, %v denied, %v refunded; daily %v allowed, %v denied", burstAllowed, burstDenied, refunded, dailyAllowed, dailyDenied)
	}
	return burstUser
}

// assertBurstGivenBack reads the burst's count in Redis after the three
// requests made from start, in one second: the two the daily admitted
// count, the third, which the daily denied, was given back (its unit
// refunded; in hybrid mode through the replica's queue of give-backs, so
// the count is read until it settles, within the burst's window). Not
// the refunded counter, which says what the engine asked, not what Redis
// holds.
func assertBurstGivenBack(t *testing.T, rdb *redis.Client, user string, start time.Time) {
	t.Helper()
	window := start.Truncate(time.Second)
	if time.Now().Truncate(time.Second) != window {
		t.Fatalf("the three requests from %v crossed a second: their window's count is gone; run it again", start)
	}
	key := "rl:{rls/api:generic_key=api:user=" + user + "%w1s}:fw"
	var w, c int64
	for time.Now().Before(window.Add(time.Second)) {
		st, err := rdb.HMGet(t.Context(), key, "w", "c").Result()
		if err != nil {
			t.Fatalf("%s: %v", key, err)
		}
		w, _ = strconv.ParseInt(fmt.Sprint(st[0]), 10, 64)
		c, _ = strconv.ParseInt(fmt.Sprint(st[1]), 10, 64)
		if w == window.UnixMicro() && c == 2 {
			return
		}
		time.Sleep(5 * time.Millisecond) // polling Redis for the give-back, bounded by the window's end
	}
	t.Fatalf("%s: window %d counts %d, want window %d counting 2 (the denied request's unit given back)", key, w, c, window.UnixMicro())
}

// assertHalfMinute: unit second × unit_multiplier 30 is a 30-second
// window, aligned to the epoch, which the status and headers state.
func assertHalfMinute(t *testing.T, replicas []*sidecar) {
	req := rateLimitRequest("api", envoyRequest{}, halfLimits)
	// Waiting on real time: the three requests share a window unless one
	// is about to end.
	if left := 30*time.Second - time.Duration(time.Now().UnixNano())%(30*time.Second); left < time.Second {
		time.Sleep(left + 10*time.Millisecond)
	}
	first := replicas[0].shouldRateLimit(req)
	second := replicas[len(replicas)-1].shouldRateLimit(req)
	resp := replicas[0].shouldRateLimit(req)
	if rlsStatus(first) != 200 || rlsStatus(second) != 200 || rlsStatus(resp) != 429 {
		t.Fatalf("answers %d %d %d, want 200 200 429", rlsStatus(first), rlsStatus(second), rlsStatus(resp))
	}
	st := resp.GetStatuses()[0]
	reset := st.GetDurationUntilReset().AsDuration()
	left := 30*time.Second - time.Duration(time.Now().UnixNano())%(30*time.Second)
	if cl := st.GetCurrentLimit(); cl.GetUnit() != rlsv3.RateLimitResponse_RateLimit_SECOND || cl.GetUnitMultiplier().GetValue() != 30 ||
		cl.GetRequestsPerUnit() != 2 || reset > 30*time.Second || reset < left-time.Second || reset > left+time.Second {
		t.Fatalf("status %v; want 2 per 30 seconds, resetting in %v", st, left)
	}
	if got := headerOf(resp, "ratelimit-policy"); got != `"api.half";q=2;w=30` {
		t.Fatalf("ratelimit-policy %q", got)
	}
}
