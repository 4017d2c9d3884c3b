package config

import (
	"strings"
	"testing"
)

// rls.limit_headers turns on envoyproxy/ratelimit's three headers, each
// named by default as the anchor names it, and refuses a name that is not
// a header name.
func TestRLSLimitHeaders(t *testing.T) {
	c, err := Parse([]byte("rls: {limit_headers: {reset: X-Reset}, quota_mode: true, shadow_mode: true, dynamic_metadata: true}\n"), "x.yaml")
	if err != nil {
		t.Fatal(err)
	}
	want := LimitHeaders{Limit: "RateLimit-Limit", Remaining: "RateLimit-Remaining", Reset: "X-Reset"}
	if c.RLS.LimitHeaders == nil || *c.RLS.LimitHeaders != want || !c.RLS.QuotaMode || !c.RLS.ShadowMode || !c.RLS.DynamicMetadata {
		t.Fatalf("rls = %+v, want limit headers %+v and the three flags", c.RLS, want)
	}
	if c, _ := Parse([]byte("{}"), "x.yaml"); c.RLS.LimitHeaders != nil {
		t.Fatal("limit headers on without rls.limit_headers")
	}
	_, err = Parse([]byte("rls: {limit_headers: {limit: 'Rate Limit'}}\n"), "x.yaml")
	if err == nil || !strings.Contains(err.Error(), `rls.limit_headers.limit: "Rate Limit" is not a header name`) {
		t.Fatalf("err = %v", err)
	}
}
