package httpauth

import (
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
)

// Whatever a proxy (or a client through it) sends, the door answers with
// one of its statuses and header values that are valid on the wire; a
// 200 happens only for a request it could read.
func FuzzServeHTTP(f *testing.F) {
	f.Add("/nginx", "POST", "/orders?x=1", "key-ada", "10.0.0.1, 10.0.0.2")
	f.Add("/forward-auth", "GET", "//%6frders", "key-eve", "")
	f.Add("/envoy/orders", "POST", "", "", "x")
	f.Add("/envoy", "", "\x00", "key-ada\r\n", "::1")
	fx := newFixture(f, "ip_trusted_hops: 1\n"+ordersYAML+`
  - {name: per-ip, key: [ip, path, header:x-tenant], limit: 5, window: 1m}
`)
	f.Fuzz(func(t *testing.T, path, method, uri, key, xff string) {
		r := &http.Request{Method: "GET", URL: &url.URL{Path: path}, Header: http.Header{}, Host: "h", RemoteAddr: "127.0.0.1:1"}
		r = r.WithContext(t.Context())
		for k, v := range map[string]string{
			"X-Original-Method": method, "X-Original-Uri": uri, "X-Forwarded-Method": method,
			"X-Forwarded-Uri": uri, "X-Forwarded-Host": uri, "X-Api-Key": key, "X-Forwarded-For": xff, "X-Tenant": uri,
		} {
			if v != "" {
				r.Header.Set(k, v)
			}
		}
		if method != "" && path != "/nginx" && path != "/forward-auth" {
			r.Method = method
		}
		w := httptest.NewRecorder()
		fx.srv.ServeHTTP(w, r)
		switch w.Code {
		case 200, 400, 401, 404, 429:
		default:
			t.Fatalf("status %d for %q %q %q", w.Code, path, method, uri)
		}
		for k, vs := range w.Header() {
			for _, v := range vs {
				if strings.ContainsAny(k+v, "\r\n\x00") {
					t.Fatalf("header %q: %q", k, v)
				}
			}
		}
	})
}
