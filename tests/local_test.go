package tests

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os/exec"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"google.golang.org/grpc/codes"
)

const seedPolicy = `
clients:
  keys:
    - {id: ada, key: key-ada}
policies:
  - name: orders
    match: {path_prefix: /orders}
    key: [client]
    limit: 100
    window: 1m
`

func adaOrder(int) *authv3.CheckRequest {
	return envoyRequest{method: "POST", path: "/orders?page=1", headers: [][2]string{{"x-api-key", "key-ada"}}}.build()
}

// The seed scenario on one replica: exactly 100 of 600 parallel requests.
func TestLocalOneReplicaAdmitsExactly100(t *testing.T) {
	parallel(t)
	s := startSidecar(t, "default_mode: local\n"+seedPolicy)
	results, elapsed := timedDrive(t, []*sidecar{s}, 600, 32, adaOrder)
	counts := tally(t, results)
	if counts[200]+counts[429] != 600 {
		t.Fatalf("statuses = %v, want only 200 and 429", counts)
	}
	assertAdmitted(t, counts[200], 100, 100, time.Minute, elapsed, 1)
	for _, r := range results {
		if httpStatus(r.resp) != 429 {
			if h := okHeaders(r.resp); h["ratelimit-policy"] != `"orders";q=100;w=60` || !strings.HasPrefix(h["ratelimit"], `"orders";r=`) {
				t.Fatalf("allow headers = %v", h)
			}
			continue
		}
		if codes.Code(r.resp.GetStatus().GetCode()) != codes.ResourceExhausted {
			t.Fatalf("429 with grpc status %v", r.resp.GetStatus())
		}
		h := deniedHeaders(r.resp)
		// The next token is 600ms away: Retry-After rounds up to 1.
		if h["retry-after"] != "1" || h["ratelimit-policy"] != `"orders";q=100;w=60` ||
			h["ratelimit"] != `"orders";r=0;t=1` || h["content-type"] != "application/problem+json" {
			t.Fatalf("429 headers = %v", h)
		}
		var body map[string]any
		if err := json.Unmarshal([]byte(r.resp.GetDeniedResponse().GetBody()), &body); err != nil {
			t.Fatal(err)
		}
		if body["type"] != "https://iana.org/assignments/http-problem-types#quota-exceeded" || body["title"] != "Too Many Requests" ||
			body["status"] != 429.0 || body["detail"] != "Retry after 1 s." || fmt.Sprint(body["violated-policies"]) != "[orders]" {
			t.Fatalf("429 body = %s", r.resp.GetDeniedResponse().GetBody())
		}
	}
	if got := s.metric("extauthz_decisions_total", "policy", "orders", "result", "allowed"); got != float64(counts[200]) {
		t.Fatalf("metrics count %v allowed, responses %d", got, counts[200])
	}
}

// Three replicas counting alone admit three times the limit: the weakness
// of local mode, shown on purpose.
func TestLocalThreeReplicasAdmit300(t *testing.T) {
	parallel(t)
	var replicas []*sidecar
	for i := 0; i < 3; i++ {
		replicas = append(replicas, startSidecar(t, "default_mode: local\n"+seedPolicy))
	}
	results, elapsed := timedDrive(t, replicas, 600, 32, adaOrder)
	counts := tally(t, results)
	assertAdmitted(t, counts[200], 300, 100, time.Minute, elapsed, 3)
	perReplica := map[int]int{}
	for _, r := range results {
		if httpStatus(r.resp) == 200 {
			perReplica[r.replica]++
		}
	}
	for i := 0; i < 3; i++ {
		assertAdmitted(t, perReplica[i], 100, 100, time.Minute, elapsed, 1)
	}
}

func TestUnknownAPIKeysAre401AndLeaveNoState(t *testing.T) {
	parallel(t)
	s := startSidecar(t, seedPolicy+"  - {name: everyone, key: [ip], limit: 1000000, window: 1s}\n")
	before := s.metric("extauthz_cache_entries")
	var seq atomic.Uint64
	results := drive(t, []*sidecar{s}, 10_000, 32, func(i int) *authv3.CheckRequest {
		key := fmt.Sprintf("k-%d-%d", seq.Add(1), rand.Uint64())
		if i%2 == 0 {
			return envoyRequest{path: "/orders", headers: [][2]string{{"x-api-key", key}}}.build()
		}
		return envoyRequest{path: "/orders", headers: [][2]string{{"authorization", "Bearer " + key}}}.build()
	})
	counts := tally(t, results)
	if counts[401] != 10_000 {
		t.Fatalf("statuses = %v, want 10000 × 401", counts)
	}
	h := deniedHeaders(results[0].resp)
	if h["www-authenticate"] != "ApiKey" || h["content-type"] != "application/problem+json" {
		t.Fatalf("401 headers = %v", h)
	}
	if after := s.metric("extauthz_cache_entries"); after != before {
		t.Fatalf("cache entries went from %v to %v: unknown keys created state", before, after)
	}
	if got := s.metric("extauthz_checks_total", "outcome", "unauthorized"); got != 10_000 {
		t.Fatalf("unauthorized checks = %v", got)
	}
}

// The cache bound under a flood of distinct client IPs (100,000 against
// max_keys 10000) is tested at half a million in hostile_test.go:
// TestDistinctIPsKeepCacheAtItsBound.

func TestMalformedAndEmptyRequests(t *testing.T) {
	parallel(t)
	s := startSidecar(t, `
clients:
  keys: [{id: ada, key: key-ada}]
policies:
  - {name: everyone, limit: 1000, window: 1m}
  - {name: strict, match: {path_prefix: /strict}, key: [client], limit: 10, window: 1m, on_missing_key: reject}
`)
	for name, req := range map[string]*authv3.CheckRequest{
		"empty request":      {},
		"no http attributes": {Attributes: &authv3.AttributeContext{Request: &authv3.AttributeContext_Request{}}},
		"empty http":         {Attributes: &authv3.AttributeContext{Request: &authv3.AttributeContext_Request{Http: &authv3.AttributeContext_HttpRequest{}}}},
		"no source address":  {Attributes: &authv3.AttributeContext{Source: &authv3.AttributeContext_Peer{}}},
		"garbage path":       envoyRequest{path: "\x00%%%/../\u00ff", headers: [][2]string{{"x-forwarded-for", "not, an, ip"}}}.build(),
		// Header bytes that are not UTF-8 arrive as raw_value in
		// header_map (Envoy's encode_raw_headers): proto strings would
		// not carry them.
		"raw header bytes": {Attributes: &authv3.AttributeContext{Request: &authv3.AttributeContext_Request{Http: &authv3.AttributeContext_HttpRequest{
			HeaderMap: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{
				{Key: ":path", RawValue: []byte("/\xff\xfe")},
				{Key: "x-junk", RawValue: []byte("\xff\x00")},
			}}}}}},
		"huge header value":   envoyRequest{headers: [][2]string{{"x-junk", strings.Repeat("a", 64<<10)}}}.build(),
		"empty api key value": envoyRequest{headers: [][2]string{{"x-api-key", ""}}}.build(),
	} {
		resp := s.check(req)
		if httpStatus(resp) != 200 {
			t.Fatalf("%s: status %d, want an allow by policy everyone", name, httpStatus(resp))
		}
	}
	// The strict policy denies a caller without a client identity clearly.
	resp := s.check(&authv3.CheckRequest{Attributes: &authv3.AttributeContext{Request: &authv3.AttributeContext_Request{
		Http: &authv3.AttributeContext_HttpRequest{Path: "/strict"}}}})
	if httpStatus(resp) != 401 || !strings.Contains(resp.GetDeniedResponse().GetBody(), "needs client") {
		t.Fatalf("strict without identity: %d %s", httpStatus(resp), resp.GetDeniedResponse().GetBody())
	}
}

// The check subcommand talks to a running sidecar like Envoy would.
func TestCheckCommand(t *testing.T) {
	parallel(t)
	s := startSidecar(t, seedPolicy)
	run := func(args ...string) (string, int) {
		out, err := exec.Command(binary, append([]string{"check", "-addr", s.GRPC}, args...)...).CombinedOutput()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		return string(out), code
	}
	out, code := run("-H", "x-api-key: key-ada", "POST", "/orders")
	if code != 0 || !strings.Contains(out, "ALLOWED") || !strings.Contains(out, `ratelimit: "orders";r=99;t=1`) ||
		!strings.Contains(out, "x-client-id: ada") {
		t.Fatalf("exit %d:\n%s", code, out)
	}
	out, code = run("-H", "x-api-key: wrong", "GET", "/")
	if code != 1 || !strings.Contains(out, "DENIED 401 Unauthorized") || !strings.Contains(out, "www-authenticate: ApiKey") {
		t.Fatalf("exit %d:\n%s", code, out)
	}
	out, code = run("GET")
	if code != 2 || !strings.Contains(out, "need METHOD and PATH") {
		t.Fatalf("exit %d:\n%s", code, out)
	}
}
