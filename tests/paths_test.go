package tests

import (
	"testing"
)

// A path_prefix policy holds for every spelling of its paths, through
// Check and through the HTTP door's /envoy path, whether or not the Envoy
// in front normalised :path (Istio's default merges no slashes and decodes
// nothing): a doubled slash, a dot segment, an encoded letter or an encoded
// slash cannot send a request past the policy to a looser one.
func TestPathSpellingsShareThePolicy(t *testing.T) {
	parallel(t)
	s := startSidecar(t, listenHTTP+`
policies:
  - {name: orders, match: {path_prefix: /orders}, limit: 1, window: 1h}
  - {name: rest, limit: 1000, window: 1h}
`)
	c := httpClient(nil)
	spellings := []string{"//orders", "/./orders", "/%6Frders", "/x/../orders", "/x/..%2forders", "/%2F/orders/1", "/orders/./../orders?x=1"}
	// The first request spends the policy's one unit; every spelling after
	// it must be denied by the same policy.
	if r := s.check(envoyRequest{path: "/orders"}.build()); httpStatus(r) != 200 {
		t.Fatalf("Check /orders: %d", httpStatus(r))
	}
	for _, p := range spellings {
		if got := httpStatus(s.check(envoyRequest{path: p}.build())); got != 429 {
			t.Errorf("Check %s: %d, want 429 from the orders policy", p, got)
		}
		r := send(t, c, "GET", "http://"+s.HTTP+"/envoy"+p)
		if r.status != 429 {
			t.Errorf("/envoy%s: %d, RateLimit %q; want 429 from the orders policy", p, r.status, r.header.Get("RateLimit"))
		}
	}
	// An encoded %: not a slash, and not the orders policy's.
	if got := httpStatus(s.check(envoyRequest{path: "/x/..%252forders"}.build())); got != 200 {
		t.Errorf("Check /x/..%%252forders: %d, want 200 (the rest policy)", got)
	}
}
