package check

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"testing"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/extauthz/extauthz/internal/config"
	"github.com/extauthz/extauthz/internal/identity"
	"github.com/extauthz/extauthz/internal/metrics"
	"github.com/extauthz/extauthz/internal/quota"
)

func problemOf(t *testing.T, r *authv3.CheckResponse) map[string]any {
	t.Helper()
	var p map[string]any
	if err := json.Unmarshal([]byte(r.GetDeniedResponse().GetBody()), &p); err != nil {
		t.Fatalf("body %q: %v", r.GetDeniedResponse().GetBody(), err)
	}
	return p
}

// A presented key over identity.MaxKeyLen is a 401 that says why, from the
// header or a bearer token, and reaches no limiter; a key of exactly the
// maximum is looked up like any other.
func TestAPIKeyLengthCap(t *testing.T) {
	long := strings.Repeat("k", identity.MaxKeyLen)
	f := newFixture(t, fmt.Sprintf(`
clients:
  keys: [{id: max, key: %s}]
policies:
  - {name: all, key: [client], limit: 100, window: 1m}
`, long))
	for _, h := range []map[string]string{
		{"x-api-key": long + "k"},
		{"authorization": "Bearer " + long + "k"},
		{"x-api-key": strings.Repeat("k", 64<<10)},
	} {
		r := f.check(RequestSpec{Headers: h})
		if httpStatus(r) != 401 || codes.Code(r.GetStatus().GetCode()) != codes.Unauthenticated {
			t.Fatalf("over-long key: %d %v", httpStatus(r), r.GetStatus())
		}
		if p := problemOf(t, r); p["detail"] != "API key longer than 1024 bytes." || p["status"] != 401.0 {
			t.Fatalf("over-long key: problem %v", p)
		}
	}
	if n := f.cache.Len(); n != 0 {
		t.Fatalf("over-long keys created %d cache entries", n)
	}
	if got := testutil.ToFloat64(f.m.Checks.WithLabelValues(OutcomeUnauthorized)); got != 3 {
		t.Fatalf("unauthorized outcomes = %v, want 3", got)
	}
	if r := f.check(RequestSpec{Headers: map[string]string{"x-api-key": long}}); !allowed(r) {
		t.Fatalf("a key of exactly %d bytes: %v", identity.MaxKeyLen, r)
	}
}

func manyPolicies(n int) string {
	var b strings.Builder
	b.WriteString("policies:\n")
	for i := 0; i < n; i++ {
		fmt.Fprintf(&b, "  - {name: p%d, limit: 10, window: 1m}\n", i)
	}
	b.WriteString("  - {name: elsewhere, match: {path_prefix: /elsewhere}, limit: 10, window: 1m}\n")
	return b.String()
}

// A request matching more than MaxPoliciesPerRequest policies gets a 500
// problem naming the cause, before any quota is taken; the first is logged
// as a warning, once per configuration, and each counts as outcome error.
func TestPoliciesMatchedCap(t *testing.T) {
	cfg, err := config.Parse([]byte(manyPolicies(MaxPoliciesPerRequest+1)), "many.yaml")
	if err != nil {
		t.Fatal(err)
	}
	cache, _ := quota.NewCache(1000)
	var logs bytes.Buffer
	m := metrics.New("test")
	srv, err := New(cfg, Limiters{config.ModeLocal: quota.NewLocal(cache)}, m,
		WithDecisionLog(slog.New(slog.NewTextHandler(&logs, nil)), 0))
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		r, err := srv.Check(context.Background(), NewRequest(RequestSpec{Method: "GET", Path: "/"}))
		if err != nil {
			t.Fatalf("Check: %v", err)
		}
		if httpStatus(r) != 500 || codes.Code(r.GetStatus().GetCode()) != codes.Internal {
			t.Fatalf("status %d %v, want 500", httpStatus(r), r.GetStatus())
		}
		p := problemOf(t, r)
		if p["status"] != 500.0 || !strings.Contains(p["detail"].(string), "more than 32 rate limit policies") {
			t.Fatalf("problem = %v", p)
		}
		if ct := headerMap(r.GetDeniedResponse().GetHeaders())["content-type"]; ct != "application/problem+json" {
			t.Fatalf("content-type %q", ct)
		}
	}
	if n := cache.Len(); n != 0 {
		t.Fatalf("refused requests took quota: %d cache entries", n)
	}
	if got := testutil.ToFloat64(m.Checks.WithLabelValues(OutcomeError)); got != 3 {
		t.Fatalf("error outcomes = %v, want 3", got)
	}
	if n := strings.Count(logs.String(), "too many policies"); n != 1 || !strings.Contains(logs.String(), "level=WARN") || !strings.Contains(logs.String(), "config=many.yaml") {
		t.Fatalf("want one warning naming the config, got:\n%s", logs.String())
	}
	// A reload is a new configuration: its first refusal is logged again.
	if err := srv.Update(cfg); err != nil {
		t.Fatal(err)
	}
	srv.Check(context.Background(), NewRequest(RequestSpec{Method: "GET", Path: "/"}))
	if n := strings.Count(logs.String(), "too many policies"); n != 2 {
		t.Fatalf("want a second warning after the reload, got %d", n)
	}

	// Exactly the maximum is served.
	f := newFixture(t, manyPolicies(MaxPoliciesPerRequest))
	if r := f.check(RequestSpec{}); !allowed(r) {
		t.Fatalf("%d matching policies: %v", MaxPoliciesPerRequest, r)
	}
	if n := f.cache.Len(); n != MaxPoliciesPerRequest {
		t.Fatalf("cache entries = %d, want one per policy", n)
	}
}

// The composite key is bounded whatever the request carries: values up to
// maxKeyValue (128) bytes are escaped (at most tripling them), longer ones
// become a 39-byte digest. The worst case reaches the bound.
//
// The bound for the policy below, worked by hand: its name (64 bytes),
// then per key part ":kind[:name]:" (client 8, ip 4, header:x-a 12,
// header:x-b 12, claim:sub 11, principal 11, path 6, claim:tenant 14: 78)
// and a value of at most 3 × 128 = 384 bytes each (3072): 3214 bytes.
func TestPartitionKeyBound(t *testing.T) {
	f := newFixture(t, `
clients:
  keys: [{id: ada, key: key-ada}]
policies:
  - name: p123456789-123456789-123456789-123456789-123456789-123456789-123
    key: [client, ip, "header:x-a", "header:x-b", "claim:sub", principal, path, "claim:tenant"]
    limit: 10
    window: 1m
`)
	p := f.srv.engine.Load().policies[0]
	const bound = 3214
	worst := strings.Repeat(":", maxKeyValue) // 3 bytes each once escaped
	for _, v := range []string{"", "a", worst, worst + ":", strings.Repeat("\xff", 64<<10), strings.Repeat("x", 4<<20)} {
		a := attrs{
			headers:   map[string]string{"x-a": v, "x-b": v},
			path:      v,
			peer:      "2001:db8::1",
			principal: v,
			jwt: &structpb.Struct{Fields: map[string]*structpb.Value{"p": structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{
				"sub": structpb.NewStringValue(v), "tenant": structpb.NewStringValue(v),
			}})}},
		}
		key, _ := p.partition(&a, &client{ID: "ada"}, 0)
		if len(key) > bound {
			t.Fatalf("value of %d bytes: key of %d bytes exceeds the bound %d", len(v), len(key), bound)
		}
		// The client id (ada, 3 bytes) and the IP (2001%3Adb8%3A%3A1,
		// 17 bytes) are not the request's to choose: 3214 − 381 − 367.
		if v == worst && len(key) != 2466 {
			t.Fatalf("worst case: key of %d bytes; the bound %d is not tight", len(key), bound)
		}
		if len(v) > maxKeyValue && len(key) > len(p.prefix)+8*(len(":claim:tenant:")+len("sha256.")+32) {
			t.Fatalf("value of %d bytes: key of %d bytes; long values should be digests", len(v), len(key))
		}
	}
}

// With a debug logger the server logs one decision in `every`, naming the
// client but never the key; at info level it logs none.
func TestDecisionLogSampling(t *testing.T) {
	cfg, err := config.Parse([]byte("clients: {keys: [{id: ada, key: key-ada-secret}]}\npolicies:\n  - {name: orders, key: [client], limit: 100, window: 1m}\n"), "log.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		level slog.Level
		want  int
	}{{slog.LevelDebug, 3}, {slog.LevelInfo, 0}} {
		cache, _ := quota.NewCache(10)
		var logs bytes.Buffer
		log := slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: tc.level}))
		srv, err := New(cfg, Limiters{config.ModeLocal: quota.NewLocal(cache)}, metrics.New("test"), WithDecisionLog(log, 2))
		if err != nil {
			t.Fatal(err)
		}
		for i := 0; i < 6; i++ {
			req := NewRequest(RequestSpec{Method: "GET", Path: "/", Headers: map[string]string{"x-api-key": "key-ada-secret"}})
			if _, err := srv.Check(context.Background(), req); err != nil {
				t.Fatal(err)
			}
		}
		if got := strings.Count(logs.String(), `"msg":"decision"`); got != tc.want {
			t.Fatalf("level %v: %d decision lines, want %d:\n%s", tc.level, got, tc.want, logs.String())
		}
		if tc.want > 0 && !strings.Contains(logs.String(), `"client":"ada"`) {
			t.Fatalf("decision log names no client:\n%s", logs.String())
		}
		if strings.Contains(logs.String(), "key-ada-secret") {
			t.Fatalf("the API key was logged:\n%s", logs.String())
		}
	}
}
