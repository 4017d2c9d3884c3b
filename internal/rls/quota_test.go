package rls

import (
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

// quotaDomain has a quota-mode descriptor (soft: 2 a minute), a normal
// one (hard: 2 a minute) and a shadow_mode one, as Envoy Gateway's
// translator writes them (quota_mode beside shadow_mode).
const quotaDomain = `domain: gw
descriptors:
  - key: soft
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: hard
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: hard5
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: shadow
    shadow_mode: true
    quota_mode: false
    rate_limit: {unit: minute, requests_per_unit: 2}
`

func quotaFixture(t *testing.T, main string) *fixture {
	t.Helper()
	return newFixture(t, main, writeFile(t, t.TempDir(), "gw.yaml", quotaDomain))
}

// violations reads the answer's quotaModeViolations (nil when absent).
func violations(t *testing.T, resp *rlsv3.RateLimitResponse) []float64 {
	t.Helper()
	md := resp.GetDynamicMetadata()
	if md == nil {
		t.Fatal("no dynamic metadata")
	}
	var out []float64
	for _, v := range md.GetFields()["quotaModeViolations"].GetListValue().GetValues() {
		out = append(out, v.GetNumberValue())
	}
	return out
}

// A quota-mode descriptor over its limit leaves the request allowed, its
// status OK with nothing remaining, and is listed in the dynamic
// metadata, as envoyproxy/ratelimit answers; it keeps counting.
func TestQuotaModeIsSoft(t *testing.T) {
	f := quotaFixture(t, "rls: {dynamic_metadata: true, response_headers: false}")
	for i := 0; i < 2; i++ {
		resp := f.call("gw", desc("soft", "a"))
		if resp.GetOverallCode() != rlsv3.RateLimitResponse_OK || len(violations(t, resp)) != 0 {
			t.Fatalf("call %d within the quota: %v", i+1, resp)
		}
	}
	resp := f.call("gw", desc("soft", "a"))
	st := resp.GetStatuses()[0]
	if resp.GetOverallCode() != rlsv3.RateLimitResponse_OK || st.GetCode() != rlsv3.RateLimitResponse_OK || st.GetLimitRemaining() != 0 ||
		st.GetCurrentLimit() == nil || st.GetDurationUntilReset() != nil {
		t.Fatalf("over a quota-mode limit: want overall OK, status OK with its limit, 0 remaining and no reset (as the anchor); got %v", resp)
	}
	if v := violations(t, resp); len(v) != 1 || v[0] != 0 {
		t.Fatalf("quotaModeViolations = %v, want [0]", v)
	}
	md := resp.GetDynamicMetadata().GetFields()
	if !md["quotaModeEnabled"].GetBoolValue() || md["domain"].GetStringValue() != "gw" ||
		md["descriptors"].GetListValue().GetValues()[0].GetStructValue().GetFields()["entries"].GetListValue().GetValues()[0].GetStringValue() != "soft=a" {
		t.Fatalf("dynamic metadata = %v", resp.GetDynamicMetadata())
	}
	// The overall code is OVER_LIMIT only when a normal descriptor is over:
	// spend the hard one's 2, then a request of both is denied by it alone.
	f.limitOf(2, "gw", desc("hard", "a"))
	resp = f.call("gw", desc("soft", "a"), desc("hard", "a"))
	if resp.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT || resp.GetStatuses()[1].GetCode() != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("a normal descriptor over: want OVER_LIMIT; got %v", resp)
	}
}

// Without dynamic_metadata the answer carries none, as the anchor's
// default (RESPONSE_DYNAMIC_METADATA=false).
func TestQuotaModeNoMetadataByDefault(t *testing.T) {
	f := quotaFixture(t, "")
	for i := 0; i < 3; i++ {
		if resp := f.call("gw", desc("soft", "a")); resp.GetDynamicMetadata() != nil || resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
			t.Fatalf("call %d: %v", i+1, resp)
		}
	}
}

// The global quota mode (QUOTA_MODE) makes every limit a quota: a normal
// descriptor over its limit is allowed, with an OK status and a
// violation; quotaModeEnabled stays the descriptors' own flag.
func TestGlobalQuotaMode(t *testing.T) {
	f := quotaFixture(t, "rls: {quota_mode: true, dynamic_metadata: true}")
	f.unlimitedFor(2, "gw", desc("hard", "a"))
	resp := f.call("gw", desc("hard", "a"))
	if resp.GetOverallCode() != rlsv3.RateLimitResponse_OK || resp.GetStatuses()[0].GetCode() != rlsv3.RateLimitResponse_OK {
		t.Fatalf("global quota mode, over: want OK; got %v", resp)
	}
	if v := violations(t, resp); len(v) != 1 || v[0] != 0 {
		t.Fatalf("quotaModeViolations = %v, want [0]", v)
	}
	if resp.GetDynamicMetadata().GetFields()["quotaModeEnabled"].GetBoolValue() {
		t.Fatal("quotaModeEnabled is the descriptors' own quota_mode; hard has none")
	}
	// A shadow_mode descriptor over is OK and no violation, even so.
	f.unlimitedFor(2, "gw", desc("shadow", "a"))
	if v := violations(t, f.call("gw", desc("shadow", "a"))); len(v) != 0 {
		t.Fatalf("shadow_mode descriptor listed as a quota violation: %v", v)
	}
}

// The global shadow mode (SHADOW_MODE) answers OK overall while the
// over-limit descriptor's status still says OVER_LIMIT, as the anchor's.
func TestGlobalShadowMode(t *testing.T) {
	f := quotaFixture(t, "rls: {shadow_mode: true}")
	f.unlimitedFor(2, "gw", desc("hard", "a"))
	resp := f.call("gw", desc("hard", "a"))
	if resp.GetOverallCode() != rlsv3.RateLimitResponse_OK || resp.GetStatuses()[0].GetCode() != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("global shadow mode, over: want overall OK, status OVER_LIMIT; got %v", resp)
	}
}

// limit_headers adds the anchor's three headers, named as configured,
// for the descriptor with the fewest remaining (the over-limit one once
// denied); the reset is the rest of the minute at dayStart+0: 60.
func TestLimitHeaders(t *testing.T) {
	f := quotaFixture(t, "rls: {response_headers: false, limit_headers: {remaining: X-Left}}")
	f.call("gw", desc("hard", "a"), desc("soft", "b"))
	resp := f.call("gw", desc("hard", "a"))
	want := map[string]string{"RateLimit-Limit": "2", "X-Left": "0", "RateLimit-Reset": "60"}
	if got := headerMap(resp); !equalMaps(got, want) {
		t.Fatalf("headers = %v, want %v", got, want)
	}
	resp = f.call("gw", desc("soft", "b"), desc("hard", "a"))
	if got := headerMap(resp); resp.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT || !equalMaps(got, want) {
		t.Fatalf("denied: headers = %v, want %v", got, want)
	}
	// Of a quota-mode descriptor with none left and a normal one over its
	// limit, the headers describe the one over (5 a minute), not the first
	// with the fewest remaining (soft's 2).
	f.unlimitedFor(2, "gw", desc("soft", "c"))
	f.unlimitedFor(5, "gw", desc("hard5", "z"))
	resp = f.call("gw", desc("soft", "c"), desc("hard5", "z"))
	if got := headerMap(resp)["RateLimit-Limit"]; got != "5" {
		t.Fatalf("RateLimit-Limit = %q, want the over-limit descriptor's 5; answer %v", got, resp)
	}
	// No limit among the descriptors (an unknown key): no headers.
	if got := headerMap(f.call("gw", desc("other", "x"))); len(got) != 0 {
		t.Fatalf("no limit, headers = %v", got)
	}
}

// A domain no file defines is answered with the anchor's dynamic metadata
// too (its domain and descriptors, quotaModeEnabled false), as
// envoyproxy/ratelimit answers every request with RESPONSE_DYNAMIC_METADATA
// on (found side by side: TestRatelimitXDSBesideAnchor).
func TestDynamicMetadataOfAnUnknownDomain(t *testing.T) {
	f := quotaFixture(t, "rls: {dynamic_metadata: true}")
	resp := f.call("elsewhere", desc("hard", "a"))
	md := resp.GetDynamicMetadata().GetFields()
	if resp.GetOverallCode() != rlsv3.RateLimitResponse_OK || md["domain"].GetStringValue() != "elsewhere" || md["quotaModeEnabled"] == nil ||
		md["descriptors"].GetListValue().GetValues()[0].GetStructValue().GetFields()["entries"].GetListValue().GetValues()[0].GetStringValue() != "hard=a" {
		t.Fatalf("an unknown domain with dynamic_metadata: %v", resp)
	}
	if resp := quotaFixture(t, "").call("elsewhere", desc("hard", "a")); resp.GetDynamicMetadata() != nil {
		t.Fatalf("an unknown domain without dynamic_metadata carries some: %v", resp)
	}
}
