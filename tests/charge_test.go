package tests

import (
	"context"
	"fmt"
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

// budgetRun drives one tenant's requests over replicas, round robin: a
// Check and a request-time query, both admitted while budget is left
// (the query's remaining count, when exact, is the budget less what was
// charged), then the response's charge of 500–4,000 tokens on another
// replica; until the budget is spent. Then each replica takes one more
// charge (past the budget: never refused), and every Check and query
// after is denied. It returns the units charged.
//
// In hybrid mode (exact false) the last of the budget may be held in
// other replicas' leases, which only their holders spend: a question may
// then be denied a little before the budget is spent, by at most what
// leases hold (a quarter of the budget over the replicas, at most).
func budgetRun(t *testing.T, replicas []*sidecar, exact bool) int64 {
	t.Helper()
	rng := rand.New(rand.NewPCG(3, 1))
	const budget = 100_000
	var charged int64
	var requests int
	denied := func(what string, i int, ok bool) bool {
		t.Helper()
		switch {
		case ok:
			return false
		case exact || charged < budget*3/4:
			t.Fatalf("%s %d denied with %d of %d charged", what, i, charged, budget)
		}
		t.Logf("%s %d denied with %d of %d charged: the rest is leased by other replicas", what, i, charged, budget)
		return true
	}
loop:
	for i := 0; charged < budget; i++ {
		at := func(k int) *sidecar { return replicas[(i+k)%len(replicas)] }
		if denied("Check", i, httpStatus(at(0).check(budgetCheck("key-acme").build())) == 200) {
			break loop
		}
		q := at(1).shouldRateLimit(budgetCall("acme", 0))
		if denied("query", i, rlsStatus(q) == 200) {
			break loop
		}
		if left := int64(q.GetStatuses()[0].GetLimitRemaining()); exact && left != budget-charged {
			t.Fatalf("query %d: %d remaining after %d charged of %d", i, left, charged, budget)
		}
		n := 500 + rng.Int64N(3501)
		if resp := at(2).shouldRateLimit(budgetCall("acme", uint64(n))); rlsStatus(resp) != 200 {
			t.Fatalf("a charge of %d with %d charged: %v", n, charged, resp)
		}
		charged += n
		requests++
	}
	for i, r := range replicas {
		// Past the budget: a response's tokens are still counted.
		n := 500 + rng.Int64N(3501)
		if resp := r.shouldRateLimit(budgetCall("acme", uint64(n))); rlsStatus(resp) != 200 {
			t.Fatalf("replica %d: a charge of %d in debt was refused: %v", i, n, resp)
		}
		charged += n
	}
	for i, r := range replicas {
		resp := r.check(budgetCheck("key-acme").build())
		if code := httpStatus(resp); code != 429 {
			t.Fatalf("replica %d: Check with %d of %d charged: %d", i, charged, budget, code)
		}
		if ra, _ := strconv.Atoi(deniedHeaders(resp)["retry-after"]); ra <= 0 {
			t.Fatalf("replica %d: denial without a Retry-After: %v", i, deniedHeaders(resp))
		}
		if q := r.shouldRateLimit(budgetCall("acme", 0)); rlsStatus(q) != 429 {
			t.Fatalf("replica %d: query with %d of %d charged: %v", i, charged, budget, q)
		}
	}
	// Another tenant's budget is its own.
	if code := httpStatus(replicas[0].check(budgetCheck("key-globex").build())); code != 200 {
		t.Fatalf("globex's Check: %d", code)
	}
	t.Logf("%d requests admitted; %d tokens charged", requests, charged)
	return charged
}

// Three replicas in redis and hybrid mode at the shipped defaults: the
// Redis count is the sum charged, to the unit, and admission stops once
// the budget is spent, through either door.
func TestTokenBudget(t *testing.T) {
	parallel(t)
	for _, mode := range []string{"redis", "hybrid"} {
		t.Run(mode, func(t *testing.T) {
			srv := testredis.Start(t)
			rdb := srv.Client()
			section, _ := domainDir(t, map[string]string{"llm.yaml": budgetDomain})
			replicas := startReplicas(t, 3, defaultsConfig(srv.Addr, mode, budgetPolicy+section))
			for attempt := 0; ; attempt++ {
				before := redisNow(t, rdb)
				charged := budgetRun(t, replicas, mode == "redis")
				if after := redisNow(t, rdb); before.Truncate(24*time.Hour) != after.Truncate(24*time.Hour) && attempt == 0 {
					t.Fatalf("the run crossed midnight UTC (%v): the window turned; run it again", after)
				}
				if held := budgetCount(t, rdb, "acme"); held != charged {
					t.Fatalf("Redis counts %d tokens, the responses reported %d", held, charged)
				}
				t.Logf("%s: Redis counts %d tokens charged, as reported", mode, charged)
				break
			}
			assertNotDegraded(t, replicas)
		})
	}
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
	budgetRun(t, []*sidecar{s}, true)
}

// A stream-done call whose other descriptor is over the limit is denied,
// and its charge is counted all the same: a charge is never refunded.
func TestTokenBudgetChargeBesideADenial(t *testing.T) {
	parallel(t)
	section, _ := domainDir(t, map[string]string{"llm.yaml": budgetDomain + `
  - key: model
    rate_limit: {unit: minute, requests_per_unit: 0}
`})
	s := startSidecar(t, "default_mode: local\n"+budgetPolicy+section)
	call := budgetCall("acme", 3000)
	call.Descriptors = append(call.Descriptors, rateLimitRequest("llm", envoyRequest{}, actions(genericKey("model", "large"))).Descriptors...)
	if resp := s.shouldRateLimit(call); rlsStatus(resp) != 429 {
		t.Fatalf("the call with a descriptor over the limit: %v", resp)
	}
	q := s.shouldRateLimit(budgetCall("acme", 0))
	if left := q.GetStatuses()[0].GetLimitRemaining(); rlsStatus(q) != 200 || left != 100_000-3000 {
		t.Fatalf("after the denied call: %d remaining, want %d charged: %v", left, 3000, q)
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
