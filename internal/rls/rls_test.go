package rls

import (
	"context"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc/codes"
	grpcstatus "google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/extauthz/extauthz/internal/config"
	"github.com/extauthz/extauthz/internal/engine"
	"github.com/extauthz/extauthz/internal/engine/enginetest"
	"github.com/extauthz/extauthz/internal/rlsconfig"
)

// dayStart is a UTC midnight: every unit's window starts there.
var dayStart = time.Unix(1_700_006_400, 0)

// fixture is a local-mode rate limit service at a fixed instant.
type fixture struct {
	t   testing.TB
	srv *Server
	m   *engine.Metrics
	own *Metrics
	now time.Time
}

// newFixture serves the descriptor files (or directories) under the main
// configuration main (YAML; "" for the defaults).
func newFixture(t testing.TB, main string, paths ...string) *fixture {
	t.Helper()
	cfg := mainConfig(t, main)
	var err error
	var rc *rlsconfig.Config
	if len(paths) > 0 {
		if rc, err = rlsconfig.Load(paths, rlsconfig.OptionsFor(cfg)); err != nil {
			t.Fatal(err)
		}
	}
	running := enginetest.New(t, cfg).Running
	f := &fixture{t: t, m: running.Metrics(), own: NewMetrics(nil), now: dayStart}
	f.srv, err = New(running, rc, WithClock(func() time.Time { return f.now }), WithMetrics(f.own))
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// mainConfig parses the main configuration ("" for the defaults).
func mainConfig(t testing.TB, main string) *config.Config {
	t.Helper()
	if main == "" {
		main = "{}"
	}
	cfg, err := config.Parse([]byte(main), "extauthz.yaml")
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// example is the README example file of that name.
func example(name string) string { return filepath.Join("testdata", "readme", name+".yaml") }

// desc builds a descriptor of key, value pairs.
func desc(kv ...string) *ratelimitv3.RateLimitDescriptor {
	d := &ratelimitv3.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		d.Entries = append(d.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return d
}

func (f *fixture) call(domain string, ds ...*ratelimitv3.RateLimitDescriptor) *rlsv3.RateLimitResponse {
	f.t.Helper()
	return f.callReq(&rlsv3.RateLimitRequest{Domain: domain, Descriptors: ds})
}

func (f *fixture) callReq(req *rlsv3.RateLimitRequest) *rlsv3.RateLimitResponse {
	f.t.Helper()
	resp, err := f.srv.ShouldRateLimit(context.Background(), req)
	if err != nil {
		f.t.Fatalf("ShouldRateLimit: %v", err)
	}
	if len(resp.GetStatuses()) != len(req.GetDescriptors()) {
		f.t.Fatalf("%d statuses for %d descriptors", len(resp.GetStatuses()), len(req.GetDescriptors()))
	}
	return resp
}

// admitted sends n identical requests and counts those answered OK.
func (f *fixture) admitted(n int, domain string, ds ...*ratelimitv3.RateLimitDescriptor) int {
	f.t.Helper()
	ok := 0
	for i := 0; i < n; i++ {
		if f.call(domain, ds...).GetOverallCode() == rlsv3.RateLimitResponse_OK {
			ok++
		}
	}
	return ok
}

// limitOf asserts that a descriptor admits exactly limit requests at this
// instant (one more is over the limit).
func (f *fixture) limitOf(limit int, domain string, ds ...*ratelimitv3.RateLimitDescriptor) {
	f.t.Helper()
	if got := f.admitted(limit+1, domain, ds...); got != limit {
		f.t.Fatalf("%s %v: admitted %d of %d, want %d", domain, ds, got, limit+1, limit)
	}
}

// unlimitedFor asserts that n requests are all admitted.
func (f *fixture) unlimitedFor(n int, domain string, ds ...*ratelimitv3.RateLimitDescriptor) {
	f.t.Helper()
	if got := f.admitted(n, domain, ds...); got != n {
		f.t.Fatalf("%s %v: admitted %d of %d, want all", domain, ds, got, n)
	}
}

func (f *fixture) decisions(policy, result string) float64 {
	var total float64
	for _, mode := range []string{"local", "redis", "hybrid"} {
		total += testutil.ToFloat64(f.m.Decisions.WithLabelValues(policy, mode, result))
	}
	return total
}

// The examples of envoyproxy/ratelimit's README, each rewritten with names
// of our own, and the outcome its README documents.
func TestREADMEExamples(t *testing.T) {
	t.Run("1 values of one key", func(t *testing.T) {
		f := newFixture(t, "", example("01_values"))
		f.limitOf(500, "catalog", desc("table", "products"))
		f.limitOf(500, "catalog", desc("table", "orders")) // a limit of its own
		f.unlimitedFor(1000, "catalog", desc("table", "customers"))
	})
	t.Run("2 nested descriptors", func(t *testing.T) {
		f := newFixture(t, "", example("02_nested"))
		// 5 promotional messages a day to each number, each number apart.
		f.limitOf(5, "sms", desc("kind", "promo", "phone", "2061111111"))
		f.limitOf(5, "sms", desc("kind", "promo", "phone", "2062222222"))
		// 100 of any message to each number.
		f.limitOf(100, "sms", desc("phone", "2061111111"))
		// Both descriptors in one request: over the limit when either is.
		f2 := newFixture(t, "", example("02_nested"))
		both := []*ratelimitv3.RateLimitDescriptor{desc("kind", "promo", "phone", "2063333333"), desc("phone", "2063333333")}
		f2.limitOf(5, "sms", both...)
		// The denied sixth spent nothing of the number's 100: 95 more.
		f2.limitOf(95, "sms", desc("phone", "2063333333"))
		// A kind that is not promo has no nested descriptor: no limit.
		f2.unlimitedFor(50, "sms", desc("kind", "receipt", "phone", "2064444444"))
	})
	t.Run("3 the most specific match", func(t *testing.T) {
		f := newFixture(t, "", example("03_specific"))
		f.limitOf(10, "gateway", desc("client_ip", "198.51.100.1"))
		f.limitOf(0, "gateway", desc("client_ip", "203.0.113.9"))
	})
	t.Run("4 a limit's depth is the request's", func(t *testing.T) {
		f := newFixture(t, "", example("04a_depth"), example("04b_depth"))
		// Two entries do not match a limit one level deep...
		f.unlimitedFor(400, "depth_flat", desc("app", "shop", "tenant", "t1"))
		f.limitOf(300, "depth_flat", desc("app", "shop"))
		// ...they match one nested two deep.
		f.limitOf(300, "depth_nested", desc("app", "shop", "tenant", "t1"))
		f.unlimitedFor(400, "depth_nested", desc("app", "shop"))
	})
	t.Run("5 unlimited", func(t *testing.T) {
		f := newFixture(t, "", example("05_unlimited"))
		for i := 0; i < 200; i++ {
			st := f.call("backends", desc("directory", "ldap")).GetStatuses()[0]
			if st.GetCode() != rlsv3.RateLimitResponse_OK || st.GetLimitRemaining() != math.MaxUint32 || st.GetCurrentLimit() != nil {
				t.Fatalf("unlimited status %v", st)
			}
		}
		if n := f.decisions("backends.directory", "allowed"); n != 0 {
			t.Fatalf("an unlimited descriptor was counted: %v", n)
		}
		f.limitOf(100, "backends", desc("storage", "s3"))
	})
	t.Run("6 shadow mode", func(t *testing.T) {
		f := newFixture(t, "", example("06_shadow"))
		alice := desc("app", "auth", "account", "alice")
		f.unlimitedFor(30, "soft_launch", alice)
		// Counted: 10 allowed, 20 that would have been denied.
		if a, s := f.decisions("soft_launch.app.account_alice", "allowed"), f.decisions("soft_launch.app.account_alice", "shadow_denied"); a != 10 || s != 20 {
			t.Fatalf("alice: %v allowed, %v shadow denied", a, s)
		}
		f.limitOf(20, "soft_launch", desc("app", "auth", "account", "bob"))
	})
	t.Run("7 replaces", func(t *testing.T) {
		reports := desc("area", "reports", "account", "carol")
		premium := desc("plan", "premium", "account", "carol")
		f := newFixture(t, "", example("07_replaces"))
		f.limitOf(5, "upgrades", reports)
		f = newFixture(t, "", example("07_replaces"))
		f.limitOf(10, "upgrades", premium)
		// Both: the premium limit replaces the reports one, which is
		// neither applied nor spent.
		f = newFixture(t, "", example("07_replaces"))
		f.limitOf(10, "upgrades", reports, premium)
		f.limitOf(5, "upgrades", reports)
		resp := f.call("upgrades", reports, premium)
		if st := resp.GetStatuses()[0]; st.GetCurrentLimit() != nil || st.GetCode() != rlsv3.RateLimitResponse_OK {
			t.Fatalf("the replaced descriptor's status: %v", st)
		}
	})
	t.Run("8 detailed metrics", func(t *testing.T) {
		f := newFixture(t, "", example("08_detailed"))
		f.limitOf(10, "detailed", desc("device", "tablet-7"))
		f.limitOf(10, "detailed", desc("device", "phone-3"))
		f.limitOf(20, "detailed", desc("device", "kiosk"))
		for name, want := range map[string]float64{"detailed.device_tablet-7": 10, "detailed.device_phone-3": 10, "detailed.device_kiosk": 20, "detailed.device": 0} {
			if got := f.decisions(name, "allowed"); got != want {
				t.Errorf("%s: %v allowed decisions, want %v", name, got, want)
			}
		}
	})
	t.Run("9 wildcards", func(t *testing.T) {
		f := newFixture(t, "", example("09_wildcards"))
		f.limitOf(20, "wildcards", desc("sku", "book-1"))
		f.limitOf(20, "wildcards", desc("sku", "book-2")) // each value its own
		f.limitOf(20, "wildcards", desc("sku", "book-"))  // * matches nothing too
		f.unlimitedFor(30, "wildcards", desc("sku", "pen-1"))
		f.limitOf(20, "wildcards", desc("path", "/v1/42/cart"))
		f.unlimitedFor(30, "wildcards", desc("path", "/v1/42/checkout"))
		f.limitOf(20, "wildcards", desc("route", "/v1/shop/items/9/price"))
		f.unlimitedFor(30, "wildcards", desc("route", "/v1/shop/items/9/stock"))
	})
	t.Run("10 value_to_metric", func(t *testing.T) {
		f := newFixture(t, "", example("10_value_to_metric"))
		f.limitOf(60, "vtm", desc("service", "api", "verb", "GET", "caller", "123"))
		f.limitOf(60, "vtm", desc("service", "web", "verb", "POST", "caller", "456"))
		for name, want := range map[string]float64{"vtm.service_api.verb_GET.caller": 60, "vtm.service_web.verb_POST.caller": 60, "vtm.service.verb.caller": 0} {
			if got := f.decisions(name, "allowed"); got != want {
				t.Errorf("%s: %v allowed decisions, want %v", name, got, want)
			}
		}
	})
	t.Run("11 share_threshold", func(t *testing.T) {
		f := newFixture(t, "", example("11_share_threshold"))
		if got := f.admitted(5, "downloads", desc("object", "reports/a.pdf")) + f.admitted(5, "downloads", desc("object", "reports/b.csv")); got != 10 {
			t.Fatalf("shared: admitted %d of 10", got)
		}
		f.limitOf(0, "downloads", desc("object", "reports/c.txt"))
		f.limitOf(10, "downloads", desc("object_own", "reports/a.pdf"))
		f.limitOf(10, "downloads", desc("object_own", "reports/b.csv"))
	})
}

// A request of 5 hits spends 5; a descriptor's own hits_addend wins over
// the request's; 0 on a descriptor asks without spending; 0 (unset) on
// the request means 1.
func TestHitsAddend(t *testing.T) {
	f := newFixture(t, "", example("05_unlimited")) // storage: 100 a minute
	storage := desc("storage", "s3")
	req := func(reqHits uint32, descHits *uint64) *rlsv3.RateLimitRequest {
		d := desc("storage", "s3")
		if descHits != nil {
			d.HitsAddend = wrapU64(*descHits)
		}
		return &rlsv3.RateLimitRequest{Domain: "backends", Descriptors: []*ratelimitv3.RateLimitDescriptor{d}, HitsAddend: reqHits}
	}
	u := func(v uint64) *uint64 { return &v }
	if st := f.callReq(req(5, nil)).GetStatuses()[0]; st.GetLimitRemaining() != 95 {
		t.Fatalf("5 hits: %v", st)
	}
	if st := f.callReq(req(5, u(20))).GetStatuses()[0]; st.GetLimitRemaining() != 75 {
		t.Fatalf("the descriptor's 20 over the request's 5: %v", st)
	}
	if st := f.callReq(req(0, u(0))).GetStatuses()[0]; st.GetLimitRemaining() != 75 || st.GetCode() != rlsv3.RateLimitResponse_OK {
		t.Fatalf("0 hits: %v", st)
	}
	if st := f.callReq(req(0, nil)).GetStatuses()[0]; st.GetLimitRemaining() != 74 {
		t.Fatalf("unset hits: %v", st)
	}
	// More than remains: over the limit, and nothing spent (all or none).
	if resp := f.callReq(req(75, nil)); resp.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("75 of 74: %v", resp)
	}
	f.limitOf(74, "backends", storage)
}

func wrapU64(v uint64) *wrapperspb.UInt64Value { return wrapperspb.UInt64(v) }

// Every field of a descriptor's status: code, the limit that applied with
// its name and unit, what remains, and the time until the window resets;
// an unmatched descriptor is OK with no limit.
func TestStatusFields(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, dir, "status.yaml", `
domain: status
descriptors:
  - key: user
    rate_limit: {name: per-user, unit: minute, requests_per_unit: 3}
  - key: team
    rate_limit: {unit: hour, requests_per_unit: 1000, algorithm: token_bucket}
`)
	f := newFixture(t, "", dir)
	f.now = dayStart.Add(90*time.Minute + 10*time.Second) // 50s before the minute, 29m50s before the hour
	user, team, other := desc("user", "ada"), desc("team", "red"), desc("org", "x")
	resp := f.call("status", user, team, other)
	sts := resp.GetStatuses()
	if resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
		t.Fatalf("overall %v", resp.GetOverallCode())
	}
	want := []struct {
		code      rlsv3.RateLimitResponse_Code
		name      string
		rpu       uint32
		unit      rlsv3.RateLimitResponse_RateLimit_Unit
		remaining uint32
		reset     time.Duration
	}{
		{rlsv3.RateLimitResponse_OK, "per-user", 3, rlsv3.RateLimitResponse_RateLimit_MINUTE, 2, 50 * time.Second},
		// A token bucket is full again one refill interval (3.6s) after
		// one token was spent.
		{rlsv3.RateLimitResponse_OK, "", 1000, rlsv3.RateLimitResponse_RateLimit_HOUR, 999, 3600 * time.Millisecond},
	}
	for i, w := range want {
		st := sts[i]
		cl := st.GetCurrentLimit()
		if st.GetCode() != w.code || cl.GetName() != w.name || cl.GetRequestsPerUnit() != w.rpu || cl.GetUnit() != w.unit ||
			st.GetLimitRemaining() != w.remaining || st.GetDurationUntilReset().AsDuration() != w.reset {
			t.Errorf("status %d = %v, want %+v", i, st, w)
		}
	}
	if st := sts[2]; st.GetCode() != rlsv3.RateLimitResponse_OK || st.GetCurrentLimit() != nil || st.GetLimitRemaining() != 0 || st.GetDurationUntilReset() != nil {
		t.Errorf("unmatched status = %v", st)
	}
	f.call("status", user)
	f.call("status", user)
	resp = f.call("status", user)
	if st := resp.GetStatuses()[0]; resp.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT || st.GetCode() != rlsv3.RateLimitResponse_OVER_LIMIT ||
		st.GetLimitRemaining() != 0 || st.GetCurrentLimit().GetRequestsPerUnit() != 3 || st.GetDurationUntilReset().AsDuration() != 50*time.Second {
		t.Fatalf("over the limit: %v", resp)
	}
}

// Several descriptors, one over its limit: the request is over the limit,
// each status says which, and the others spent nothing. The descriptors
// are asked in order and the first denial ends the request: those before
// it are refunded, those after it are not read or created (their status
// says OK and the limit, nothing more).
func TestOneDeniedSpendsNothing(t *testing.T) {
	f := newFixture(t, "", example("02_nested"))
	promo := desc("kind", "promo", "phone", "1")
	any := desc("phone", "1")
	f.limitOf(5, "sms", any, promo) // 5 of each spent
	for i := 0; i < 10; i++ {
		resp := f.call("sms", any, promo)
		sts := resp.GetStatuses()
		// The other descriptor's status says what remains after its
		// hit was given back.
		if resp.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT || sts[1].GetCode() != rlsv3.RateLimitResponse_OVER_LIMIT ||
			sts[0].GetCode() != rlsv3.RateLimitResponse_OK || sts[0].GetLimitRemaining() != 95 {
			t.Fatalf("%v", resp)
		}
	}
	// Denied first: the number's descriptor is not asked.
	resp := f.call("sms", promo, any)
	if sts := resp.GetStatuses(); resp.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT || sts[0].GetCode() != rlsv3.RateLimitResponse_OVER_LIMIT ||
		sts[1].GetCode() != rlsv3.RateLimitResponse_OK || sts[1].GetLimitRemaining() != 0 || sts[1].GetCurrentLimit().GetRequestsPerUnit() != 100 {
		t.Fatalf("denied first: %v", resp)
	}
	// 100 a day to the number: 5 spent with the promotions, 95 remain.
	f.limitOf(95, "sms", any)
	// Refunded: limitOf's sixth request and the ten above; the request
	// denied first refunded nothing.
	if r := f.decisions("sms.phone", "refunded"); r != 11 {
		t.Fatalf("refunds counted: %v, want 11", r)
	}
}

// A limit Envoy sends with the descriptor applies instead of the
// configured one (even where none is configured), in a fixed window of
// its unit times its multiplier.
func TestLimitOverride(t *testing.T) {
	f := newFixture(t, "", example("01_values"))
	over := func(kv ...string) *ratelimitv3.RateLimitDescriptor {
		d := desc(kv...)
		d.Limit = &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 3, Unit: typev3.RateLimitUnit_MINUTE}
		return d
	}
	f.limitOf(3, "catalog", over("table", "products"))
	f.limitOf(3, "catalog", over("table", "anything"))
	st := f.call("catalog", over("table", "x")).GetStatuses()[0]
	if cl := st.GetCurrentLimit(); cl.GetRequestsPerUnit() != 3 || cl.GetUnit() != rlsv3.RateLimitResponse_RateLimit_MINUTE || st.GetDurationUntilReset().AsDuration() != time.Minute {
		t.Fatalf("override status %v", st)
	}
	if n := f.decisions("catalog.table", "allowed"); n != 7 {
		t.Fatalf("override decisions under catalog.table: %v", n)
	}
	// A multiplier: 2 per 10 minutes.
	d := desc("table", "y")
	d.Limit = &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 2, Unit: typev3.RateLimitUnit_MINUTE, UnitMultiplier: wrapperspb.UInt32(10)}
	f.limitOf(2, "catalog", d)
	if st := f.call("catalog", d).GetStatuses()[0]; st.GetDurationUntilReset().AsDuration() != 10*time.Minute || st.GetCurrentLimit().GetUnitMultiplier().GetValue() != 10 {
		t.Fatalf("multiplied override %v", st)
	}
	// 0 requests per unit blocks.
	d = desc("table", "z")
	d.Limit = &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 0, Unit: typev3.RateLimitUnit_SECOND}
	f.limitOf(0, "catalog", d)
}

// Malformed and oversized requests are refused, naming the fault; a domain
// no file defines limits nothing and is counted.
func TestRequestsRefusedOrUnlimited(t *testing.T) {
	f := newFixture(t, "", example("01_values"))
	many := make([]*ratelimitv3.RateLimitDescriptor, MaxDescriptors+1)
	for i := range many {
		many[i] = desc("table", "products")
	}
	deep := desc()
	for i := 0; i <= maxEntries; i++ {
		deep.Entries = append(deep.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: "k", Value: "v"})
	}
	badUnit := desc("table", "products")
	badUnit.Limit = &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 1}
	long := desc("table", "products")
	long.Limit = &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 1, Unit: typev3.RateLimitUnit_YEAR, UnitMultiplier: wrapperspb.UInt32(2)}
	for _, c := range []struct {
		req  *rlsv3.RateLimitRequest
		want string
	}{
		{&rlsv3.RateLimitRequest{Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("a", "b")}}, "rls: the request names no domain"},
		{&rlsv3.RateLimitRequest{Domain: "catalog"}, "rls: the request carries no descriptor"},
		{&rlsv3.RateLimitRequest{Domain: "catalog", Descriptors: many}, "rls: the request carries 33 descriptors; at most 32 (each is a rate limit decision): fix the route's rate_limits"},
		{&rlsv3.RateLimitRequest{Domain: "catalog", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("a", "b"), deep}}, "rls: descriptors[1] has 17 entries; at most 16 (no configured descriptor nests deeper)"},
		{&rlsv3.RateLimitRequest{Domain: "catalog", Descriptors: []*ratelimitv3.RateLimitDescriptor{badUnit}}, "rls: descriptors[0].limit.unit: UNKNOWN is not a unit"},
		{&rlsv3.RateLimitRequest{Domain: "catalog", Descriptors: []*ratelimitv3.RateLimitDescriptor{long}}, "rls: descriptors[0].limit: 2 × YEAR is longer than 8784h0m0s"},
	} {
		_, err := f.srv.ShouldRateLimit(context.Background(), c.req)
		if s, _ := grpcstatus.FromError(err); s.Code() != codes.InvalidArgument || s.Message() != c.want {
			t.Errorf("%v: got %v, want InvalidArgument %q", c.req, err, c.want)
		}
	}
	f.unlimitedFor(1000, "catalgo", desc("table", "products"))
	if n := testutil.ToFloat64(f.own.UnknownDomains); n != 1000 {
		t.Fatalf("unknown domain requests counted: %v", n)
	}
}

// The answer carries what every door tells a client: on OK the RateLimit
// headers of the most constrained limit, over the limit Retry-After, the
// RateLimit headers of the longest wait and a problem+json body, and the
// X-RateLimit-* set with headers.legacy. response_headers: false sends
// none of them.
func TestResponseHeadersAndBody(t *testing.T) {
	f := newFixture(t, "headers: {legacy: true}\n", example("02_nested"))
	f.now = dayStart.Add(time.Hour) // 24h before the day ends
	promo, any := desc("kind", "promo", "phone", "9"), desc("phone", "9")
	resp := f.call("sms", promo, any)
	h := headerMap(resp)
	want := map[string]string{
		"ratelimit-policy": `"sms.kind_promo.phone";q=5;w=86400`, "ratelimit": `"sms.kind_promo.phone";r=4;t=82800`,
		"x-ratelimit-limit": "5", "x-ratelimit-remaining": "4", "x-ratelimit-reset": "82800",
	}
	if !equalMaps(h, want) || resp.GetRawBody() != nil {
		t.Fatalf("OK headers %v body %q, want %v", h, resp.GetRawBody(), want)
	}
	for i := 0; i < 4; i++ {
		f.call("sms", promo, any)
	}
	resp = f.call("sms", promo, any)
	h = headerMap(resp)
	want = map[string]string{
		"content-type": "application/problem+json", "retry-after": "82800",
		"ratelimit-policy": `"sms.kind_promo.phone";q=5;w=86400`, "ratelimit": `"sms.kind_promo.phone";r=0;t=82800`,
		"x-ratelimit-limit": "5", "x-ratelimit-remaining": "0", "x-ratelimit-reset": "82800",
	}
	if !equalMaps(h, want) {
		t.Fatalf("over-limit headers %v, want %v", h, want)
	}
	body := `{"type":"https://iana.org/assignments/http-problem-types#quota-exceeded","title":"Too Many Requests","status":429,"detail":"Retry after 82800 s.","violated-policies":["sms.kind_promo.phone"]}`
	if string(resp.GetRawBody()) != body {
		t.Fatalf("body %s", resp.GetRawBody())
	}

	f = newFixture(t, "rls: {response_headers: false}\n", example("03_specific"))
	for _, ip := range []string{"203.0.113.9", "198.51.100.1"} {
		if resp := f.call("gateway", desc("client_ip", ip)); resp.GetResponseHeadersToAdd() != nil || resp.GetRawBody() != nil {
			t.Fatalf("%s: headers with response_headers: false: %v", ip, resp)
		}
	}
}

func headerMap(resp *rlsv3.RateLimitResponse) map[string]string {
	m := map[string]string{}
	for _, h := range resp.GetResponseHeadersToAdd() {
		m[h.GetKey()] = h.GetValue()
	}
	return m
}

func equalMaps(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// Partition keys are the domain and the entries, escaped so that no value
// forges another key, bounded whatever a value holds, and distinct from
// every ext_authz policy's (whose names hold no '/').
func TestPartitionKeys(t *testing.T) {
	entries := desc("user", "a:b", "path", "{x}").GetEntries()
	if k := partition("shop", entries, nil); k != "rls/shop:user=a%3Ab:path=%7Bx%7D" {
		t.Fatalf("key %s", k)
	}
	// '=' joins an entry's key to its value: one spelled in a key or a
	// value is escaped, so a=b:c and a:b=c are two keys.
	if k := partition("d", desc("a=b", "c").GetEntries(), nil); k != "rls/d:a%3Db=c" {
		t.Fatalf("key %s", k)
	}
	if k := partition("d", desc("a", "b=c").GetEntries(), nil); k != "rls/d:a=b%3Dc" {
		t.Fatalf("key %s", k)
	}
	// One value cannot forge two entries.
	if partition("d", desc("k", "v:k=w").GetEntries(), nil) == partition("d", desc("k", "v", "k", "w").GetEntries(), nil) {
		t.Fatal("a value forged an entry")
	}
	// Nor a limit's of a descriptor with several (by its window).
	if partition("d", desc("k", "v%w1s").GetEntries(), nil) == partition("d", desc("k", "v").GetEntries(), nil)+suffixOf(time.Second).key {
		t.Fatal("a value forged a limit's key")
	}
	huge := strings.Repeat("x", 1<<20)
	if k := partition("d", desc("k", huge).GetEntries(), nil); len(k) > 64 {
		t.Fatalf("a 1 MiB value made a key of %d bytes", len(k))
	}
}

// Matching, entry by entry: the value first, then wildcards in
// configuration order, then the key alone.
func TestWildcardMatch(t *testing.T) {
	for _, c := range []struct {
		pattern, v string
		want       bool
	}{
		{"a*", "a", true}, {"a*", "abc", true}, {"a*", "ba", false},
		{"*", "", true}, {"*", "anything", true},
		{"a*c", "ac", true}, {"a*c", "abbc", true}, {"a*c", "acb", false},
		{"a*b*c", "abc", true}, {"a*b*c", "a-b-c", true}, {"a*b*c", "ac", false}, {"a*b*c", "acbc", true},
		{"ab*ba", "aba", false}, {"ab*ba", "abba", true},
		{"*x*", "x", true}, {"*x*", "yyy", false},
	} {
		if got := wildcardMatch(strings.Split(c.pattern, "*"), c.v); got != c.want {
			t.Errorf("%q matches %q: %v, want %v", c.pattern, c.v, got, c.want)
		}
	}
	dir := t.TempDir()
	writeFile(t, dir, "order.yaml", `
domain: order
descriptors:
  - key: k
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: k
    value: ab*
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: k
    value: a*
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: k
    value: abc
    rate_limit: {unit: minute, requests_per_unit: 4}
`)
	f := newFixture(t, "", dir)
	f.limitOf(4, "order", desc("k", "abc"))
	f.limitOf(2, "order", desc("k", "abd")) // the first wildcard that matches
	f.limitOf(3, "order", desc("k", "axe"))
	f.limitOf(1, "order", desc("k", "zzz"))
	f.limitOf(1, "order", desc("k", ""))
}

// Values in metric names are bounded: past maxNames made from request
// values, decisions count under the rate limit's own name.
func TestMetricNamesAreBounded(t *testing.T) {
	f := newFixture(t, "", example("08_detailed"))
	for i := 0; i < maxNames+50; i++ {
		f.call("detailed", desc("device", "d"+strconv.Itoa(i)))
	}
	if n := f.decisions("detailed.device", "allowed"); n != 50 {
		t.Fatalf("past the bound: %v decisions under the rate limit's name, want 50", n)
	}
}

// The bounds hold per process: a configuration compiled anew (a reload)
// shares the names made under the one before, for both kinds, the names
// from detailed_metric and those of limits Envoy sends with
// request-chosen keys.
func TestMetricNamesAreBoundedAcrossUpdates(t *testing.T) {
	f := newFixture(t, "", example("08_detailed"))
	cfg := mainConfig(t, "")
	rc, err := rlsconfig.Load([]string{example("08_detailed")}, rlsconfig.OptionsFor(cfg))
	if err != nil {
		t.Fatal(err)
	}
	over := func(key string) *ratelimitv3.RateLimitDescriptor {
		d := desc(key, "v")
		d.Limit = &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 100, Unit: typev3.RateLimitUnit_MINUTE}
		return d
	}
	for update := 0; update < 3; update++ {
		if update > 0 {
			if err := f.srv.Update(cfg, rc); err != nil {
				t.Fatal(err)
			}
		}
		for i := 0; i < maxNames/2+50; i++ {
			n := strconv.Itoa(update*(maxNames/2+50) + i)
			f.call("detailed", desc("device", "d"+n))
			f.call("detailed", over("k"+n))
		}
	}
	made := 3 * (maxNames/2 + 50)
	if n := f.decisions("detailed.device", "allowed"); n != float64(made-maxNames) {
		t.Fatalf("detailed_metric past the process's bound: %v decisions under the rate limit's name, want %d", n, made-maxNames)
	}
	if n := f.decisions("detailed", "allowed"); n != float64(made-maxNames) {
		t.Fatalf("limits sent past the process's bound: %v decisions under the domain's name, want %d", n, made-maxNames)
	}
}

// A reload keeps the counts of descriptors whose limits did not move, and
// applies the new limits at once.
func TestUpdateKeepsCounts(t *testing.T) {
	dir := t.TempDir()
	path := writeFile(t, dir, "r.yaml", "domain: r\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 3}\n")
	f := newFixture(t, "", dir)
	f.admitted(2, "r", desc("k", "v"))
	writeFile(t, dir, "r.yaml", "domain: r\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 5}\n")
	cfg := mainConfig(t, "")
	rc, err := rlsconfig.Load([]string{path}, rlsconfig.OptionsFor(cfg))
	if err != nil {
		t.Fatal(err)
	}
	if err := f.srv.Update(cfg, rc); err != nil {
		t.Fatal(err)
	}
	f.limitOf(3, "r", desc("k", "v"))
}

// A leaky bucket holds an admitted request until its slot, through the
// same hold as a Check.
func TestLeakyBucketHolds(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, dir, "paced.yaml", "domain: paced\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 100, algorithm: leaky_bucket, max_delay: 15ms}\n")
	cfg := mainConfig(t, "")
	rc, err := rlsconfig.Load([]string{dir}, rlsconfig.OptionsFor(cfg))
	if err != nil {
		t.Fatal(err)
	}
	var held []time.Duration
	srv, err := New(enginetest.New(t, cfg).Running, rc,
		WithClock(func() time.Time { return dayStart }),
		WithHold(func(_ context.Context, d time.Duration) error { held = append(held, d); return nil }))
	if err != nil {
		t.Fatal(err)
	}
	var codes []rlsv3.RateLimitResponse_Code
	for i := 0; i < 3; i++ {
		resp, err := srv.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "paced", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("k", "v")}})
		if err != nil {
			t.Fatal(err)
		}
		codes = append(codes, resp.GetOverallCode())
	}
	// A slot every 10ms: the first at once, the second held 10ms; the
	// third would wait 20ms, past max_delay.
	if len(held) != 1 || held[0] != 10*time.Millisecond || codes[2] != rlsv3.RateLimitResponse_OVER_LIMIT || codes[1] != rlsv3.RateLimitResponse_OK {
		t.Fatalf("held %v, codes %v", held, codes)
	}
}

func writeFile(t *testing.T, dir, name, content string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// BenchmarkShouldRateLimitLocal measures one in-process call in local
// mode: one descriptor of two entries, a token bucket far from its limit,
// the RateLimit headers rendered.
func BenchmarkShouldRateLimitLocal(b *testing.B) {
	dir := b.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "bench.yaml"), []byte(`
domain: bench
descriptors:
  - key: route
    value: orders
    descriptors:
      - key: user
        rate_limit: {unit: second, requests_per_unit: 1000000000, algorithm: token_bucket}
`), 0o600); err != nil {
		b.Fatal(err)
	}
	cfg, _ := config.Parse([]byte("{}"), "bench.yaml")
	rc, err := rlsconfig.Load([]string{dir}, rlsconfig.OptionsFor(cfg))
	if err != nil {
		b.Fatal(err)
	}
	srv, err := New(enginetest.New(b, cfg).Running, rc)
	if err != nil {
		b.Fatal(err)
	}
	req := &rlsv3.RateLimitRequest{Domain: "bench", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("route", "orders", "user", "ada")}}
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if r, _ := srv.ShouldRateLimit(ctx, req); r.GetOverallCode() != rlsv3.RateLimitResponse_OK {
			b.Fatal("over the limit")
		}
	}
}

// severalLimits is a burst and a daily limit on one key, a limit that
// replaces the burst, and a 30-second window.
const severalLimits = `
domain: api
descriptors:
  - key: user
    rate_limits:
      - {name: burst, unit: second, requests_per_unit: 3}
      - {name: daily, unit: day, requests_per_unit: 5}
  - key: vip
    rate_limit: {unit: hour, requests_per_unit: 100, replaces: [{name: burst}]}
  - key: half
    rate_limit: {unit: second, unit_multiplier: 30, requests_per_unit: 2}
`

// A descriptor's limits must all allow, each counted apart and taken all
// or none; its status gives the limit that denied, or the one closest to
// denying (fewest remaining), as the RateLimit headers do.
func TestSeveralLimitsOnOneDescriptor(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, dir, "api.yaml", severalLimits)
	f := newFixture(t, "", dir)
	f.now = dayStart.Add(time.Hour + 100*time.Millisecond)
	ada := desc("user", "ada")
	status := func(resp *rlsv3.RateLimitResponse, code rlsv3.RateLimitResponse_Code, name string, remaining uint32) {
		t.Helper()
		st := resp.GetStatuses()[0]
		if resp.GetOverallCode() != code || st.GetCode() != code || st.GetCurrentLimit().GetName() != name || st.GetLimitRemaining() != remaining {
			t.Fatalf("status %v; want %v, limit %s, %d remaining", resp, code, name, remaining)
		}
	}
	resp := f.call("api", ada)
	status(resp, rlsv3.RateLimitResponse_OK, "burst", 2) // the daily has 4 left
	if h := headerMap(resp); h["ratelimit-policy"] != `"api.user/1s";q=3;w=1` || h["ratelimit"] != `"api.user/1s";r=2;t=1` {
		t.Fatalf("headers %v", h)
	}
	f.call("api", ada)
	f.call("api", ada)
	resp = f.call("api", ada)
	status(resp, rlsv3.RateLimitResponse_OVER_LIMIT, "burst", 0)
	if st := resp.GetStatuses()[0]; st.GetDurationUntilReset().AsDuration() != 900*time.Millisecond || st.GetCurrentLimit().GetUnit() != rlsv3.RateLimitResponse_RateLimit_SECOND {
		t.Fatalf("burst denial %v", st)
	}
	// The burst's next window: the daily counted 3 (the denied request
	// counted nothing), so 2 more, then the daily denies and the burst's
	// hit is given back.
	f.now = f.now.Add(time.Second)
	status(f.call("api", ada), rlsv3.RateLimitResponse_OK, "daily", 1)
	status(f.call("api", ada), rlsv3.RateLimitResponse_OK, "daily", 0)
	resp = f.call("api", ada)
	status(resp, rlsv3.RateLimitResponse_OVER_LIMIT, "daily", 0)
	if h := headerMap(resp); h["retry-after"] != "82799" || h["ratelimit-policy"] != `"api.user/1d";q=5;w=86400` {
		t.Fatalf("daily denial headers %v", h)
	}
	f.now = f.now.Add(time.Second)
	status(f.call("api", ada), rlsv3.RateLimitResponse_OVER_LIMIT, "daily", 0)
	for _, c := range []struct {
		policy, result string
		want           float64
	}{
		{"api.user/1s", "allowed", 7}, {"api.user/1s", "denied", 1}, {"api.user/1s", "refunded", 2},
		{"api.user/1d", "allowed", 5}, {"api.user/1d", "denied", 2},
	} {
		if got := f.decisions(c.policy, c.result); got != c.want {
			t.Errorf("%s %s: %v, want %v", c.policy, c.result, got, c.want)
		}
	}
	// Another user counts apart.
	status(f.call("api", desc("user", "bob")), rlsv3.RateLimitResponse_OK, "burst", 2)

	// A limit that applies replaces the burst only: the daily still counts.
	vip := desc("vip", "1")
	if got := f.admitted(7, "api", desc("user", "cyd"), vip); got != 5 {
		t.Fatalf("cyd as vip: %d of 7 admitted in one second, want the daily 5", got)
	}

	// A 30-second window (unit_multiplier), aligned to the epoch.
	f.now = dayStart.Add(time.Hour + 10*time.Second)
	half := desc("half", "x")
	f.limitOf(2, "api", half)
	resp = f.call("api", half)
	st := resp.GetStatuses()[0]
	if cl := st.GetCurrentLimit(); cl.GetUnit() != rlsv3.RateLimitResponse_RateLimit_SECOND || cl.GetUnitMultiplier().GetValue() != 30 ||
		st.GetDurationUntilReset().AsDuration() != 20*time.Second || headerMap(resp)["ratelimit-policy"] != `"api.half";q=2;w=30` {
		t.Fatalf("30s window: %v", resp)
	}
	f.now = f.now.Add(20 * time.Second)
	f.limitOf(2, "api", half)
}

// The X-RateLimit-* headers (headers.legacy) describe, as the RateLimit
// headers do, the limit closest to denying among a descriptor's several.
func TestSeveralLimitsLegacyHeaders(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, dir, "api.yaml", severalLimits)
	f := newFixture(t, "headers: {legacy: true}\n", dir)
	f.now = dayStart.Add(time.Hour)
	ada := desc("user", "ada")
	h := headerMap(f.call("api", ada))
	if h["x-ratelimit-limit"] != "3" || h["x-ratelimit-remaining"] != "2" || h["x-ratelimit-reset"] != "1" {
		t.Fatalf("the burst's headers: %v", h)
	}
	f.call("api", ada)
	f.now = f.now.Add(time.Second)
	f.call("api", ada)
	h = headerMap(f.call("api", ada)) // the burst has 1 left, the daily 1: the daily resets later
	if h["x-ratelimit-limit"] != "5" || h["x-ratelimit-remaining"] != "1" || h["x-ratelimit-reset"] != "82799" || h["ratelimit-policy"] != `"api.user/1d";q=5;w=86400` {
		t.Fatalf("the daily's headers: %v", h)
	}
}

// A descriptor's own charge: always is a limit that charges: a stream-done
// descriptor charging more than remains is counted whole (into debt) and
// answered OK, and a question (hits 0) after it is over the limit.
func TestDescriptorChargeAlways(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, dir, "llm.yaml", `domain: llm
descriptors:
  - key: tenant
    rate_limit: {unit: day, requests_per_unit: 1000, algorithm: token_bucket, charge: always}
`)
	f := newFixture(t, "", dir)
	acme := func(hits uint64) *rlsv3.RateLimitRequest {
		d := desc("tenant", "acme")
		d.HitsAddend = wrapU64(hits)
		return &rlsv3.RateLimitRequest{Domain: "llm", Descriptors: []*ratelimitv3.RateLimitDescriptor{d}}
	}
	if resp := f.callReq(acme(0)); resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
		t.Fatalf("a question with the budget whole: %v", resp)
	}
	if resp := f.callReq(acme(1200)); resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
		t.Fatalf("a charge of 1200 against 1000: %v, want OK (a charge is never refused)", resp)
	}
	if resp := f.callReq(acme(0)); resp.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("a question 200 in debt: %v, want OVER_LIMIT", resp)
	}
}

// A caller that gives up while held is answered with its context's
// status (check.DecisionError, as a Check is), not INTERNAL.
func TestHeldRequestCanceledEndsWithItsStatus(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, dir, "paced.yaml", "domain: paced\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 100, algorithm: leaky_bucket, max_delay: 15ms}\n")
	cfg := mainConfig(t, "")
	rc, err := rlsconfig.Load([]string{dir}, rlsconfig.OptionsFor(cfg))
	if err != nil {
		t.Fatal(err)
	}
	srv, err := New(enginetest.New(t, cfg).Running, rc,
		WithClock(func() time.Time { return dayStart }),
		WithHold(func(context.Context, time.Duration) error { return context.Canceled }))
	if err != nil {
		t.Fatal(err)
	}
	req := &rlsv3.RateLimitRequest{Domain: "paced", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("k", "v")}}
	if _, err := srv.ShouldRateLimit(context.Background(), req); err != nil {
		t.Fatal(err) // the first slot is at once: no hold
	}
	if _, err := srv.ShouldRateLimit(context.Background(), req); grpcstatus.Code(err) != codes.Canceled {
		t.Fatalf("a held request whose caller went away: %v, want CANCELED", err)
	}
}
