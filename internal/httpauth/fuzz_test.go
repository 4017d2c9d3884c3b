package httpauth

import (
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
)

// NormalizePath's output is what policies match: rooted, without a query,
// empty or dot segments, stable when normalised again, and with no
// encoded unreserved character left to spell a prefix another way.
func FuzzNormalizePath(f *testing.F) {
	for _, s := range []string{"", "/", "/orders?x", "//a/./b/../c/", "/%6frders", "/%2e%2E/x", "*", "a/b", "/%", "/%4", "/%%41", "/a#b?c"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		out := NormalizePath(in)
		if !strings.HasPrefix(out, "/") || strings.ContainsAny(out, "?#") || strings.Contains(out, "//") {
			t.Fatalf("NormalizePath(%q) = %q", in, out)
		}
		for _, seg := range strings.Split(out, "/") {
			if seg == "." || seg == ".." {
				t.Fatalf("NormalizePath(%q) = %q keeps a dot segment", in, out)
			}
		}
		if again := NormalizePath(out); again != out {
			t.Fatalf("NormalizePath(%q) = %q, but NormalizePath of that = %q", in, out, again)
		}
		for i := 0; i+2 < len(out); i++ {
			if out[i] == '%' && isHex(out[i+1]) && isHex(out[i+2]) && unreserved(unhex(out[i+1])<<4|unhex(out[i+2])) {
				t.Fatalf("NormalizePath(%q) = %q leaves %s encoded", in, out, out[i:i+3])
			}
		}
	})
}

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
