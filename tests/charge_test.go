package tests

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"os/exec"
	"regexp"
	"strconv"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/redis/go-redis/v9"

	"github.com/extauthz/extauthz/tests/internal/testredis"
)

// Token budgets end to end (charge: always): Envoy's ext_authz filter
// asks Check before each request, which admits while the tenant's budget
// has a unit left and charges nothing; when the response is done, Envoy's
// ratelimit filter (apply_on_stream_done) sends the tokens the response
// reported as the hits_addend of a descriptor that counts in the same
// policy's bucket (rate_limit.policy). A request-time descriptor with
// hits_addend 0 asks the rate limit service the same question Check
// answers.

// budgetPolicy is the docs' example: 100,000 tokens a day per tenant (the
// client its API key names), charged after the response. A fixed window
// keeps the count exact to the unit for the test to read; a token bucket
// charges the same way and refills continuously.
const budgetPolicy = `
clients:
  keys:
    - {id: acme, key: key-acme}
    - {id: globex, key: key-globex}
policies:
  - name: tokens
    key: [client]
    limit: 100000
    window: 24h
    algorithm: fixed_window
    charge: always
`

// budgetDomain counts (tenant=<client id>) in the policy's bucket; Envoy
// reads the client id from ext_authz's dynamic metadata.
const budgetDomain = `
domain: llm
descriptors:
  - key: tenant
    rate_limit: {policy: tokens}
`

// budgetCheck is Envoy's Check for a request of the tenant with key.
func budgetCheck(key string) envoyRequest {
	return envoyRequest{method: "POST", path: "/v1/chat/completions", headers: [][2]string{{"x-api-key", key}}}
}

// budgetCall is what Envoy's ratelimit filter sends for tenant: its
// route's rate_limits entry [metadata ext_authz client → tenant] with
// hits_addend hits (0 on the request path, the response's tokens when
// the stream is done).
func budgetCall(tenant string, hits uint64) *rlsv3.RateLimitRequest {
	return rateLimitRequest("llm", envoyRequest{},
		routeRateLimit{actions: []rlAction{metadataAction("tenant", tenant, "")}, hitsAddend: &hits})
}

// modeFleet is one mode's replicas and the Redis they share (nil in local
// mode).
type modeFleet struct {
	mode     string
	replicas []*sidecar
	rdb      *redis.Client
}

// budgetTotals is what a budgetRun charged and admitted.
type budgetTotals struct {
	requests int   // admitted before the budget was spent, each charged
	charged  int64 // tokens the responses reported, all charged
	lastLeft int64 // tokens left when the last admitted request was charged
}

// budgetRun drives one tenant's requests over each fleet's replicas, every
// step on every fleet alike, so that redis mode is hybrid's oracle in the
// same run: round robin, a Check and a request-time query, both admitted
// while budget is left (the query's remaining count is the budget less
// what was charged, exactly, in every mode), then the response's charge
// of 500–4,000 tokens on the next replica; until the budget is spent.
// Then the replica whose charge spent it charges once more (past the
// budget: never refused), and only then is every OTHER replica asked,
// without charging first: every Check and query is denied, as when one
// replica serves the long responses and the others only ask. Each
// answer is the same in every fleet, status and remaining count.
func budgetRun(t *testing.T, fleets []modeFleet) budgetTotals {
	t.Helper()
	rng := rand.New(rand.NewPCG(3, 1))
	const budget = 100_000
	replicas := len(fleets[0].replicas)
	check := func(k int) (code int, retryAfter int) {
		t.Helper()
		for j, f := range fleets {
			resp := f.replicas[k].check(budgetCheck("key-acme").build())
			c := httpStatus(resp)
			ra, _ := strconv.Atoi(deniedHeaders(resp)["retry-after"])
			if j > 0 && c != code {
				t.Fatalf("replica %d's Check: %s %d, %s %d", k, fleets[0].mode, code, f.mode, c)
			}
			code, retryAfter = c, ra
		}
		return code, retryAfter
	}
	query := func(k int) (code int, left int64) {
		t.Helper()
		for j, f := range fleets {
			q := f.replicas[k].shouldRateLimit(budgetCall("acme", 0))
			c, l := rlsStatus(q), int64(q.GetStatuses()[0].GetLimitRemaining())
			if j > 0 && (c != code || l != left) {
				t.Fatalf("replica %d's query: %s %d (%d left), %s %d (%d left)", k, fleets[0].mode, code, left, f.mode, c, l)
			}
			code, left = c, l
		}
		return code, left
	}
	charge := func(k int, n int64) {
		t.Helper()
		for _, f := range fleets {
			if resp := f.replicas[k].shouldRateLimit(budgetCall("acme", uint64(n))); rlsStatus(resp) != 200 {
				t.Fatalf("%s replica %d: a charge of %d was refused: %v", f.mode, k, n, resp)
			}
		}
	}
	var tot budgetTotals
	spender := 0
	for i := 0; tot.charged < budget; i++ {
		at := func(k int) int { return (i + k) % replicas }
		if code, _ := check(at(0)); code != 200 {
			t.Fatalf("Check %d denied with %d of %d charged", i, tot.charged, budget)
		}
		code, left := query(at(1))
		if code != 200 || left != budget-tot.charged {
			t.Fatalf("query %d: %d, %d remaining after %d charged of %d", i, code, left, tot.charged, budget)
		}
		n := 500 + rng.Int64N(3501)
		tot.lastLeft, spender = budget-tot.charged, at(2)
		charge(spender, n)
		tot.charged += n
		tot.requests++
	}
	if tot.charged == budget {
		t.Fatalf("the seed's charges end exactly on the budget: no debt to test")
	}
	// Past the budget: a response's tokens are still counted, on the
	// replica that spent the budget.
	n := 500 + rng.Int64N(3501)
	charge(spender, n)
	tot.charged += n
	for d := 1; d <= replicas; d++ {
		k := (spender + d) % replicas // the other replicas first, the spender last
		if code, ra := check(k); code != 429 || ra <= 0 {
			t.Fatalf("replica %d: Check with %d of %d charged: %d, Retry-After %d", k, tot.charged, budget, code, ra)
		}
		if code, left := query(k); code != 429 || left != 0 {
			t.Fatalf("replica %d: query with %d of %d charged: %d, %d remaining", k, tot.charged, budget, code, left)
		}
	}
	// Another tenant's budget is its own.
	for _, f := range fleets {
		if code := httpStatus(f.replicas[0].check(budgetCheck("key-globex").build())); code != 200 {
			t.Fatalf("%s: globex's Check: %d", f.mode, code)
		}
	}
	return tot
}

// The docs' figures (docs/token-budgets.md) for the run above, the seed
// fixed: every mode admits the same requests and charges the same tokens.
const (
	budgetRequests = 40
	budgetCharged  = 102_467
	budgetLastLeft = 1_719
)

// Three replicas in redis mode and three in hybrid, at the shipped
// defaults, driven alike in one run: hybrid answers every Check and query
// as redis mode does, before and after the budget is spent, whichever
// replica charged; the Redis count is the sum charged, to the unit, in
// both; hybrid leased nothing (a lease would go on answering questions
// after another replica's charges spent the budget).
func TestTokenBudget(t *testing.T) {
	parallel(t)
	section, _ := domainDir(t, map[string]string{"llm.yaml": budgetDomain})
	var fleets []modeFleet
	for _, mode := range []string{"redis", "hybrid"} {
		srv := testredis.Start(t)
		fleets = append(fleets, modeFleet{mode: mode, rdb: srv.Client(), replicas: startReplicas(t, 3, defaultsConfig(srv.Addr, mode, budgetPolicy+section))})
	}
	before := redisNow(t, fleets[0].rdb)
	tot := budgetRun(t, fleets)
	if after := redisNow(t, fleets[0].rdb); before.Truncate(24*time.Hour) != after.Truncate(24*time.Hour) {
		t.Fatalf("the run crossed midnight UTC (%v): the window turned; run it again", after)
	}
	for _, f := range fleets {
		if held := budgetCount(t, f.rdb, "acme"); held != tot.charged {
			t.Fatalf("%s: Redis counts %d tokens, the responses reported %d", f.mode, held, tot.charged)
		}
		// One call answered per decision, in either mode: each request's
		// Check, query and charge, the charge past the end, a Check and a
		// query per replica after it, and globex's Check. (A call that
		// timed out and was asked again counts once: its answer.)
		var calls float64
		for _, r := range f.replicas {
			calls += r.metric("extauthz_redis_calls_total", "op", "fixed_window", "result", "ok")
		}
		if decisions := 3*tot.requests + 1 + 2*len(f.replicas) + 1; int(calls) != decisions {
			t.Fatalf("%s: %v Redis calls answered for %d decisions", f.mode, calls, decisions)
		}
		t.Logf("%s: %d Redis calls for the run's %d requests, one per decision", f.mode, int(calls), tot.requests)
		assertNotDegraded(t, f.replicas)
	}
	for i, r := range fleets[1].replicas {
		if leased := r.metric("extauthz_hybrid_tokens_leased_total"); leased != 0 {
			t.Fatalf("hybrid replica %d leased %v tokens of a budget", i, leased)
		}
	}
	if tot != (budgetTotals{budgetRequests, budgetCharged, budgetLastLeft}) {
		t.Fatalf("%+v; the docs say %d requests admitted, %d tokens charged, the last admitted with %d left", tot, budgetRequests, budgetCharged, budgetLastLeft)
	}
	t.Logf("%d requests admitted, the last with %d tokens left; %d tokens charged, counted by Redis in both modes", tot.requests, tot.lastLeft, tot.charged)
}

// budgetCount is the tokens Redis counts for tenant under the policy: the
// fixed window's count, in the key both doors use.
func budgetCount(t *testing.T, rdb *redis.Client, tenant string) int64 {
	t.Helper()
	key := fmt.Sprintf("rl:{tokens:client:%s}:fw", tenant)
	v, err := rdb.HGet(context.Background(), key, "c").Int64()
	if err != nil {
		t.Fatalf("%s: %v", key, err)
	}
	return v
}

// Local mode, one replica: each query's remaining count is the budget less
// what was charged, exactly, and the budget stops admissions as in the
// Redis modes.
func TestTokenBudgetLocal(t *testing.T) {
	parallel(t)
	section, _ := domainDir(t, map[string]string{"llm.yaml": budgetDomain})
	s := startSidecar(t, "default_mode: local\n"+budgetPolicy+section)
	if tot := budgetRun(t, []modeFleet{{mode: "local", replicas: []*sidecar{s}}}); tot != (budgetTotals{budgetRequests, budgetCharged, budgetLastLeft}) {
		t.Fatalf("%+v; the docs say %d requests admitted, %d tokens charged, the last admitted with %d left", tot, budgetRequests, budgetCharged, budgetLastLeft)
	}
}

// A stream-done call with a descriptor over the limit is denied, and its
// charge is counted all the same, before the denying descriptor or after
// it (the engine stops asking at a denial, then makes the charges left
// unasked): a charge is never refunded nor skipped. In local mode and in
// hybrid (one exact call per charge: docs/token-budgets.md), where Redis
// holds the count.
func TestTokenBudgetChargeBesideADenial(t *testing.T) {
	parallel(t)
	section, _ := domainDir(t, map[string]string{"llm.yaml": budgetDomain + `
  - key: model
    rate_limit: {unit: minute, requests_per_unit: 0}
`})
	srv := testredis.Start(t)
	for _, mode := range []string{"local", "hybrid"} {
		t.Run(mode, func(t *testing.T) {
			s := startSidecar(t, defaultsConfig(srv.Addr, mode, budgetPolicy+section))
			model := rateLimitRequest("llm", envoyRequest{}, actions(genericKey("model", "large"))).Descriptors
			var charged int64
			for _, order := range []string{"before", "after"} {
				t.Run("charge "+order+" the denial", func(t *testing.T) {
					tenant := "acme"
					if mode == "hybrid" {
						tenant = "globex" // a Redis count of its own, left by local mode untouched
					}
					call := budgetCall(tenant, 3000)
					if order == "before" {
						call.Descriptors = append(call.Descriptors, model...)
					} else {
						call.Descriptors = append(model, call.Descriptors...)
					}
					if resp := s.shouldRateLimit(call); rlsStatus(resp) != 429 {
						t.Fatalf("the call with a descriptor over the limit: %v", resp)
					}
					charged += 3000
					q := s.shouldRateLimit(budgetCall(tenant, 0))
					if left := int64(q.GetStatuses()[0].GetLimitRemaining()); rlsStatus(q) != 200 || left != 100_000-charged {
						t.Fatalf("after the denied call: %d remaining, want %d charged: %v", left, charged, q)
					}
					if mode == "hybrid" {
						if held := budgetCount(t, srv.Client(), tenant); held != charged {
							t.Fatalf("Redis counts %d tokens, the calls charged %d", held, charged)
						}
					}
				})
			}
		})
	}
}

// extauthz validate prints the policy's charge and the descriptor that
// counts in its bucket.
func TestTokenBudgetValidateSummary(t *testing.T) {
	parallel(t)
	section, _ := domainDir(t, map[string]string{"llm.yaml": budgetDomain})
	path := writeConfig(t, "default_mode: local\n"+budgetPolicy+section)
	out, err := exec.Command(binary, "validate", "-config", path).CombinedOutput()
	if err != nil {
		t.Fatalf("validate: %v\n%s", err, out)
	}
	for _, want := range []*regexp.Regexp{
		regexp.MustCompile(`(?m)^tokens\s+every request\s+client\s+100000/24h0m0s\s+fixed_window\s+local\s+charge=always$`),
		regexp.MustCompile(`(?m)^llm\s+tenant\s+policy tokens\s+fixed_window\s+local\s+charge=always$`),
	} {
		if !want.Match(out) {
			t.Errorf("validate's summary lacks %s:\n%s", want, out)
		}
	}
}

// budgetPolicyOn is the docs' example on algorithm: 100,000 tokens a
// day per tenant, charged after the response.
func budgetPolicyOn(algorithm string) string {
	return `
clients:
  keys:
    - {id: acme, key: key-acme}
policies:
  - name: tokens
    key: [client]
    limit: 100000
    window: 24h
    algorithm: ` + algorithm + `
    charge: always
`
}

// A token budget through a Redis outage, three replicas in redis mode and
// three in hybrid, at the shipped defaults (on_redis_error: fallback),
// driven alike, on a token bucket and on a fixed window. Redis is frozen
// (it keeps its state, as a partition or a stalled server does) with
// 60,000 tokens left, which each replica last saw. While it is down each
// replica answers from its own share, a third of the 60,000: replica 0's
// charges of 25,000 put its share in debt and it denies, while replicas 1
// and 2, charged nothing, admit (a replica's share is spent only by the
// charges it receives); replica 1's charges of 150,000 then put it in
// debt too, and replica 2 admits all the same. When Redis answers again
// each replica charges what its fallback counted with its next call:
// replica 0's 25,000 to the unit (35,000 left; a bucket's plus what
// refilled over the run), then replica 1's 150,000: a window counts them
// all (215,000 charged), a bucket goes down to one capacity below empty
// and no further (docs/token-budgets.md: 15,000 are forgiven); and every
// replica denies.
func TestTokenBudgetThroughAnOutage(t *testing.T) {
	parallel(t)
	for _, algorithm := range []string{"token_bucket", "fixed_window"} {
		t.Run(algorithm, func(t *testing.T) { testBudgetThroughAnOutage(t, algorithm) })
	}
}

func testBudgetThroughAnOutage(t *testing.T, algorithm string) {
	section, _ := domainDir(t, map[string]string{"llm.yaml": budgetDomain})
	type modeRedis struct {
		modeFleet
		srv *testredis.Server
	}
	var fleets []modeRedis
	for _, mode := range []string{"redis", "hybrid"} {
		srv := testredis.Start(t)
		fleets = append(fleets, modeRedis{modeFleet{mode: mode, rdb: srv.Client(), replicas: startReplicas(t, 3, defaultsConfig(srv.Addr, mode, budgetPolicyOn(algorithm)+section))}, srv})
	}
	const budget = 100_000
	rate := 0.0 // tokens a second refilled: a window refills nothing
	if algorithm == "token_bucket" {
		rate = 100_000.0 / 86_400
	}
	start := time.Now()
	before := redisNow(t, fleets[0].rdb)
	// refilled bounds what the bucket refilled since the run began, from
	// the run's measured length, rounded up.
	refilled := func() int64 { return int64(math.Ceil(time.Since(start).Seconds() * rate)) }
	// ask has replica k of every fleet answer a query (without charging)
	// and returns the statuses and the remaining counts.
	ask := func(k int) (codes []int, left []int64) {
		t.Helper()
		for _, f := range fleets {
			q := f.replicas[k].shouldRateLimit(budgetCall("acme", 0))
			codes = append(codes, rlsStatus(q))
			left = append(left, int64(q.GetStatuses()[0].GetLimitRemaining()))
		}
		return codes, left
	}
	charge := func(k int, n uint64, times int) {
		t.Helper()
		for _, f := range fleets {
			for range times {
				if resp := f.replicas[k].shouldRateLimit(budgetCall("acme", n)); rlsStatus(resp) != 200 {
					t.Fatalf("%s replica %d: a charge of %d was refused: %v", f.mode, k, n, resp)
				}
			}
		}
	}
	want := func(what string, k int, code int, lo, hi int64) {
		t.Helper()
		codes, left := ask(k)
		for i, f := range fleets {
			if codes[i] != code || left[i] < lo || left[i] > hi {
				t.Fatalf("%s, %s replica %d: %d with %d left, want %d with %d–%d left (%v decisions degraded so far)",
					what, f.mode, k, codes[i], left[i], code, lo, hi, f.replicas[k].metric("extauthz_degraded_decisions_total"))
			}
		}
	}

	// Each share is a third once every replica has heard the other two.
	for _, f := range fleets {
		for _, r := range f.replicas {
			waitMetric(t, r, 5*time.Second, 3, "extauthz_peers")
		}
	}
	charge(0, 40_000, 1)
	for k := range 3 {
		want("before the outage", k, 200, budget-40_000, budget-40_000+refilled())
	}
	// Every decision so far was Redis's: the shares below are a third of
	// what it reported.
	for _, f := range fleets {
		assertNotDegraded(t, f.replicas)
	}
	for _, f := range fleets {
		f.srv.Freeze()
	}
	thawed := false
	defer func() {
		if !thawed {
			for _, f := range fleets {
				f.srv.Thaw()
			}
		}
	}()
	// Each replica's first question waits for its breaker to open (a
	// question spends nothing, so one Redis runs once thawed costs
	// nothing); from then on no call reaches Redis.
	for k := range 3 {
		ask(k)
		for _, f := range fleets {
			f.replicas[k].markedDown(5 * time.Second)
		}
	}
	// A third of the 60,000 each, less the unit this question asks.
	share := int64(budget-40_000) / 3
	for k := range 3 {
		want("in the outage", k, 200, share-1, share+refilled())
	}
	charge(0, 5_000, 5)
	want("replica 0 charged 25,000 in the outage", 0, 429, 0, 0)
	want("replica 0 charged 25,000 in the outage", 1, 200, share-1, share+refilled())
	want("replica 0 charged 25,000 in the outage", 2, 200, share-1, share+refilled())
	charge(1, 5_000, 30)
	want("replica 1 charged 150,000 in the outage", 1, 429, 0, 0)
	want("replica 1 charged 150,000 in the outage", 2, 200, share-1, share+refilled())

	for _, f := range fleets {
		f.srv.Thaw()
	}
	thawed = true
	for _, f := range fleets {
		for _, r := range f.replicas {
			waitMetric(t, r, 5*time.Second, 1, "extauthz_redis_up")
		}
	}
	if algorithm == "token_bucket" {
		// A token bucket's debts reach Redis as each replica's breaker
		// closes, before its first decision there (Store.chargeDebts):
		// replica 0's 25,000 and replica 1's 150,000 are both in by now,
		// the bucket one capacity below empty, so replica 0 denies too.
		want("after the outage, the debts charged as the breakers closed", 0, 429, 0, 0)
	} else {
		// A window's debts reach Redis with the key's next call on each
		// replica: replica 0's 25,000, to the unit.
		want("after the outage, replica 0's charges", 0, 200, budget-65_000, budget-65_000+refilled())
	}
	want("after the outage, replica 1's charges", 1, 429, 0, 0)
	for _, f := range fleets {
		if algorithm == "fixed_window" {
			if after := redisNow(t, f.rdb); before.Truncate(24*time.Hour) != after.Truncate(24*time.Hour) {
				t.Fatalf("the run crossed midnight UTC (%v): the window turned; run it again", after)
			}
			if held := budgetCount(t, f.rdb, "acme"); held != 215_000 {
				t.Fatalf("%s: the window counts %d, want every token charged: 215,000", f.mode, held)
			}
			continue
		}
		used, err := f.rdb.HGet(t.Context(), "rl:{tokens:client:acme}", "used").Float64()
		if err != nil || used != 2*budget {
			t.Fatalf("%s: the bucket uses %v (%v), want one capacity below empty: %d", f.mode, used, err, 2*budget)
		}
	}
	for k := range 3 {
		want("after the outage", k, 429, 0, 0)
		for _, f := range fleets {
			if code := httpStatus(f.replicas[k].check(budgetCheck("key-acme").build())); code != 429 {
				t.Fatalf("%s replica %d: Check after the outage's charges: %d", f.mode, k, code)
			}
		}
	}
}
