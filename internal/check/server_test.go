package check

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/extauthz/extauthz/internal/config"
	"github.com/extauthz/extauthz/internal/engine"
	"github.com/extauthz/extauthz/internal/engine/enginetest"
	"github.com/extauthz/extauthz/internal/quota"
	"github.com/extauthz/extauthz/internal/quota/local"
)

var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// fixture is a Server on a frozen clock with a local cache.
type fixture struct {
	t       *testing.T
	srv     *Server
	running *engine.Running
	cache   *local.Table
	m       *engine.Metrics
	now     time.Time
}

func newFixture(t *testing.T, yaml string) *fixture {
	t.Helper()
	e := enginetest.New(t, enginetest.Parse(t, yaml))
	f := &fixture{t: t, now: t0, m: e.Metrics(), cache: e.Counts, running: e.Running}
	f.srv = NewServer(e.Running, WithClock(func() time.Time { return f.now }))
	return f
}

func (f *fixture) check(spec RequestSpec) *authv3.CheckResponse {
	f.t.Helper()
	if spec.Method == "" {
		spec.Method = "GET"
	}
	if spec.Path == "" {
		spec.Path = "/"
	}
	resp, err := f.srv.Check(context.Background(), NewRequest(spec))
	if err != nil {
		f.t.Fatalf("Check: %v", err)
	}
	return resp
}

func headerMap(hs []*corev3.HeaderValueOption) map[string]string {
	m := map[string]string{}
	for _, h := range hs {
		m[h.GetHeader().GetKey()] = h.GetHeader().GetValue()
	}
	return m
}

func allowed(r *authv3.CheckResponse) bool { return codes.Code(r.GetStatus().GetCode()) == codes.OK }

func httpStatus(r *authv3.CheckResponse) int {
	return int(r.GetDeniedResponse().GetStatus().GetCode())
}

const ordersYAML = `
clients:
  keys:
    - {id: ada, key: key-ada, plan: pro}
    - {id: bob, key: key-bob}
plans:
  pro: {limit: 5, window: 1m}
  default: {limit: 2, window: 1m}
policies:
  - name: orders
    match: {path_prefix: /orders, methods: [POST]}
    key: [client]
    limit: 3
    window: 1m
`

func TestAllowAndDenyResponses(t *testing.T) {
	f := newFixture(t, ordersYAML)
	req := RequestSpec{Method: "POST", Path: "/orders/1?x=1", Headers: map[string]string{"x-api-key": "key-ada"}}
	r := f.check(req)
	if !allowed(r) {
		t.Fatalf("first request denied: %v", r)
	}
	ok := r.GetOkResponse()
	if got := headerMap(ok.GetResponseHeadersToAdd()); got["ratelimit-policy"] != `"orders";q=3;w=60` || got["ratelimit"] != `"orders";r=2;t=20` {
		t.Fatalf("allow headers = %v", got)
	}
	if got := headerMap(ok.GetHeaders()); got[ClientIDHeader] != "ada" {
		t.Fatalf("upstream headers = %v", got)
	}
	if got := ok.GetHeadersToRemove(); len(got) != 1 || got[0] != "x-api-key" {
		t.Fatalf("headers_to_remove = %v", got)
	}
	md := r.GetDynamicMetadata().AsMap()
	if md["client"] != "ada" || md["policy"] != "orders" || md["remaining"] != 2.0 {
		t.Fatalf("dynamic metadata = %v", md)
	}

	f.check(req)
	f.check(req)
	f.now = t0.Add(5 * time.Second)
	r = f.check(req)
	if allowed(r) || httpStatus(r) != 429 || codes.Code(r.GetStatus().GetCode()) != codes.ResourceExhausted {
		t.Fatalf("fourth request: %v", r)
	}
	// Next token at 20s; now is 5s: wait 15s.
	h := headerMap(r.GetDeniedResponse().GetHeaders())
	want := map[string]string{
		"retry-after":      "15",
		"ratelimit-policy": `"orders";q=3;w=60`,
		"ratelimit":        `"orders";r=0;t=15`,
		"content-type":     "application/problem+json",
	}
	for k, v := range want {
		if h[k] != v {
			t.Fatalf("deny header %s = %q, want %q (all: %v)", k, h[k], v, h)
		}
	}
	wantBody := `{"type":"https://iana.org/assignments/http-problem-types#quota-exceeded","title":"Too Many Requests","status":429,"detail":"Retry after 15 s.","violated-policies":["orders"]}`
	if body := r.GetDeniedResponse().GetBody(); body != wantBody {
		t.Fatalf("body = %s\nwant   %s", body, wantBody)
	}

	// Another client has its own bucket; a GET does not match the policy.
	if r := f.check(RequestSpec{Method: "POST", Path: "/orders", Headers: map[string]string{"x-api-key": "key-bob"}}); !allowed(r) {
		t.Fatalf("bob denied: %v", r)
	}
	if r := f.check(RequestSpec{Method: "GET", Path: "/orders", Headers: map[string]string{"x-api-key": "key-ada"}}); !allowed(r) || len(r.GetOkResponse().GetResponseHeadersToAdd()) != 0 {
		t.Fatalf("GET should match no policy: %v", r)
	}
	if got := testutil.ToFloat64(f.m.Decisions.WithLabelValues("orders", "local", "denied")); got != 1 {
		t.Fatalf("denied decisions = %v, want 1", got)
	}
}

func TestRetryAfterRoundsUpToAtLeastOne(t *testing.T) {
	f := newFixture(t, "policies:\n  - {name: fast, limit: 100, window: 1s}\n")
	for i := 0; i < 100; i++ {
		f.check(RequestSpec{})
	}
	r := f.check(RequestSpec{})
	if h := headerMap(r.GetDeniedResponse().GetHeaders()); h["retry-after"] != "1" || h["ratelimit"] != `"fast";r=0;t=1` {
		t.Fatalf("10ms wait should round up to 1s: %v", h)
	}
}

func TestUnknownKeyIs401AndCreatesNoState(t *testing.T) {
	f := newFixture(t, ordersYAML)
	for _, h := range []map[string]string{
		{"x-api-key": "nope"},
		{"authorization": "Bearer nope"},
	} {
		r := f.check(RequestSpec{Method: "POST", Path: "/orders", Headers: h})
		if httpStatus(r) != 401 || codes.Code(r.GetStatus().GetCode()) != codes.Unauthenticated {
			t.Fatalf("%v: %v", h, r)
		}
		dh := headerMap(r.GetDeniedResponse().GetHeaders())
		if dh["www-authenticate"] != "ApiKey" || dh["content-type"] != "application/problem+json" {
			t.Fatalf("401 headers = %v", dh)
		}
		var p map[string]any
		if err := json.Unmarshal([]byte(r.GetDeniedResponse().GetBody()), &p); err != nil || p["status"] != 401.0 {
			t.Fatalf("401 body = %s (%v)", r.GetDeniedResponse().GetBody(), err)
		}
	}
	if n := f.cache.Len(); n != 0 {
		t.Fatalf("unknown keys created %d cache entries", n)
	}
	// A bearer credential is accepted like the header, and stripped.
	r := f.check(RequestSpec{Method: "POST", Path: "/orders", Headers: map[string]string{"authorization": "Bearer key-bob"}})
	if !allowed(r) || r.GetOkResponse().GetHeadersToRemove()[0] != "authorization" {
		t.Fatalf("bearer: %v", r)
	}
}

func TestDeniedRequestConsumesNothingFromOthers(t *testing.T) {
	f := newFixture(t, `
policies:
  - {name: wide, limit: 10, window: 1m}
  - {name: narrow, limit: 1, window: 1m}
`)
	if r := f.check(RequestSpec{}); !allowed(r) {
		t.Fatal("first denied")
	}
	for i := 0; i < 5; i++ {
		r := f.check(RequestSpec{})
		if allowed(r) {
			t.Fatal("narrow should deny")
		}
		var p engine.Problem
		json.Unmarshal([]byte(r.GetDeniedResponse().GetBody()), &p)
		if len(p.ViolatedPolicies) != 1 || p.ViolatedPolicies[0] != "narrow" {
			t.Fatalf("violated = %v", p.ViolatedPolicies)
		}
	}
	// wide has given 1 unit, not 6: 9 remain.
	d, _ := local.New(f.cache).Take(context.Background(), "wide", quota.Limit{Limit: 10, Window: time.Minute}, 1, f.now)
	if d.Remaining != 8 {
		t.Fatalf("wide remaining after its 2nd unit = %d, want 8", d.Remaining)
	}
	if got := testutil.ToFloat64(f.m.Decisions.WithLabelValues("wide", "local", "refunded")); got != 5 {
		t.Fatalf("refunds = %v, want 5", got)
	}
}

// The first enforcing denial ends the decision: the policies after it are
// not asked (nothing is taken or created in them), and the 429 describes
// the policy that denied.
func TestFirstDenialEndsTheDecision(t *testing.T) {
	f := newFixture(t, `
policies:
  - {name: second, limit: 1, window: 1s}
  - {name: minute, limit: 1, window: 1m}
`)
	f.check(RequestSpec{})
	r := f.check(RequestSpec{})
	h := headerMap(r.GetDeniedResponse().GetHeaders())
	if h["retry-after"] != "1" || h["ratelimit-policy"] != `"second";q=1;w=1` || h["ratelimit"] != `"second";r=0;t=1` {
		t.Fatalf("headers = %v", h)
	}
	if !strings.Contains(r.GetDeniedResponse().GetBody(), `"violated-policies":["second"]`) {
		t.Fatalf("body = %s", r.GetDeniedResponse().GetBody())
	}
	decisions := func(policy, result string) float64 {
		return testutil.ToFloat64(f.m.Decisions.WithLabelValues(policy, "local", result))
	}
	if decisions("minute", "allowed") != 1 || decisions("minute", "denied") != 0 || decisions("minute", "refunded") != 0 {
		t.Fatal("the policy after the denial was asked")
	}
	// A second on: second admits, minute denies and second is refunded.
	f.now = f.now.Add(time.Second)
	r = f.check(RequestSpec{})
	h = headerMap(r.GetDeniedResponse().GetHeaders())
	if h["retry-after"] != "59" || !strings.Contains(r.GetDeniedResponse().GetBody(), `"violated-policies":["minute"]`) || decisions("second", "refunded") != 1 {
		t.Fatalf("headers = %v, body %s, refunds %v", h, r.GetDeniedResponse().GetBody(), decisions("second", "refunded"))
	}
}

func TestShadowNeverDeniesButCounts(t *testing.T) {
	f := newFixture(t, "policies:\n  - {name: trial, limit: 1, window: 1m, shadow: true}\n")
	for i := 0; i < 3; i++ {
		r := f.check(RequestSpec{})
		if !allowed(r) || len(r.GetOkResponse().GetResponseHeadersToAdd()) != 0 {
			t.Fatalf("shadow request %d: %v", i, r)
		}
	}
	if got := testutil.ToFloat64(f.m.Decisions.WithLabelValues("trial", "local", "shadow_denied")); got != 2 {
		t.Fatalf("shadow_denied = %v, want 2", got)
	}
}

func TestPlans(t *testing.T) {
	f := newFixture(t, `
clients:
  keys:
    - {id: ada, key: key-ada, plan: pro}
    - {id: bob, key: key-bob}
plans:
  pro: {limit: 5, window: 1m}
  default: {limit: 2, window: 1m}
policies:
  - {name: api, key: [client], limit: plan}
`)
	count := func(h map[string]string) (n int) {
		for i := 0; i < 10; i++ {
			if allowed(f.check(RequestSpec{Headers: h})) {
				n++
			}
		}
		return n
	}
	if n := count(map[string]string{"x-api-key": "key-ada"}); n != 5 {
		t.Fatalf("pro plan admitted %d, want 5", n)
	}
	if n := count(map[string]string{"x-api-key": "key-bob"}); n != 2 {
		t.Fatalf("client without plan admitted %d, want plans.default's 2", n)
	}
	if n := count(nil); n != 2 {
		t.Fatalf("anonymous admitted %d, want 2", n)
	}
	r := f.check(RequestSpec{Headers: map[string]string{"x-api-key": "key-ada"}})
	if h := headerMap(r.GetDeniedResponse().GetHeaders()); h["ratelimit-policy"] != `"api";q=5;w=60` {
		t.Fatalf("plan policy header = %v", h)
	}
}

func TestMissingKeyRejectAndAnonymous(t *testing.T) {
	f := newFixture(t, `
clients:
  keys: [{id: ada, key: key-ada}]
policies:
  - {name: strict, match: {path_prefix: /admin}, key: [client], limit: 5, window: 1m, on_missing_key: reject}
  - {name: shared, match: {path_prefix: /pub}, key: [client], limit: 2, window: 1m}
`)
	r := f.check(RequestSpec{Path: "/admin"})
	if httpStatus(r) != 401 || !strings.Contains(r.GetDeniedResponse().GetBody(), "Policy strict needs client") {
		t.Fatalf("reject: %v", r)
	}
	// Anonymous callers share one bucket, whatever their address.
	n := 0
	for i := 0; i < 5; i++ {
		if allowed(f.check(RequestSpec{Path: "/pub", Source: "10.0.0." + string(rune('1'+i))})) {
			n++
		}
	}
	if n != 2 {
		t.Fatalf("anonymous admitted %d, want 2", n)
	}
	if !allowed(f.check(RequestSpec{Path: "/pub", Headers: map[string]string{"x-api-key": "key-ada"}})) {
		t.Fatal("ada has her own bucket")
	}
}

func TestForgedClientIDIsRemoved(t *testing.T) {
	f := newFixture(t, ordersYAML)
	// Sent or not (the proxy may forward headers the sidecar never sees),
	// an unverified request has x-client-id removed.
	for _, h := range []map[string]string{{ClientIDHeader: "admin"}, nil} {
		r := f.check(RequestSpec{Headers: h})
		if got := r.GetOkResponse().GetHeadersToRemove(); len(got) != 1 || got[0] != ClientIDHeader {
			t.Fatalf("headers %v: headers_to_remove = %v", h, got)
		}
	}
}

func TestMatchConditions(t *testing.T) {
	f := newFixture(t, `
policies:
  - name: p
    match: {path_prefix: /v1/, methods: [GET, PUT], hosts: [api.example.com, "*.example.org"], context: {route: orders}}
    limit: 1
    window: 1m
`)
	base := RequestSpec{Method: "GET", Path: "/v1/x", Host: "API.example.com:8443", Context: map[string]string{"route": "orders", "other": "x"}}
	matches := func(s RequestSpec) bool {
		return len(f.check(s).GetOkResponse().GetResponseHeadersToAdd()) > 0 || httpStatus(f.check(s)) == 429
	}
	if !matches(base) {
		t.Fatal("base request should match")
	}
	for name, mut := range map[string]func(*RequestSpec){
		"path":    func(s *RequestSpec) { s.Path = "/v2/x" },
		"method":  func(s *RequestSpec) { s.Method = "POST" },
		"host":    func(s *RequestSpec) { s.Host = "example.com" },
		"context": func(s *RequestSpec) { s.Context = map[string]string{"route": "users"} },
		"no ctx":  func(s *RequestSpec) { s.Context = nil },
	} {
		s := base
		mut(&s)
		if r := f.check(s); !allowed(r) || len(r.GetOkResponse().GetResponseHeadersToAdd()) != 0 {
			t.Errorf("%s: should not match: %v", name, r)
		}
	}
	s := base
	s.Host = "eu.example.org"
	if r := f.check(s); len(r.GetOkResponse().GetResponseHeadersToAdd()) == 0 && httpStatus(r) != 429 {
		t.Errorf("wildcard host should match: %v", r)
	}
}

func TestKeySources(t *testing.T) {
	f := newFixture(t, `
ip_trusted_hops: 1
policies:
  - {name: byip, match: {path_prefix: /ip}, key: [ip], limit: 1, window: 1m}
  - {name: byheader, match: {path_prefix: /hdr}, key: ["header:X-Tenant"], limit: 1, window: 1m}
  - {name: byclaim, match: {path_prefix: /claim}, key: ["claim:sub"], limit: 1, window: 1m}
  - {name: byprincipal, match: {path_prefix: /mtls}, key: [principal], limit: 1, window: 1m}
  - {name: bypath, match: {path_prefix: /path}, key: [path, ip], limit: 1, window: 1m}
`)
	twice := func(req *authv3.CheckRequest) (first, second bool) {
		r1, _ := f.srv.Check(context.Background(), req)
		r2, _ := f.srv.Check(context.Background(), req)
		return allowed(r1), allowed(r2)
	}
	distinct := func(name string, a, b *authv3.CheckRequest) {
		t.Helper()
		if x, y := twice(a); !x || y {
			t.Fatalf("%s: first request: %v %v, want allowed then denied", name, x, y)
		}
		if x, _ := twice(b); !x {
			t.Fatalf("%s: second identity should have its own bucket", name)
		}
	}
	// ip: the rightmost x-forwarded-for entry with one trusted hop.
	distinct("ip",
		NewRequest(RequestSpec{Method: "GET", Path: "/ip", Headers: map[string]string{"x-forwarded-for": "9.9.9.9, 1.1.1.1"}}),
		NewRequest(RequestSpec{Method: "GET", Path: "/ip", Headers: map[string]string{"x-forwarded-for": "9.9.9.9, 2.2.2.2"}}))
	distinct("header",
		NewRequest(RequestSpec{Method: "GET", Path: "/hdr", Headers: map[string]string{"x-tenant": "a"}}),
		NewRequest(RequestSpec{Method: "GET", Path: "/hdr", Headers: map[string]string{"x-tenant": "b"}}))
	distinct("claim", withClaim("/claim", "alice"), withClaim("/claim", "bob"))
	distinct("principal", withPrincipal("/mtls", "spiffe://cluster.local/ns/a/sa/x"), withPrincipal("/mtls", "spiffe://cluster.local/ns/b/sa/y"))
	distinct("path+ip",
		NewRequest(RequestSpec{Method: "GET", Path: "/path/a", Headers: map[string]string{"x-forwarded-for": "3.3.3.3"}}),
		NewRequest(RequestSpec{Method: "GET", Path: "/path/b", Headers: map[string]string{"x-forwarded-for": "3.3.3.3"}}))
}

func withClaim(path, sub string) *authv3.CheckRequest {
	req := NewRequest(RequestSpec{Method: "GET", Path: path})
	payload, _ := structpb.NewStruct(map[string]any{"jwt_payload": map[string]any{"sub": sub, "iss": "https://issuer"}})
	req.Attributes.MetadataContext = &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{JWTAuthnNamespace: payload}}
	return req
}

func withPrincipal(path, p string) *authv3.CheckRequest {
	req := NewRequest(RequestSpec{Method: "GET", Path: path})
	req.Attributes.Source.Principal = p
	return req
}

func TestHostileKeyValues(t *testing.T) {
	f := newFixture(t, "policies:\n  - {name: t, key: [\"header:x-tenant\"], limit: 1, window: 1m}\n")
	// A value shaped like another key's components must not share its bucket.
	f.check(RequestSpec{Headers: map[string]string{"x-tenant": "a:header:x-tenant:b"}})
	if !allowed(f.check(RequestSpec{Headers: map[string]string{"x-tenant": "a"}})) {
		t.Fatal("escaped value collided with another key")
	}
	big := strings.Repeat("x", 64<<10)
	if !allowed(f.check(RequestSpec{Headers: map[string]string{"x-tenant": big}})) {
		t.Fatal("64 KiB key value should get its own bucket")
	}
	if allowed(f.check(RequestSpec{Headers: map[string]string{"x-tenant": big}})) {
		t.Fatal("64 KiB key value should be counted")
	}
	// One bucket for each of the three values (TestPartitionKeyBound in
	// internal/engine checks how the keys are escaped and bounded).
	if n := f.cache.Len(); n != 3 {
		t.Fatalf("%d buckets for three distinct values", n)
	}
}

func TestEmptyAndMalformedRequests(t *testing.T) {
	f := newFixture(t, ordersYAML+`
  - {name: all, limit: 100, window: 1m}
  - {name: byip-reject, match: {path_prefix: /strict}, key: [ip], limit: 5, window: 1m, on_missing_key: reject}
`)
	for name, req := range map[string]*authv3.CheckRequest{
		"nil attributes": {},
		"empty http":     {Attributes: &authv3.AttributeContext{Request: &authv3.AttributeContext_Request{Http: &authv3.AttributeContext_HttpRequest{}}}},
		"empty source":   {Attributes: &authv3.AttributeContext{Source: &authv3.AttributeContext_Peer{}}},
	} {
		resp, err := f.srv.Check(context.Background(), req)
		if err != nil || !allowed(resp) {
			t.Fatalf("%s: %v %v, want an allow by the anonymous policy", name, resp, err)
		}
	}
	// header_map instead of headers (encode_raw_headers), with a repeated header.
	req := &authv3.CheckRequest{Attributes: &authv3.AttributeContext{Request: &authv3.AttributeContext_Request{Http: &authv3.AttributeContext_HttpRequest{
		HeaderMap: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{
			{Key: ":path", RawValue: []byte("/strict")},
			{Key: "X-Api-Key", RawValue: []byte("key-ada")},
		}},
	}}}}
	resp, err := f.srv.Check(context.Background(), req)
	if err != nil || httpStatus(resp) != 401 {
		t.Fatalf("header_map request without a peer on a reject policy: %v %v, want 401", resp, err)
	}
}

func TestLegacyHeaders(t *testing.T) {
	f := newFixture(t, "headers: {legacy: true}\npolicies:\n  - {name: p, limit: 2, window: 10s}\n")
	h := headerMap(f.check(RequestSpec{}).GetOkResponse().GetResponseHeadersToAdd())
	if h["x-ratelimit-limit"] != "2" || h["x-ratelimit-remaining"] != "1" || h["x-ratelimit-reset"] != "5" {
		t.Fatalf("legacy headers = %v", h)
	}
}

func TestUpdateKeepsCounts(t *testing.T) {
	f := newFixture(t, "policies:\n  - {name: p, limit: 2, window: 1m}\n")
	f.check(RequestSpec{})
	f.check(RequestSpec{})
	cfg, _ := config.Parse([]byte("policies:\n  - {name: p, limit: 3, window: 1m}\n"), "new")
	if err := f.running.Update(cfg); err != nil {
		t.Fatal(err)
	}
	if r := f.check(RequestSpec{}); !allowed(r) {
		t.Fatal("raised limit should admit one more")
	}
	if r := f.check(RequestSpec{}); allowed(r) {
		t.Fatal("counts should carry over the reload")
	}
}

// BenchmarkCheckLocal measures one in-process Check in local mode: identity
// by API key, one matching policy, a token bucket far from its limit.
func BenchmarkCheckLocal(b *testing.B) {
	benchmarkCheckLocal(b, "")
}

// BenchmarkCheckLocalAuthFailures is BenchmarkCheckLocal with
// clients.auth_failures set, as in the examples: a known key also peeks
// at its address's failure count.
func BenchmarkCheckLocalAuthFailures(b *testing.B) {
	benchmarkCheckLocal(b, "  auth_failures: {limit: 10, window: 1m}\n")
}

func benchmarkCheckLocal(b *testing.B, clients string) {
	cfg, err := config.Parse([]byte(`
clients:
  keys: [{id: ada, key: key-ada}]
`+clients+`policies:
  - {name: orders, match: {path_prefix: /orders}, key: [client], limit: 1000000000, window: 1s}
`), "bench")
	if err != nil {
		b.Fatal(err)
	}
	srv := NewServer(enginetest.New(b, cfg).Running)
	req := NewRequest(RequestSpec{Method: "POST", Path: "/orders", Headers: map[string]string{"x-api-key": "key-ada"}})
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if r, err := srv.Check(ctx, req); err != nil || r.GetStatus().GetCode() != 0 || r.GetOkResponse() == nil {
			b.Fatalf("want an allow (status OK with an OkResponse): %v, %v", r, err)
		}
	}
}

// clients.auth_failures in process: unknown keys spend an address's
// failures and then get 429, the right key too; a failure comes back
// every window/limit; a known key creates no state.
func TestAuthFailures(t *testing.T) {
	f := newFixture(t, `
clients:
  keys: [{id: ada, key: key-ada}]
  auth_failures: {limit: 2, window: 1m}
policies:
  - {name: p, limit: 100, window: 1m}
`)
	key := func(k string) *authv3.CheckResponse {
		return f.check(RequestSpec{Source: "10.0.0.1", Headers: map[string]string{"x-api-key": k}})
	}
	status := func(r *authv3.CheckResponse) int32 { return int32(r.GetDeniedResponse().GetStatus().GetCode()) }
	if r := key("key-ada"); !allowed(r) || f.cache.Len() != 1 {
		t.Fatalf("ada: %v; %d cache entries (want only the policy's)", r, f.cache.Len())
	}
	for i, want := range []int32{401, 401, 429} {
		if got := status(key("wrong")); got != want {
			t.Fatalf("unknown key %d: %d, want %d", i+1, got, want)
		}
	}
	r := key("key-ada")
	h := headerMap(r.GetDeniedResponse().GetHeaders())
	if status(r) != 429 || h["retry-after"] != "30" || h["ratelimit-policy"] != `"_auth_failures";q=2;w=60` {
		t.Fatalf("the right key after two failures: %d %v", status(r), h)
	}
	f.now = f.now.Add(30 * time.Second) // one failure restored
	if r := key("key-ada"); !allowed(r) {
		t.Fatalf("ada, a failure later: %v", r)
	}
	if got := status(key("wrong")); got != 401 {
		t.Fatalf("a restored failure: %d, want 401", got)
	}
}

// A cost in Envoy dynamic metadata (set by an earlier filter, forwarded by
// ext_authz's metadata_context_namespaces) reaches the decision, and the
// 429 of a request costing more than the burst says why.
func TestCostFromEnvoyMetadata(t *testing.T) {
	f := newFixture(t, "policies:\n  - {name: p, limit: 10, window: 1m, cost: {metadata: {namespace: envoy.filters.http.lua, key: cost}}}\n")
	withCost := func(cost float64) *authv3.CheckRequest {
		req := NewRequest(RequestSpec{Method: "GET", Path: "/"})
		md, _ := structpb.NewStruct(map[string]any{"cost": cost})
		req.Attributes.MetadataContext = &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{"envoy.filters.http.lua": md}}
		return req
	}
	resp, err := f.srv.Check(context.Background(), withCost(4))
	if err != nil || !allowed(resp) || headerMap(resp.GetOkResponse().GetResponseHeadersToAdd())["ratelimit"] != `"p";r=6;t=24` {
		t.Fatalf("cost 4: %v %v", resp, err)
	}
	resp, err = f.srv.Check(context.Background(), withCost(11))
	if err != nil || httpStatus(resp) != 429 || !strings.Contains(resp.GetDeniedResponse().GetBody(), "costs 11 units; policy p admits at most 10 at once") {
		t.Fatalf("cost 11: %v %v", resp, err)
	}
}
