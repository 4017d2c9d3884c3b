package tests

import (
	"crypto/sha256"
	"encoding/hex"
	"slices"
	"strings"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
)

// The second round of hostile input (issue 15): each test is one way a
// caller or a configuration bent a limit, run against the real binary.

// A value over 128 bytes is keyed by a digest that no value sent verbatim
// can spell: the digest's text as a header value is a bucket of its own.
func TestLongValueDigestCannotBeSentVerbatim(t *testing.T) {
	s := startSidecar(t, `
policies:
  - {name: tenant, key: ["header:x-tenant"], limit: 1, window: 1h}
`)
	long := strings.Repeat("t", 200)
	tenant := func(v string) int {
		return httpStatus(s.check(envoyRequest{headers: [][2]string{{"x-tenant", v}}}.build()))
	}
	if got := tenant(long); got != 200 {
		t.Fatalf("the long value's first request: %d", got)
	}
	if got := tenant(long); got != 429 {
		t.Fatalf("the long value's second request: %d, want 429 (limit 1)", got)
	}
	// The digest as round one spelled it, and that text behind a '%'.
	sum := sha256.Sum256([]byte(long))
	for _, forged := range []string{"sha256." + hex.EncodeToString(sum[:16]), "%sha256." + hex.EncodeToString(sum[:16])} {
		if got := tenant(forged); got != 200 {
			t.Fatalf("x-tenant %q: %d; it shares the bucket of the 200-byte value", forged, got)
		}
	}
}

// A policy on api.example.com holds for every spelling Envoy routes to the
// same virtual host: upper case, a port, a trailing dot. The request's host
// comes both from the attributes' host field and, when that is empty, from
// :authority.
func TestHostSpellingsShareThePolicy(t *testing.T) {
	s := startSidecar(t, `
policies:
  - {name: api, match: {hosts: [api.example.com]}, limit: 1, window: 1h}
  - {name: org, match: {hosts: ["*.Example.ORG."]}, limit: 1, window: 1h}
`)
	for _, hosts := range [][]string{
		{"api.example.com", "api.example.com.", "API.EXAMPLE.COM.:443", "Api.Example.Com:8443", "api.example.com.."},
		{"a.example.org", "A.EXAMPLE.ORG.", "a.example.org.:443"},
	} {
		if got := httpStatus(s.check(envoyRequest{host: hosts[0]}.build())); got != 200 {
			t.Fatalf("host %q, first request: %d", hosts[0], got)
		}
		for _, h := range hosts[1:] {
			if got := httpStatus(s.check(envoyRequest{host: h}.build())); got != 429 {
				t.Fatalf("host %q after %q spent the limit: %d, want 429", h, hosts[0], got)
			}
			req := envoyRequest{host: h}.build()
			req.Attributes.Request.Http.Host = "" // from :authority alone
			if got := httpStatus(s.check(req)); got != 429 {
				t.Fatalf(":authority %q after %q spent the limit: %d, want 429", h, hosts[0], got)
			}
		}
	}
	if got := httpStatus(s.check(envoyRequest{host: "api.example.net"}.build())); got != 200 {
		t.Fatalf("another host: %d, want 200 (no policy)", got)
	}
}

// x-client-id reaches the upstream only as the sidecar set it: every
// allowed request without a verified client has it removed, whether the
// sidecar saw one or not (Envoy forwards headers ext_authz never sees when
// allowed_headers narrows what it sends).
func TestClientIDAlwaysRemovedWithoutAVerifiedClient(t *testing.T) {
	s := startSidecar(t, ordersFor("limit: 100, window: 1m"))
	removed := func(r *authv3.CheckResponse) []string { return r.GetOkResponse().GetHeadersToRemove() }
	for _, req := range []envoyRequest{
		{},
		{headers: [][2]string{{"x-client-id", "ada"}}},
		{headers: [][2]string{{"authorization", "Basic YWRhOmFkYQ=="}}},
	} {
		r := s.check(req.build())
		if httpStatus(r) != 200 || !slices.Contains(removed(r), "x-client-id") {
			t.Fatalf("anonymous request %v: %d, headers_to_remove %v; want x-client-id removed", req.headers, httpStatus(r), removed(r))
		}
	}
	r := s.check(envoyRequest{headers: [][2]string{{"x-api-key", "key-ada"}, {"x-client-id", "bob"}}}.build())
	set := r.GetOkResponse().GetHeaders()
	if httpStatus(r) != 200 || len(set) != 1 || set[0].GetHeader().GetKey() != "x-client-id" || set[0].GetHeader().GetValue() != "ada" ||
		set[0].GetAppendAction() != corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD || slices.Contains(removed(r), "x-client-id") {
		t.Fatalf("ada's request: %d, headers %v, removed %v; want x-client-id: ada, overwriting", httpStatus(r), set, removed(r))
	}
}
