package tests

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"

	"github.com/extauthz/extauthz/internal/counters"
	"github.com/extauthz/extauthz/tests/internal/testredis"
)

// adminToken is the counters API's bearer token in these tests.
const adminToken = "e2e-admin-token"

// countersPolicies gives each mode a token bucket of 10 an hour per
// client: one token every 6 minutes, so a key drained in a test stays
// drained however slowly the test runs (at 10 a minute, a subtest slowed
// past 6s by a loaded machine saw bob's bucket refill and ada admitted
// one more), and hybrid replicas cache their denial for minutes, which
// the reset must clear.
const countersPolicies = `
clients:
  keys: [{id: ada, key: key-ada}, {id: bob, key: key-bob}]
policies:
  - {name: local, match: {path_prefix: /local}, key: [client], limit: 10, window: 1h, mode: local}
  - {name: redis, match: {path_prefix: /redis}, key: [client], limit: 10, window: 1h, mode: redis}
  - {name: hybrid, match: {path_prefix: /hybrid}, key: [client], limit: 10, window: 1h, mode: hybrid}
`

// countersCLI runs `extauthz counters ARGS...` against replica s with the
// token in the environment, and decodes its -json answer into out.
func countersCLI(t *testing.T, s *sidecar, out any, args ...string) {
	t.Helper()
	all := append([]string{"counters", args[0], "-admin", s.Admin, "-json"}, args[1:]...)
	cmd := exec.Command(binary, all...)
	cmd.Env = append(os.Environ(), counters.TokenEnv+"="+adminToken)
	b, err := cmd.Output()
	if err != nil {
		var stderr string
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = string(ee.Stderr)
		}
		t.Fatalf("extauthz %v: %v\n%s", all, err, stderr)
	}
	if err := json.Unmarshal(b, out); err != nil {
		t.Fatalf("extauthz %v printed %q: %v", all, b, err)
	}
}

// Through the real binary and a real Redis, three replicas, in each mode:
// the counters API reads a drained key's count where it lives, lists the
// policy's keys by recent use, and resets the key through one replica;
// every replica then admits the whole limit again. In redis mode the
// count lives in Redis alone; in hybrid mode the other replicas drop the
// denial they cached (which would hold for up to 6s); in local mode each
// replica's own count is reset too.
func TestCountersAPIResetReachesEveryReplica(t *testing.T) {
	parallel(t)
	srv := testredis.Start(t)
	cfg := writeConfig(t, defaultsConfig(srv.Addr, "hybrid", countersPolicies))
	var replicas []*sidecar
	for i := 0; i < 3; i++ {
		replicas = append(replicas, startSidecarFile(t, cfg, []string{counters.TokenEnv + "=" + adminToken}))
	}
	// No wait for the replicas to count each other: a reset reaches
	// every replica whatever peer count each has seen.
	api := &counters.Client{Admin: replicas[0].Admin, Token: adminToken}
	ctx := context.Background()
	req := func(mode, key string) func(int) *authv3.CheckRequest {
		return func(int) *authv3.CheckRequest {
			return envoyRequest{method: "POST", path: "/" + mode, headers: [][2]string{{"x-api-key", key}}}.build()
		}
	}
	for _, mode := range []string{"local", "redis", "hybrid"} {
		t.Run(mode, func(t *testing.T) {
			// Drain ada's bucket on every replica (local mode: each has
			// its own), one request at a time, round robin: 10 per replica
			// in local mode, 10 in all otherwise. Bob asks a little.
			want := 10
			if mode == "local" {
				want = 30
			}
			assertFirstAdmitted(t, drive(t, replicas, 45, 1, req(mode, "key-ada")), want)
			drive(t, replicas, 3, 1, req(mode, "key-bob"))

			c, err := api.Get(ctx, mode, "client:ada", "")
			if err != nil {
				t.Fatal(err)
			}
			if c.Allowed || c.Remaining != 0 || c.Limit != 10 || c.Mode != mode || c.Rate <= 0 {
				t.Fatalf("get = %+v, want a drained count of 10 and some recent use", c)
			}
			wantKey := fmt.Sprintf("rl:{%s:client:ada}", mode)
			switch {
			case mode == "local" && c.Where != "local":
				t.Fatalf("local mode's count lives %q", c.Where)
			case mode != "local" && (c.Where != "redis" || len(c.RedisKeys) != 1 || c.RedisKeys[0] != wantKey):
				t.Fatalf("%s mode's count lives %q %v, want redis %s", mode, c.Where, c.RedisKeys, wantKey)
			}

			var top counters.Top
			countersCLI(t, replicas[0], &top, "top", mode)
			if len(top.Keys) != 2 || top.Keys[0].Key != "client:ada" || top.Keys[1].Key != "client:bob" || top.Keys[0].Rate <= top.Keys[1].Rate {
				t.Fatalf("top = %+v, want ada then bob", top.Keys)
			}

			var reset counters.Reset
			countersCLI(t, replicas[0], &reset, "reset", mode, "client:ada")
			if !reset.Broadcast {
				t.Fatalf("reset = %+v, want it announced", reset)
			}
			// The others apply it when the announcement arrives.
			for _, r := range replicas[1:] {
				waitMetric(t, r, 10*time.Second, resetsBefore(mode)+1, "extauthz_counter_resets_total", "origin", "replica")
			}
			if mode != "local" {
				if n := srv.Client().Exists(ctx, wantKey).Val(); n != 0 {
					t.Fatalf("%s still exists after the reset", wantKey)
				}
			}
			// Every replica admits again at once: the requests admitted
			// are the first ones, whichever replica they reached (a
			// replica still holding a cached denial or its own drained
			// count would refuse its share of them).
			assertFirstAdmitted(t, drive(t, replicas, 45, 1, req(mode, "key-ada")), want)
			// Bob's count was not touched.
			if c, err := api.Get(ctx, mode, "client:bob", ""); err != nil || c.Remaining >= 10 {
				t.Fatalf("bob after ada's reset: %+v %v", c, err)
			}
		})
	}
	assertNoFallback(t, replicas)
}

// blockedPolicies are countersPolicies with a 10-minute penalty box: a
// drained key is blocked far longer than the test runs.
const blockedPolicies = `
clients:
  keys: [{id: ada, key: key-ada}]
policies:
  - {name: local, match: {path_prefix: /local}, key: [client], limit: 10, window: 1m, mode: local, block_for: 10m}
  - {name: redis, match: {path_prefix: /redis}, key: [client], limit: 10, window: 1m, mode: redis, block_for: 10m}
  - {name: hybrid, match: {path_prefix: /hybrid}, key: [client], limit: 10, window: 1m, mode: hybrid, block_for: 10m}
`

// The counters API's reset of a key ends its block with its count
// (docs/algorithms.md, "Penalty box"), on every replica, in each mode: a
// key drained into a 10-minute block is admitted its whole limit again at
// once after a reset through one replica, where without the reset every
// request would be denied for the next ten minutes.
func TestCountersAPIResetEndsABlock(t *testing.T) {
	parallel(t)
	srv := testredis.Start(t)
	cfg := writeConfig(t, defaultsConfig(srv.Addr, "hybrid", blockedPolicies))
	var replicas []*sidecar
	for i := 0; i < 3; i++ {
		replicas = append(replicas, startSidecarFile(t, cfg, []string{counters.TokenEnv + "=" + adminToken}))
	}
	for _, mode := range []string{"local", "redis", "hybrid"} {
		t.Run(mode, func(t *testing.T) {
			req := func(int) *authv3.CheckRequest {
				return envoyRequest{method: "POST", path: "/" + mode, headers: [][2]string{{"x-api-key", "key-ada"}}}.build()
			}
			want := 10 // local mode: each replica's own bucket and block
			if mode == "local" {
				want = 30
			}
			results := drive(t, replicas, 45, 1, req)
			assertFirstAdmitted(t, results, want)
			// The denials are the block's (10 minutes), not the bucket's
			// (a token every 6 s).
			for _, r := range results[want:] {
				if retry, _ := strconv.Atoi(deniedHeaders(r.resp)["retry-after"]); retry < 590 {
					t.Fatalf("a denial after the limit: Retry-After %d, want the 10-minute block's", retry)
				}
			}
			var reset counters.Reset
			countersCLI(t, replicas[0], &reset, "reset", mode, "client:ada")
			if !reset.Broadcast {
				t.Fatalf("reset = %+v, want it announced", reset)
			}
			for _, r := range replicas[1:] {
				waitMetric(t, r, 10*time.Second, resetsBefore(mode)+1, "extauthz_counter_resets_total", "origin", "replica")
			}
			// Every replica admits the whole limit again at once: the
			// block ended with the count.
			assertFirstAdmitted(t, drive(t, replicas, 45, 1, req), want)
		})
	}
	assertNoFallback(t, replicas)
}

// assertFirstAdmitted checks that the first n requests of a sequential
// run were allowed and the others denied.
func assertFirstAdmitted(t *testing.T, results []result, n int) {
	t.Helper()
	var got strings.Builder
	ok := true
	for i, r := range results {
		status := httpStatus(r.resp)
		got.WriteString(map[int]string{200: "+", 429: "-"}[status])
		if (i < n) != (status == 200) {
			ok = false
		}
	}
	if !ok {
		t.Fatalf("allowed (+) and denied (-) in request order, round robin over the replicas: %s; want the first %d allowed", got.String(), n)
	}
}

// resetsBefore is the number of resets the replicas applied before the
// named mode's subtest: one per mode, in the order the test runs them.
func resetsBefore(mode string) float64 {
	return map[string]float64{"local": 0, "redis": 1, "hybrid": 2}[mode]
}

// The counters API asks for the token before anything, and is off
// without one.
func TestCountersAPIAuthorization(t *testing.T) {
	parallel(t)
	withToken := startSidecarFile(t, writeConfig(t, ordersFor("limit: 5, window: 1m")), []string{counters.TokenEnv + "=" + adminToken})
	without := startSidecar(t, ordersFor("limit: 5, window: 1m"))
	ctx := context.Background()
	for _, tc := range []struct {
		s      *sidecar
		token  string
		status int
	}{
		{withToken, "", 401},
		{withToken, "wrong", 401},
		{withToken, adminToken + "x", 401},
		{without, "", 403},
		{without, adminToken, 403},
	} {
		c := &counters.Client{Admin: tc.s.Admin, Token: tc.token}
		_, err := c.Reset(ctx, "orders", "client:ada")
		if e, ok := err.(*counters.Error); !ok || e.Status != tc.status {
			t.Fatalf("token %q: %v, want %d", tc.token, err, tc.status)
		}
	}
	if strings.Contains(withToken.logs.String(), adminToken) {
		t.Fatal("the token is in the log")
	}
}
