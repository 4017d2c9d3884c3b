package engine

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/extauthz/extauthz/internal/config"
	"github.com/extauthz/extauthz/internal/quota/local"
)

// A limit read per request: a claim, a header a trusted gateway sets,
// Envoy metadata. Missing or malformed values (0 among them) get the
// default and are counted by reason; values above max get max, counted
// as clamped. The RateLimit-Policy header and the decision advertise the
// limit that applied.
func TestLimitFromRequest(t *testing.T) {
	r := newRig(t, `
policies:
  - {name: c, match: {path_prefix: /c}, key: ["header:x-case"], limit: {claim: rpm, default: 10, max: 1000}, window: 1m}
  - {name: h, match: {path_prefix: /h}, key: ["header:x-case"], limit: {header: X-Tenant-Limit, default: 10, max: 1000}, window: 1m}
  - {name: m, match: {path_prefix: /m}, key: ["header:x-case"], limit: {metadata: {namespace: envoy.filters.http.lua, key: rpm}, default: 10, max: 1000}, window: 1m}
`)
	lua := func(v any) map[string]*structpb.Struct {
		s, _ := structpb.NewStruct(map[string]any{"rpm": v})
		return map[string]*structpb.Struct{"envoy.filters.http.lua": s}
	}
	claims := func(rpm any) *structpb.Struct {
		if rpm == nil {
			return jwt(map[string]any{"sub": "ada"})
		}
		return jwt(map[string]any{"sub": "ada", "rpm": rpm})
	}
	for _, tc := range []struct {
		name   string
		req    Request
		policy string
		limit  int64
		reason string // "" read, missing or malformed (defaulted), clamped
	}{
		{"claim number", Request{Path: "/c", JWT: claims(100)}, "c", 100, ""},
		{"claim string", Request{Path: "/c", JWT: claims("250")}, "c", 250, ""},
		{"claim at max", Request{Path: "/c", JWT: claims(1000)}, "c", 1000, ""},
		{"claim above max", Request{Path: "/c", JWT: claims(5000)}, "c", 1000, "clamped"},
		{"claim far above max", Request{Path: "/c", JWT: claims(float64(1 << 53))}, "c", 1000, "clamped"},
		{"claim zero", Request{Path: "/c", JWT: claims(0)}, "c", 10, "malformed"},
		{"claim negative", Request{Path: "/c", JWT: claims(-5)}, "c", 10, "malformed"},
		{"claim fraction", Request{Path: "/c", JWT: claims(2.5)}, "c", 10, "malformed"},
		{"claim word", Request{Path: "/c", JWT: claims("lots")}, "c", 10, "malformed"},
		{"claim missing", Request{Path: "/c", JWT: claims(nil)}, "c", 10, "missing"},
		{"header", Request{Path: "/h", Headers: headers("x-tenant-limit", "40")}, "h", 40, ""},
		{"header malformed", Request{Path: "/h", Headers: headers("x-tenant-limit", "4e1")}, "h", 10, "malformed"},
		{"header missing", Request{Path: "/h", Headers: headers()}, "h", 10, "missing"},
		{"metadata", Request{Path: "/m", Metadata: lua(70)}, "m", 70, ""},
		{"metadata bool", Request{Path: "/m", Metadata: lua(true)}, "m", 10, "malformed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			count := func() map[string]float64 {
				c := map[string]float64{"clamped": testutil.ToFloat64(r.m.LimitClamped.WithLabelValues(tc.policy))}
				for _, reason := range costProblemNames {
					c[reason] = testutil.ToFloat64(r.m.LimitDefaulted.WithLabelValues(tc.policy, reason))
				}
				return c
			}
			before := count()
			if tc.req.Headers == nil {
				tc.req.Headers = map[string]string{}
			}
			tc.req.Headers["x-case"] = tc.name // each case starts from a full bucket
			v := r.decide(&tc.req)
			tk := take(t, v, tc.policy)
			if v.Outcome != OK || tk.Limit.Limit.Limit != tc.limit || tk.Decision.Limit != tc.limit || tk.Decision.Remaining != tc.limit-1 {
				t.Fatalf("%v, limit %d, decision %+v; want allowed under %d", v.Outcome, tk.Limit.Limit.Limit, tk.Decision, tc.limit)
			}
			if want := policyHeader(tc.policy, tc.limit, time.Minute); tk.Limit.Header != want {
				t.Fatalf("RateLimit-Policy %q, want %q", tk.Limit.Header, want)
			}
			after := count()
			for reason, n := range before {
				if reason == tc.reason {
					n++
				}
				if after[reason] != n {
					t.Fatalf("%s count = %v, want %v", reason, after[reason], n)
				}
			}
		})
	}
}

// Each request is held to its own limit: two tenants keyed by their
// claim:sub share no count, a token bucket's capacity follows the limit,
// and a fixed burst stays the capacity whatever the limit.
func TestLimitFromRequestPerTenant(t *testing.T) {
	r := newRig(t, `
policies:
  - {name: rpm, match: {path_prefix: /r}, key: ["claim:sub"], limit: {claim: rpm, default: 2, max: 50}, window: 1m}
  - {name: burst, match: {path_prefix: /b}, key: ["claim:sub"], limit: {claim: rpm, default: 2, max: 50}, window: 1m, burst: 3}
`)
	req := func(path, sub string, rpm int) *Request {
		return &Request{Path: path, JWT: jwt(map[string]any{"sub": sub, "rpm": rpm})}
	}
	admitted := func(path, sub string, rpm, n int) (ok int) {
		for i := 0; i < n; i++ {
			if r.decide(req(path, sub, rpm)).Outcome == OK {
				ok++
			}
		}
		return ok
	}
	for _, tc := range []struct {
		path, sub string
		rpm, want int
	}{
		{"/r", "ada", 5, 5},
		{"/r", "bob", 20, 20},
		{"/r", "cyd", 90, 50}, // clamped
		{"/b", "ada", 5, 3},   // the burst holds 3, whatever the limit
		{"/b", "bob", 20, 3},
	} {
		if got := admitted(tc.path, tc.sub, tc.rpm, 100); got != tc.want {
			t.Fatalf("%s %s at %d per minute: admitted %d of 100 at once, want %d", tc.path, tc.sub, tc.rpm, got, tc.want)
		}
	}
	// The refill follows the limit: bob, at 20 a minute, gets one more
	// every 3s; ada, at 5, every 12s.
	r.now = r.now.Add(3 * time.Second)
	if got := admitted("/r", "bob", 20, 10); got != 1 {
		t.Fatalf("bob 3s later: %d admitted, want 1", got)
	}
	if got := admitted("/r", "ada", 5, 10); got != 0 {
		t.Fatalf("ada 3s later: %d admitted, want 0", got)
	}
	if got := admitted("/b", "bob", 20, 10); got != 1 {
		t.Fatalf("bob (burst 3) 3s later: %d admitted, want 1", got)
	}
	// The tenant's limit raised mid-window: what was spent still counts.
	if got := admitted("/r", "ada", 8, 10); got != 3 {
		t.Fatalf("ada raised to 8: %d admitted, want the 3 not yet spent", got)
	}
}

// The limits between default and max have no Index (their header is
// rendered per request); the default's and max's are numbered.
func TestLimitFromRequestLimitsNumbered(t *testing.T) {
	r := newRig(t, "policies:\n  - {name: c, limit: {claim: rpm, default: 10, max: 100}, window: 1m}\n")
	p := r.e.Policies()[0]
	ls := p.Limits()
	if len(ls) != 2 || ls[0].Limit.Limit != 10 || ls[1].Limit.Limit != 100 || ls[0].Index < 0 || ls[1].Index < 0 || ls[0].Index == ls[1].Index {
		t.Fatalf("Limits() = %+v", ls)
	}
	v := r.decide(&Request{JWT: jwt(map[string]any{"rpm": 50})})
	if l := v.Takes()[0].Limit; l.Index != -1 || l.Header != `"c";q=50;w=60` {
		t.Fatalf("limit of 50: %+v", l)
	}
	v = r.decide(&Request{JWT: jwt(map[string]any{"rpm": 500})})
	if l := v.Takes()[0].Limit; l.Index != ls[1].Index || l.Header != `"c";q=100;w=60` {
		t.Fatalf("limit of 500, clamped: %+v", l)
	}
	// A header source is among the headers a door must pass.
	h := newRig(t, "policies:\n  - {name: h, limit: {header: X-Limit, default: 10, max: 100}, window: 1m}\n")
	if got := h.e.RequestHeaders(); len(got) != 1 || got[0] != "x-limit" {
		t.Fatalf("RequestHeaders() = %v, want [x-limit]", got)
	}
}

// The counters API reads a key's count under the limit its last request
// had, and under the default for a key it has not seen.
func TestLimitFromRequestCounters(t *testing.T) {
	r := newRig(t, "policies:\n  - {name: c, key: [\"claim:sub\"], limit: {claim: rpm, default: 10, max: 100}, window: 1m}\n")
	for i := 0; i < 3; i++ {
		r.decide(&Request{JWT: jwt(map[string]any{"sub": "ada", "rpm": 50})})
	}
	c, err := r.e.Counter(context.Background(), "c", "claim:sub:ada", "", r.now)
	if err != nil || c.Limit != 50 || c.Inspection.Decision.Limit != 50 || c.Inspection.Decision.Remaining != 47 {
		t.Fatalf("ada's counter: %+v, %v; want 47 of 50 left", c, err)
	}
	c, err = r.e.Counter(context.Background(), "c", "claim:sub:bob", "", r.now)
	if err != nil || c.Limit != 10 || c.Inspection.Decision.Remaining != 10 {
		t.Fatalf("bob's counter: %+v, %v; want the default's 10 left", c, err)
	}
}

// BenchmarkDecideLimitFromClaim is one decision under a limit read from a
// claim: at max (compiled with the policy) and between default and max
// (its RateLimit-Policy rendered per request).
func BenchmarkDecideLimitFromClaim(b *testing.B) {
	cfg, err := config.Parse([]byte("policies:\n  - {name: c, key: [\"claim:sub\"], limit: {claim: rpm, default: 10, max: 1000000000}, window: 1s}\n"), "bench")
	if err != nil {
		b.Fatal(err)
	}
	table, _ := local.NewTable(1000)
	e, err := Compile(cfg, Limiters{config.ModeLocal: local.New(table)}, NewMetrics(nil))
	if err != nil {
		b.Fatal(err)
	}
	for _, rpm := range []int{1000000000, 500000000} {
		b.Run(strconv.Itoa(rpm), func(b *testing.B) {
			r := &Request{JWT: jwt(map[string]any{"sub": "ada", "rpm": rpm})}
			ctx, now := context.Background(), time.Now()
			var v Verdict
			b.ReportAllocs()
			for b.Loop() {
				if err := e.Decide(ctx, r, now, &v); err != nil || v.Outcome != OK {
					b.Fatalf("%v %v", v.Outcome, err)
				}
			}
		})
	}
}
