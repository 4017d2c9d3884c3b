package tests

import (
	"slices"
	"strings"
	"testing"
)

// A request carries one API key, in clients.header or as a bearer token,
// or the same key in both. Two keys that differ, or a second one that is
// unknown, are a 401 through Check and through the HTTP door's /envoy path:
// otherwise the first would be checked and the second passed to the
// upstream unchecked, since only the first was listed for removal. When
// the same key comes twice, both headers are removed.
func TestSecondCredentialIsChecked(t *testing.T) {
	parallel(t)
	s := startSidecar(t, listenHTTP+`
clients:
  keys: [{id: ada, key: key-ada}, {id: bob, key: key-bob}]
policies:
  - {name: all, key: [client], limit: 1000, window: 1m}
`)
	c := httpClient(nil)
	for _, tc := range []struct {
		name    string
		headers [][2]string
		status  int
		removed []string // with status 200: the credential headers removed
	}{
		{"another client's key as bearer", [][2]string{{"x-api-key", "key-ada"}, {"authorization", "Bearer key-bob"}}, 401, nil},
		{"an unknown bearer", [][2]string{{"x-api-key", "key-ada"}, {"authorization", "Bearer not-a-key"}}, 401, nil},
		{"an unknown x-api-key", [][2]string{{"x-api-key", "not-a-key"}, {"authorization", "Bearer key-ada"}}, 401, nil},
		{"the same key twice", [][2]string{{"x-api-key", "key-ada"}, {"authorization", "bearer  key-ada "}}, 200, []string{"x-api-key", "authorization"}},
		{"a bearer alone", [][2]string{{"authorization", "Bearer key-bob"}}, 200, []string{"authorization"}},
		{"Basic beside a key", [][2]string{{"x-api-key", "key-ada"}, {"authorization", "Basic YWRhOmFkYQ=="}}, 200, []string{"x-api-key"}},
	} {
		r := s.check(envoyRequest{headers: tc.headers}.build())
		if got := httpStatus(r); got != tc.status {
			t.Errorf("Check, %s: %d, want %d", tc.name, got, tc.status)
		}
		if tc.status == 200 {
			removed := r.GetOkResponse().GetHeadersToRemove()
			for _, h := range tc.removed {
				if !slices.Contains(removed, h) {
					t.Errorf("Check, %s: headers_to_remove %v, want %s among them", tc.name, removed, h)
				}
			}
		}
		var hs []string
		for _, h := range tc.headers {
			hs = append(hs, h[0], h[1])
		}
		got := send(t, c, "GET", "http://"+s.HTTP+"/envoy/orders", hs...)
		if got.status != tc.status {
			t.Errorf("/envoy, %s: %d, want %d (%s)", tc.name, got.status, tc.status, got.body)
		}
		if tc.status == 200 {
			removed := strings.Split(got.header.Get("X-Envoy-Auth-Headers-To-Remove"), ",")
			for _, h := range tc.removed {
				if !slices.Contains(removed, h) {
					t.Errorf("/envoy, %s: x-envoy-auth-headers-to-remove %v, want %s among them", tc.name, removed, h)
				}
			}
		}
	}
}
