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

	"github.com/extauthz/extauthz/internal/config"
	"github.com/extauthz/extauthz/internal/engine"
	"github.com/extauthz/extauthz/internal/engine/enginetest"
	"github.com/extauthz/extauthz/internal/identity"
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
	if got := testutil.ToFloat64(f.m.Checks.WithLabelValues(Door, engine.Unauthorized.String())); got != 3 {
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

// A request matching more than engine.MaxPoliciesPerRequest policies gets a 500
// problem naming the cause, before any quota is taken; the first is logged
// as a warning, once per configuration, and each counts as outcome error.
func TestPoliciesMatchedCap(t *testing.T) {
	cfg, err := config.Parse([]byte(manyPolicies(engine.MaxPoliciesPerRequest+1)), "many.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	e := enginetest.New(t, cfg, engine.WithWarnings(log))
	cache, m := e.Counts, e.Metrics()
	srv := NewServer(e.Running, WithDecisionLog(log, 0))
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
	if got := testutil.ToFloat64(m.Checks.WithLabelValues(Door, engine.Failed.String())); got != 3 {
		t.Fatalf("error outcomes = %v, want 3", got)
	}
	if n := strings.Count(logs.String(), "too many policies"); n != 1 || !strings.Contains(logs.String(), "level=WARN") || !strings.Contains(logs.String(), "config=many.yaml") {
		t.Fatalf("want one warning naming the config, got:\n%s", logs.String())
	}
	// A reload is a new configuration: its first refusal is logged again.
	if err := e.Running.Update(cfg); err != nil {
		t.Fatal(err)
	}
	srv.Check(context.Background(), NewRequest(RequestSpec{Method: "GET", Path: "/"}))
	if n := strings.Count(logs.String(), "too many policies"); n != 2 {
		t.Fatalf("want a second warning after the reload, got %d", n)
	}

	// Exactly the maximum is served.
	f := newFixture(t, manyPolicies(engine.MaxPoliciesPerRequest))
	if r := f.check(RequestSpec{}); !allowed(r) {
		t.Fatalf("%d matching policies: %v", engine.MaxPoliciesPerRequest, r)
	}
	if n := f.cache.Len(); n != engine.MaxPoliciesPerRequest {
		t.Fatalf("cache entries = %d, want one per policy", n)
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
		var logs bytes.Buffer
		log := slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: tc.level}))
		srv := NewServer(enginetest.New(t, cfg).Running, WithDecisionLog(log, 2))
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
